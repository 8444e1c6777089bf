"""Driver side, before any worker starts: what to do when the run name already exists.

``checkpoint.on_existing_run``:
- ``resume`` (default): continue from the newest COMPLETE checkpoint under
  ``<storage>/<run_name>/`` (incomplete ones are skipped with a warning naming them);
- ``refuse``: stop with one line naming the run and its location.
Either way a run that already reached ``train.max_steps`` is refused with one line: Ray Train
would otherwise "finish" it again by training zero steps (the same storage path and run name resume silently).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from training.checkpointing import storage

log = logging.getLogger(__name__)


class ExistingRunError(ValueError):
    """The run name exists and may not (or need not) be continued; ``str()`` is one line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePlan:
    """What the driver hands the workers."""

    run_uri: str
    """``<storage>/<run_name>``."""
    existed: bool
    """True when something was already stored under the run."""
    resume_from: str = ""
    """URI of the newest complete checkpoint ('' = start at step 0)."""
    resume_step: int = 0


def plan_resume(*, storage_path: str, run_name: str, on_existing_run: str, max_steps: int,
                world_size: int | None = None, source: str = "job config") -> ResumePlan:
    """Apply the policy; raises :class:`ExistingRunError` (one line) when the run must not start.

    ``world_size`` (parallel.num_workers) may differ from the checkpoint's: the workers reshard
    through DCP (checkpoints are taken at step boundaries, where the data position is global)."""
    run = storage.run_uri(storage_path, run_name)
    if not storage.run_exists(run):
        return ResumePlan(run_uri=run, existed=False)
    if on_existing_run == "refuse":
        raise ExistingRunError(
            f"{source}: checkpoint.on_existing_run: 'refuse' and run {run_name!r} already exists at {run} "
            "(choose a new checkpoint.run_name, delete the run, or set on_existing_run = 'resume')")
    latest = storage.find_latest_complete(run)
    if latest is None:
        log.warning("run %s exists but holds no complete checkpoint: starting at step 0", run)
        return ResumePlan(run_uri=run, existed=True)
    if latest.step >= max_steps:
        raise ExistingRunError(
            f"{source}: train.max_steps: {max_steps} already reached: run {run_name!r} has a complete "
            f"checkpoint at step {latest.step} ({latest.uri}); nothing to train (raise train.max_steps "
            "to continue it, or choose a new checkpoint.run_name)")
    written_by = (latest.marker or {}).get("world_size")
    if world_size is not None and written_by is not None and written_by != world_size:
        log.warning("run %s was written by %d ranks and resumes on %d: the workers reshard the checkpoint",
                    run_name, written_by, world_size)
    log.info("resuming run %s from step %d (%s)", run_name, latest.step, latest.uri)
    return ResumePlan(run_uri=run, existed=True, resume_from=latest.uri, resume_step=latest.step)
