"""The suite's fixed cost and its cheapest tier, in one process (docs/testing.md: tiers by cost).

Runs, from the repository root, ``pytest --collect-only -q`` (collection alone) and
``pytest -m unit --durations=25`` (the unit tier: no synth, no subprocess, no Ray), each with
``-p no:xdist -p no:cacheprovider``, and prints their wall times, the tier's counts and its
slowest tests as one JSON line. Reported, never asserted: the machine is shared.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_PROCESS = ["-p", "no:xdist", "-p", "no:cacheprovider"]


def timed(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", *ONE_PROCESS, *args], cwd=ROOT,
                          capture_output=True, text=True)
    return round(time.perf_counter() - start, 1), proc.stdout


def main() -> None:
    collect_s, _ = timed(["--collect-only", "-q"])
    unit_s, out = timed(["-q", "-m", "unit", "--durations=25"])
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|deselected|errors?)", out)}
    slowest = re.findall(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)", out, re.MULTILINE)
    print(json.dumps({"name": "test_tiers", "collect_s": collect_s, "unit_tier_s": unit_s, "unit_tier": counts,
                      "unit_slowest": [[float(s), phase, test] for s, phase, test in slowest[:25]]}))


if __name__ == "__main__":
    main()
