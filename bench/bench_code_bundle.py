"""The code archive every synth builds (charts/code_bundle.py): its build time and size at the
level it uses, beside zlib's fastest and smallest levels.

Run: ``.venv/bin/python bench/bench_code_bundle.py`` (a few seconds). Prints ONE JSON object on
its last line.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from charts import code_bundle  # noqa: E402

ROUNDS = 3


def _build(level: int) -> tuple[float, int]:
    """Median build seconds and the archive's bytes at ``level``."""
    times, size = [], 0
    used = code_bundle._LEVEL
    code_bundle._LEVEL = level
    try:
        for _ in range(ROUNDS):
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                bundle = code_bundle.build_code_bundle(ROOT, out)
                times.append(time.perf_counter() - start)
                size = bundle.path.stat().st_size
    finally:
        code_bundle._LEVEL = used
    return statistics.median(times), size


def main() -> int:
    figures = {"name": "code_bundle", "level": code_bundle._LEVEL,
               "files": len(code_bundle.bundle_files(ROOT))}
    for level in sorted({1, code_bundle._LEVEL, 9}):
        seconds, size = _build(level)
        figures[f"level{level}_build_s"] = round(seconds, 3)
        figures[f"level{level}_mb"] = round(size / 1e6, 2)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
