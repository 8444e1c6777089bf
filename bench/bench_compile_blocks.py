"""``parallel.compile = true`` on the GPU path, checked on CPU: graph breaks and recompiles of the
per-block torch.compile (training/parallel.py ``layer.compile()``) with only the device call
injected (``training.model._on_accelerator`` answers True, so attention runs torch's varlen
flash-attention custom op ``torch_attn::_varlen_attn`` through its registered fake kernel).

The Qwen2.5-1.5B block shapes (4 layers) under ``FakeTensorMode`` in bf16, the job's own
``loss_inputs`` / ``loss_from_inputs`` (packed attention, chunked loss head), and micro batches
of different document layouts; a counting dynamo backend records every graph. Reported, never
asserted. Run: ``.venv/bin/python bench/bench_compile_blocks.py`` (~15 s).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = ([700, 420, 310, 618], [2048], [1000, 1048], [500, 500, 500, 548])
"""Document lengths of the micro batches (seq 2048): the bench's chat block, one document, others."""


def main() -> None:
    import torch
    from torch._dynamo.utils import counters
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM, Qwen2Config

    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS
    from training import model as modeling
    from training.model import decoder_layers, loss_from_inputs, loss_inputs, use_chunked_loss_head

    modeling._on_accelerator = lambda tensor: True  # the GPU branch: varlen flash attention
    config = Qwen2Config(**{**MODEL_CONFIGS["Qwen2.5-1.5B"], "num_hidden_layers": 4})
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    def batch(lengths):
        ids = torch.randint(0, 1000, (1, sum(lengths)))
        return {"input_ids": ids, "labels": ids.clone(),
                "position_ids": torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)}

    prepared = [loss_inputs(None, batch(lengths), packed=True) for lengths in LAYOUTS]  # host work
    began, per_batch = time.perf_counter(), []
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.config.use_cache = False
        modeling.use_packed_attention(model)
        use_chunked_loss_head(model)
        for layer in decoder_layers(model):
            layer.compile(backend=backend)
        for inputs in prepared:
            loss_from_inputs(model, *inputs).backward()
            per_batch.append(len(graphs))
    print(json.dumps({"name": "compile_blocks", "layers": config.num_hidden_layers, "layouts": LAYOUTS,
                      "graphs_after_each_micro_batch": per_batch, "graph_nodes": graphs,
                      "graph_breaks": sum(sum(v.values()) for v in counters["graph_break"].values()),
                      "seconds": round(time.perf_counter() - began, 1)}))


if __name__ == "__main__":
    main()
