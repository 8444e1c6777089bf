"""``metrics.jsonl``: rank 0 appends every row and mirrors the file into the run's storage
(training/metrics.py: MetricsLog), and prints the console lines. The run record, the report and
``raytrain-eks reproduce`` read this file."""
from __future__ import annotations

from typing import Any

from training.metrics import MetricsLog


def open_sink(job: Any, ctx: Any) -> MetricsLog:
    """Rank 0's log (a no-op on the other ranks)."""
    return MetricsLog(ctx.local_dir, enabled=ctx.rank == 0, storage=ctx.storage)
