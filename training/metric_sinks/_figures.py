"""What a tracking sink logs of a metrics.jsonl row: its numbers, by step, under one name each.
One definition for the TensorBoard and MLflow sinks (and the tests that compare them with the
file). Not a sink (the leading underscore keeps it out of the registry)."""
from __future__ import annotations

import time
from typing import Any, Iterator

from training import contract


def row_step(row: dict[str, Any]) -> int:
    """The step a row is logged at: its ``step``; the summary's at its ``steps``."""
    return int(row.get(contract.STEP, row.get("steps", 0)) or 0)


def row_time(row: dict[str, Any]) -> float:
    """When a row was logged (its ``time``, epoch seconds), else now."""
    value = row.get(contract.WALL_TIME)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else time.time()


def scalars(row: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """Every number of a row as ``(<kind>/<key>, value)`` (a row without a kind: ``<key>``; MLflow
    refuses a name that starts with ``/``). Left out: None, flags, lists, text, and the wall time
    (each event and metric carries its own timestamp). MLflow's metric names allow ``/`` (mlflow
    3.17.2 mlflow/utils/validation.py)."""
    kind = row.get(contract.KIND, "")
    for key, value in sorted(row.items()):
        if key not in (contract.STEP, contract.WALL_TIME) and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield (f"{kind}/{key}" if kind else key), float(value)
