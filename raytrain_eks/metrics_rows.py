"""metrics.jsonl read by step: one row per step, the last write wins, and where a run resumed.

The job appends to ``metrics.jsonl`` for the whole life of a run directory. When an attempt
dies and Ray Train restarts the workers from the last complete checkpoint (or a later submit
resumes the run by name), the steps after that checkpoint are trained and logged again, so the
file's order is not the steps' order: step 15, then 11, 12, ... A reader that takes the file
order draws a zigzag and pairs step 11 of one run with step 16 of another. Every reader of the
metrics (the report's tables and plots, ``reproduce --against``) goes through :func:`by_step`.
"""
from __future__ import annotations

from typing import Any

from training import contract


def by_step(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """``(rows, resumes)``: one row per step in step order, the row written last for a step
    winning (it is what the finished run's weights came from), and the first step each later
    attempt logged (a step at or below the step logged before it). Rows without a step keep
    their order after the stepped ones."""
    latest: dict[int, dict[str, Any]] = {}
    unstepped: list[dict[str, Any]] = []
    resumes: list[int] = []
    previous: int | None = None
    for row in rows:
        step = row.get(contract.STEP)
        if not isinstance(step, int) or isinstance(step, bool):
            unstepped.append(row)
            continue
        if previous is not None and step <= previous:
            resumes.append(step)
        latest[step] = row
        previous = step
    return [latest[s] for s in sorted(latest)] + unstepped, resumes


def values_by_step(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """``{step: value}`` of one numeric key, from rows already read by :func:`by_step`."""
    return {r[contract.STEP]: r[key] for r in rows
            if isinstance(r.get(contract.STEP), int) and isinstance(r.get(key), (int, float))}


def first_difference(a: dict[int, float], b: dict[int, float]) -> int | None:
    """The first step at which two runs' values differ, or one run lacks the step; None when equal."""
    return next((s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)), None)
