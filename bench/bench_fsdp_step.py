"""2-process FSDP2 (gloo, CPU) step vs a plain single-process step: same tiny Qwen2, same global batch.

What it shows: the cost of sharding + collectives on one 2-core machine, where the two ranks
share the same cores (so this is an overhead figure, not a speed-up). Prints ONE JSON object on
its last line. Run: ``.venv/bin/python bench/bench_fsdp_step.py``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CONFIG = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, pad_token_id=2047, bos_token_id=2047,
              eos_token_id=2047, tie_word_embeddings=True)
SEQ, GLOBAL_BATCH, WARMUP, STEPS = 256, 8, 3, 10


def _model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(**CONFIG), dtype=torch.float32)


def _batch(rows: int, offset: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (GLOBAL_BATCH, SEQ), generator=gen)[offset:offset + rows]
    return {"input_ids": ids, "labels": ids.clone()}


def _time_steps(model, batch, world: int) -> list[float]:
    from training.model import count_targets, loss_sum

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    targets = count_targets(batch["labels"]) * world
    times = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        (loss_sum(model, batch) * (world / targets)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def _fsdp_worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{store}")
    from training.parallel import build_mesh, parallelize

    model = _model()
    parallelize(model, build_mesh("full_shard", 2, on_gpu=False), strategy="full_shard", on_gpu=False)
    times = _time_steps(model, _batch(GLOBAL_BATCH // 2, rank * GLOBAL_BATCH // 2), world=2)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> None:
    # One thread per process on both sides: on a shared 2-core machine more threads only add
    # contention noise, and the 2 ranks together then use what the plain process could.
    torch.set_num_threads(1)
    plain = _time_steps(_model(), _batch(GLOBAL_BATCH), world=1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fsdp.json")
        mp.spawn(_fsdp_worker, args=(os.path.join(tmp, "store"), out), nprocs=2, join=True)
        fsdp = json.loads(Path(out).read_text())
    plain_ms, fsdp_ms = 1000 * statistics.median(plain), 1000 * statistics.median(fsdp)
    tokens = GLOBAL_BATCH * SEQ
    print(json.dumps({
        "name": "fsdp_step", "device": "cpu", "cpus": os.cpu_count(), "threads_per_process": 1,
        "load_average_1m": round(os.getloadavg()[0], 1), "model_params": sum(p.numel() for p in _model().parameters()),
        "global_batch": GLOBAL_BATCH, "seq_len": SEQ, "steps_measured": STEPS,
        "plain_step_ms": round(plain_ms, 1), "fsdp_2proc_step_ms": round(fsdp_ms, 1),
        "fsdp_over_plain": round(fsdp_ms / plain_ms, 3),
        "plain_tokens_per_s": round(tokens / (plain_ms / 1000)), "fsdp_tokens_per_s": round(tokens / (fsdp_ms / 1000)),
    }))


if __name__ == "__main__":
    main()
