"""bench/bench_full_size_plan.py measures what the preflight publishes: a shipped job's own plan
(``--jobs``), and a peak memory that counting the FLOPs does not change.

The FLOPs are counted with torch's ``FlopCounterMode`` (torch 2.13 torch/utils/flop_counter.py),
whose ``__torch_dispatch__`` mode keeps the tensors a checkpointed layer recomputes in backward
alive until the mode exits; counted inside the tracked micro batches, they inflated every
checkpointed peak (the 7B LoRA job: 17.27 GiB of tensors per L4 instead of 8.70; on this test's
model, with the FLOPs counted in the tracked step: 248 MB instead of 147).
The bench now counts them on a micro batch of its own before the tracked step. Run in a subprocess: the fake
process group is process-wide."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

SCRIPT = """
import json, sys
from unittest import mock
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import torch.distributed as dist
import torch.utils.flop_counter
from torch.testing._internal.distributed.fake_pg import FakeStore
import bench_full_size_plan as plan
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS, Cluster

# Activations must be what the peak is made of: deep and narrow, a small vocabulary (the bench's
# ids folded into it), else the optimizer step or the logits set the peak and hide them.
MODEL_CONFIGS["tiny"] = dict(hidden_size=256, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=1024, max_position_embeddings=4096,
                             tie_word_embeddings=False)
packed = plan.packed_chat_batch
def folded(*args, **kwargs):
    batch = packed(*args, **kwargs)
    labels = batch["labels"]
    return {{**batch, "input_ids": batch["input_ids"] % 1024, "labels": labels.where(labels < 0, labels % 1024)}}
plan.packed_chat_batch = folded


class NoCount:  # what the peak is without any FLOP counting
    def __init__(self, *args, **kwargs): pass
    def __enter__(self): return self
    def __exit__(self, *exc): return False
    def get_total_flops(self): return 0


dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
out = {{}}
for name, lora in (("full", None), ("lora", {{"rank": 8, "alpha": 16, "dropout": 0.0}})):
    kwargs = dict(code="after", activation_checkpointing=True, strategy="hybrid_shard", cluster=Cluster(), lora=lora)
    counted = plan.measure("tiny", **kwargs)
    with mock.patch.object(torch.utils.flop_counter, "FlopCounterMode", NoCount):
        uncounted = plan.measure("tiny", **kwargs)
    out[name] = {{"counted": counted["peak_bytes"], "uncounted": uncounted["peak_bytes"],
                  "flops": counted["executed_flops_per_micro_batch"]}}
print(json.dumps(out))
"""


def test_counting_the_flops_leaves_the_checkpointed_peak_as_it_is():
    code = SCRIPT.format(root=str(ROOT), bench=str(ROOT / "bench"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    for name, m in measured.items():
        assert m["flops"] > 0, name
        assert m["counted"] == m["uncounted"], (name, m)


def test_a_shipped_job_is_measured_by_the_keys_the_preflight_looks_it_up_by():
    """``--jobs``: the model from the job's folder name, the plan from raytrain_eks.planning.measured_plan
    ``job_plan`` (the LoRA options as ``lora_key``: alpha only scales); and each shipped job's
    published row is found by those keys."""
    from bench_full_size_plan import SEQ_LEN, job_variant

    from raytrain_eks.planning.measured_plan import load, lookup, lora_key

    name, variant = job_variant(str(ROOT / "jobs" / "family" / "lora-qwen2.5-14b.toml"))
    assert name == "Qwen2.5-14B"
    assert variant == {"code": "after", "strategy": "hybrid_shard", "activation_checkpointing": True,
                       "reduce_dtype": "float32", "keep_gathered": False, "cpu_offload": False, "micro_batch_size": 1,
                       "lora": lora_key({"rank": 16, "alpha": 32, "dropout": 0.05}), "accumulation": "sharded",
                       "checkpoint_every": 1}
    for job in [ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml", *sorted((ROOT / "jobs" / "family").glob("*.toml"))]:
        name, variant = job_variant(str(job))
        keys = {k: v for k, v in variant.items() if k != "code"}
        assert lookup(load(), model=name, seq_len=SEQ_LEN, **keys), job.name


def test_a_job_the_bench_cannot_measure_is_refused_in_one_line(tmp_path):
    from bench_full_size_plan import job_variant

    job = tmp_path / "mine.toml"
    job.write_text((ROOT / "jobs" / "family" / "lora-qwen2.5-7b.toml").read_text()
                   .replace("Qwen2.5-7B-Instruct", "my-model"))
    with pytest.raises(SystemExit, match=r"mine.toml: model.path .*my-model.*: no published shapes \(known: Qwen2.5"):
        job_variant(str(job))
