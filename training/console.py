"""What a run shows on the terminal: the job's own lines (stage lines, one progress line per
logged step, warnings, errors), not Ray Train's INFO chatter.

Done through Ray's own logging configuration, never by filtering output, so nothing is lost:

- the controller and the ``ray.train`` loggers: ``RunConfig(logging_config=LoggingConfig(...))``
  at :data:`RAY_TRAIN_CONSOLE_LEVEL`. Ray Train still writes every level to its system log files
  (``logs/train/ray-train-sys-*.log`` in the Ray session's log directory).
- each worker's root logger: Ray Train configures it at INFO with two handlers, ``console`` and a
  file in ``logs/train/``. Ray's per-report line ("Reporting training result ...") goes through
  that root logger (its logger is named after its source file, not ``ray.train``, so
  ``LoggingConfig`` does not reach it). :func:`quiet_worker_console` raises only the console
  handler's level: the line still lands in the ``ray-train-app-worker-*.log`` file.

The job's own progress line is written straight to stdout (training/metrics.py), so it is not
affected; nor are warnings and errors.
"""
from __future__ import annotations

import logging
from typing import Any

RAY_TRAIN_CONSOLE_LEVEL = "WARNING"
CONSOLE_HANDLER = "console"
"""The name Ray Train gives its console handler in the worker's logging configuration."""


def ray_train_logging_config() -> Any:
    """Ray Train's own logging setting for the RunConfig (console at WARNING)."""
    from ray.train import LoggingConfig

    return LoggingConfig(log_level=RAY_TRAIN_CONSOLE_LEVEL)


def quiet_worker_console(root: logging.Logger | None = None) -> int:
    """Raise the level of Ray Train's console handler on this worker's root logger; its file
    handler keeps every record. Returns how many handlers were changed (0 outside Ray Train)."""
    root = root or logging.getLogger()
    changed = 0
    for handler in root.handlers:
        if handler.get_name() == CONSOLE_HANDLER:
            handler.setLevel(RAY_TRAIN_CONSOLE_LEVEL)
            changed += 1
    return changed


PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
"""Ray Train 2.58's switch for its PreemptionWatcher (``ray/train/v2/_internal/constants.py``,
read by the controller in ``execution/controller/controller.py``; default on)."""


def without_preemption_watcher() -> None:
    """Turn off Ray Train's PreemptionWatcher for this driver's runs (the controller and its
    workers inherit the setting: the variable is in Ray Train's ``ENV_VARS_TO_PROPAGATE``).

    The watcher is an actor whose constructor arguments (the workers' actor handles) go through
    the object store while it may restart, so Ray core logs an error line for it on every run
    (``core_worker.cc``: "Actor with class name: 'PreemptionWatcher' ... has constructor arguments
    in the object store and max_restarts > 0"). It only feeds ``ray.train.get_preemption_info()``,
    which this job never reads (a drained node ends in Ray Train's restart from the last
    checkpoint either way), so turning it off loses nothing. A value the user set is kept."""
    import os

    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
