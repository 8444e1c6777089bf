"""`make bench`: run every bench/bench_*.py and gather their figures into bench/results/figures.json.

Each benchmark script prints ONE JSON object on its last stdout line: {"name": ..., figures...}.
Timings are reported, never asserted (the machines are shared and noisy).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    results, failed = {}, []
    scripts = sorted(HERE.glob("bench_*.py"))
    for i, script in enumerate(scripts, 1):
        print(f"[{i}/{len(scripts)}] {script.name} ...", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=HERE.parent)
        wall = round(time.perf_counter() - start, 2)
        lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            failed.append(script.name)
            print(f"  FAILED ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:] }", flush=True)
            continue
        figures = json.loads(lines[-1])
        figures["wall_s"] = wall
        results[script.stem] = figures
        print(f"  {json.dumps(figures)}", flush=True)
    out = HERE / "results" / "figures.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"figures: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
