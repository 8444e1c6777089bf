"""The host AdamW rate under ``parallel.cpu_offload``: milliseconds per million fp32 parameters
of one ``torch.optim.AdamW.step`` on the CPU, fused against foreach, at 1 thread and at every
thread this machine has (Ray sets a worker's OMP_NUM_THREADS to its ``num_cpus``; the plan
search gives an offload plan's workers the CPUs of their pod).

The parameters are a shard's worth of matrices (the 7B offload job's shard per GPU is ~0.95 B
parameters; 16 M here, in 1 M-row blocks, is enough to leave the caches). The step model reads
the figures (raytrain_eks/planning/gpu_figures.py ``HOST_ADAMW_MS_PER_MILLION``); ``make
gpu-check`` measures the same on the GPU host (bench/gpu_check.py) and its calibration replaces them.

Run: ``.venv/bin/python bench/bench_host_adamw.py`` (about a minute). Prints a table, then ONE JSON
line. Timings on a shared machine vary: the figure is the median of the repeats, the spread beside it.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MILLIONS = 16
REPEATS = 5


def adamw_ms_per_million(kernel: str, threads: int, millions: int = MILLIONS, repeats: int = REPEATS) -> list[float]:
    """Per repeat: milliseconds of one AdamW step per million parameters (after a warm-up step
    that makes the state)."""
    import torch

    torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(millions)]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, **{kernel: True})
    optimizer.step()
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        optimizer.step()
        out.append((time.perf_counter() - began) * 1e3 / (millions * 1024 * 1024 / 1e6))
    return out


def main() -> None:
    import torch

    threads = sorted({1, os.cpu_count() or 1})
    results = {}
    print("| kernel | threads | ms per million parameters (median, min-max) |\n|---|---|---|")
    for kernel in ("fused", "foreach"):
        for n in threads:
            runs = adamw_ms_per_million(kernel, n)
            results[f"{kernel}_{n}"] = {"median": round(statistics.median(runs), 2),
                                        "min": round(min(runs), 2), "max": round(max(runs), 2)}
            print(f"| {kernel} | {n} | {statistics.median(runs):.2f} ({min(runs):.2f}-{max(runs):.2f}) |", flush=True)
    print(json.dumps({"name": "host_adamw", "torch": torch.__version__, "cpu_count": os.cpu_count(),
                      "ms_per_million": results}))


if __name__ == "__main__":
    main()
