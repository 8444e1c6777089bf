"""The metric-sink registry: the loop's metrics fan out to every sink in this folder.

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

A sink file may also (or only) define ``after_run(job, run_dir, record)``: the driver calls it once the
run's record (run.json, with its verdict) is final (:func:`after_run`); a failure there is a
warning line, never the run's failure (the tracking is a copy; run.json is the record).

``jsonl`` (``metrics.jsonl`` in the run's storage, and rank 0's console), ``prometheus``
(gauges through Ray's metrics agent), ``tensorboard`` (event files in the run directory) and
``mlflow`` (the finished run on a tracking server, from the driver) are the sinks today; adding
one is adding its file here. The loop knows only :class:`Metrics`.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any, Iterable

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


def open_metrics(job: Any, ctx: Any, names: Iterable[str] | None = None) -> Metrics:
    """Every registered sink (or those ``names``) opened for this worker (``ctx``: the loop's
    WorkerContext); a module without ``open_sink`` is the driver's only (``after_run``)."""
    modules = [importlib.import_module(f"{__name__}.{name}") for name in (sink_names() if names is None else names)]
    return Metrics(module.open_sink(job, ctx) for module in modules if hasattr(module, "open_sink"))


def after_run(job: Any, run_dir: str, record: dict[str, Any], names: Iterable[str] | None = None) -> None:
    """The driver's end of the run: every sink module's ``after_run`` (those of ``names``)."""
    for name in sink_names() if names is None else names:
        hook = getattr(importlib.import_module(f"{__name__}.{name}"), "after_run", None)
        if hook is None:
            continue
        try:
            hook(job, run_dir, record)
        except Exception as err:  # noqa: BLE001 - a tracking copy never fails the run
            print(f"warning: metric sink {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
