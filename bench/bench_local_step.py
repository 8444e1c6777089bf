"""The shipped local job's training step (`make demo`, the tests' shared run) on 2 gloo ranks, with
the loss as the loop computes it and with every cross-entropy chunk checkpointed (the previous plan).

The job's own model, batch shapes and strategy come from ``jobs/local.toml``; each rank runs
``training.loop.forward_backward`` (packed attention, ``logits_to_keep``, the chunked summed
cross-entropy, accumulation over the job's micro batches) and AdamW, one thread per rank, as Ray
runs the two local workers. "every chunk checkpointed" swaps in the loss that recomputed every
chunk in backward, including the last one (``_every_chunk_checkpointed`` below); the local job's
micro batch is ONE chunk, so that plan recomputed the whole loss for no memory.

Run: ``.venv/bin/python bench/bench_local_step.py`` (about a minute on an idle 2-core machine).
Prints ONE JSON object on its last line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WARMUP, STEPS, WORLD = 2, 6, 2


def _every_chunk_checkpointed(logits: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    from training import model

    return torch.stack([checkpoint(model._chunk_loss, logits[lo:lo + chunk], targets[lo:lo + chunk], use_reentrant=False)
                        for lo in range(0, logits.shape[0], chunk)]).sum()


def _worker(rank: int, store: str, plan: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{store}")
    from training import model as model_module
    from training.config import load_job_config
    from training.parallel import build_mesh, parallelize
    from training.loop import forward_backward

    if plan == "every_chunk_checkpointed":
        model_module.chunked_cross_entropy_sum = lambda logits, targets, chunk=model_module.CE_CHUNK_TOKENS: \
            _every_chunk_checkpointed(logits, targets, chunk)
    job = load_job_config(ROOT / "jobs" / "local.toml")
    t = job.train
    torch.manual_seed(0)
    model = model_module.build_model(job.model, seq_len=t.seq_len, on_gpu=False)
    parallelize(model, build_mesh(job.parallel.strategy, WORLD, on_gpu=False), strategy=job.parallel.strategy,
                on_gpu=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr)
    gen = torch.Generator().manual_seed(rank)
    vocab = job.model.config["vocab_size"]
    micro = [{"input_ids": ids, "labels": ids.clone()}
             for ids in (torch.randint(0, vocab, (t.micro_batch_size, t.seq_len), generator=gen)
                         for _ in range(t.global_batch_size // (t.micro_batch_size * WORLD)))]
    times = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        forward_backward(model, micro, device=torch.device("cpu"), world_size=WORLD)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps(times[WARMUP:]))
    dist.destroy_process_group()


def _median_step_s(plan: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(_worker, args=(os.path.join(tmp, "store"), plan, out), nprocs=WORLD, join=True)
        return statistics.median(json.loads(Path(out).read_text()))


def main() -> None:
    from training.config import load_job_config

    job = load_job_config(ROOT / "jobs" / "local.toml")
    shipped, previous = _median_step_s("shipped"), _median_step_s("every_chunk_checkpointed")
    tokens = job.train.global_batch_size * job.train.seq_len
    print(json.dumps({
        "name": "local_step", "device": "cpu", "cpus": os.cpu_count(), "ranks": WORLD, "threads_per_rank": 1,
        "load_average_1m": round(os.getloadavg()[0], 1), "tokens_per_step": tokens, "steps_measured": STEPS,
        "step_s": round(shipped, 3), "step_s_every_chunk_checkpointed": round(previous, 3),
        "saved_fraction": round(1 - shipped / previous, 3),
        "tokens_per_s": round(tokens / shipped), "tokens_per_s_every_chunk_checkpointed": round(tokens / previous),
    }))


if __name__ == "__main__":
    main()
