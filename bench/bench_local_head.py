"""The local Ray head of `make demo` and `raytrain-eks submit --local`: how long it takes to come
up and to stop, stopped as it stops (``ray stop``'s order: raylet, the others, the GCS last) and
with every process sent SIGTERM at once (the GCS then outlives its SIGTERM until the SIGKILL).

Run: ``.venv/bin/python bench/bench_local_head.py`` (about half a minute on an idle 2-core
machine). Prints ONE JSON object on its last line.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raytrain_eks.backends import local_services  # noqa: E402

ROUNDS = 2


def _all_at_once(marker: str, grace_s: float = 10.0) -> None:
    """Every process of the head SIGTERM'd together, SIGKILL after the grace period."""
    for pid in local_services.processes_matching(marker):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while local_services.processes_matching(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in local_services.processes_matching(marker):
        os.kill(pid, signal.SIGKILL)


def _round(stop) -> tuple[float, float]:
    start = time.perf_counter()
    with local_services.ray_head(num_cpus=2) as head:
        up = time.perf_counter() - start
        start = time.perf_counter()
        if stop is not None:
            stop(head.temp_dir)
    return up, time.perf_counter() - start


def main() -> int:
    ordered = [_round(None) for _ in range(ROUNDS)]  # ray_head's own stop
    at_once = [_round(_all_at_once) for _ in range(ROUNDS)]
    print(json.dumps({"name": "local_head",
                      "start_s_median": round(statistics.median(u for u, _ in ordered + at_once), 2),
                      "stop_s_median": round(statistics.median(s for _, s in ordered), 2),
                      "stop_all_at_once_s_median": round(statistics.median(s for _, s in at_once), 2),
                      "rounds": ROUNDS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
