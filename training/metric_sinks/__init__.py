"""The metric-sink registry: the loop's metrics fan out to the run's own ``metrics.jsonl`` and
to every sink in this folder.

One file per sink: ``<name>.py`` defines ``open_sink(job, ctx)``, which returns the sink for
this worker or None (not on this rank, not configured here). A sink has any of these methods,
each called on every sink that has it, in the order of the file names:

- ``write(row)``: one ``metrics.jsonl`` row (``kind`` train, eval or summary; the keys are
  training/contract.py's);
- ``checkpoints(timings)``: the checkpoint manager's timings after a step (the newest is new
  when the list grew);
- ``print(line)``: a console line (progress, evaluation);
- ``sync()``: at the report cadence (``train.report_every_n_steps``): hand what is buffered on;
- ``close()``: at the end of the run.

The driver's side (:func:`open_driver`, from run.json's first write): a sink file may define
``open_driver_sink(job, run_dir, record)``, which starts what follows the run from the driver
(MLflow's live run) and returns an object whose ``after_run(record)`` ends it, or None; and/or
``after_run(job, run_dir, record)``, called once the run's record (run.json, with its verdict)
is final when no driver sink of that file was opened. A failure on the driver's side is a warning
line, never the run's failure (the tracking is a copy; run.json is the record).

``metrics.jsonl`` (in the run's storage, and rank 0's console: :func:`record_sink`) is no
plug-in: it is the run's record of its figures, which the run record, the report and
``raytrain-eks reproduce`` read, so it is always first. ``prometheus`` (gauges through Ray's
metrics agent), ``tensorboard`` (event files in the run directory) and ``mlflow`` (the run on
a tracking server, live from the driver) are the sinks today; adding one is adding its file
here. The loop knows only :class:`Metrics`.

What a tracking sink logs of a ``metrics.jsonl`` row (its numbers, by step, under one name each:
:func:`scalars`, :func:`row_step`, :func:`row_time`) is defined here once, for the TensorBoard
and MLflow sinks and the tests that compare them with the file.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from typing import Any, Iterable, Iterator

from training import contract

HOOKS = ("write", "checkpoints", "print", "sync", "close")


def sink_names() -> tuple[str, ...]:
    """The registered sinks: this folder's modules, by name."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


class Metrics:
    """The fan-out: each call goes to every sink that has that method."""

    def __init__(self, sinks: Iterable[Any]):
        self.sinks = [s for s in sinks if s is not None]

    def _each(self, hook: str, *args: Any) -> None:
        for sink in self.sinks:
            method = getattr(sink, hook, None)
            if method is not None:
                method(*args)

    def write(self, row: dict[str, Any]) -> None:
        self._each("write", row)

    def checkpoints(self, timings: Iterable[Any]) -> None:
        self._each("checkpoints", list(timings))

    def print(self, line: str) -> None:
        self._each("print", line)

    def sync(self) -> None:
        self._each("sync")

    def close(self) -> None:
        self._each("close")


def record_sink(ctx: Any) -> Any:
    """``metrics.jsonl``: rank 0 appends every row and mirrors the file into the run's storage
    (training/metrics.py: MetricsLog), and prints the console lines; None on the other ranks."""
    from training.metrics import MetricsLog

    return MetricsLog(ctx.local_dir, enabled=True, storage=ctx.storage) if ctx.rank == 0 else None


def open_metrics(job: Any, ctx: Any, names: Iterable[str] | None = None) -> Metrics:
    """``metrics.jsonl`` and every registered sink (or those ``names``) opened for this worker
    (``ctx``: the loop's WorkerContext); a module without ``open_sink`` is the driver's only
    (``after_run``)."""
    modules = [importlib.import_module(f"{__name__}.{name}") for name in (sink_names() if names is None else names)]
    return Metrics([record_sink(ctx),
                    *(module.open_sink(job, ctx) for module in modules if hasattr(module, "open_sink"))])


class DriverSinks:
    """The driver's sinks of one run: those opened at its start, and the others' ``after_run``."""

    def __init__(self, job: Any, run_dir: str, opened: dict[str, Any], names: Iterable[str]):
        self.job, self.run_dir, self.opened, self.names = job, run_dir, opened, tuple(names)

    def after_run(self, record: dict[str, Any]) -> None:
        """The end of the run, once its record is final: every sink's ``after_run``."""
        for name in self.names:
            live = self.opened.get(name)
            hook = getattr(importlib.import_module(f"{__name__}.{name}"), "after_run", None)
            _warning_only(name, lambda: live.after_run(record) if live is not None
                          else hook and hook(self.job, self.run_dir, record))


def _warning_only(name: str, action: Any) -> Any:
    try:
        return action()
    except Exception as err:  # noqa: BLE001 - a tracking copy never fails the run
        print(f"warning: metric sink {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return None


def open_driver(job: Any, run_dir: str, record: dict[str, Any], names: Iterable[str] | None = None) -> DriverSinks:
    """The driver's start of the run (its record's first write): every ``open_driver_sink``."""
    names = sink_names() if names is None else tuple(names)
    opened = {}
    for name in names:
        opener = getattr(importlib.import_module(f"{__name__}.{name}"), "open_driver_sink", None)
        if opener is not None and (live := _warning_only(name, lambda: opener(job, run_dir, record))) is not None:
            opened[name] = live
    return DriverSinks(job, run_dir, opened, names)


def after_run(job: Any, run_dir: str, record: dict[str, Any], names: Iterable[str] | None = None) -> None:
    """The driver's end of a run it opened no sink for: every sink module's ``after_run``."""
    DriverSinks(job, run_dir, {}, sink_names() if names is None else names).after_run(record)


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
