"""Resuming: the driver's plan (:func:`plan_resume`), then the restore in every worker: within a
run (``ray.train.get_checkpoint``) or a new run (a URI).

Each rank fetches ONLY what it reads, found by DCP's own load plan for its part of the state:
the marker and DCP's ``.metadata`` (small), the shard files it reads mostly (with the world size
unchanged: its own ``__<rank>_0.distcp``; after a change: the files its new slices overlap)
WHOLE, with size and sha256 checked against the marker, and from the other files only the byte
ranges it reads (the small replicated items DCP's de-duplication spreads over the ranks' files;
their size is checked, a whole-file hash cannot be). Into its own folder (no shared temp folder: Ray's race, where workers sharing a
checkpoint id download into one temp folder and read half-written files, cannot happen). An all-reduce carries "my copy is bad": then the checkpoint is
skipped with a warning naming it, and the newest complete one before it is tried (rank 0
chooses and broadcasts, so every rank loads the same).

A different world size reshards through DCP: model and optimizer are stored as global tensors
with their slices, and the trainer state's data position is global (consumed samples). Only the
per-rank RNG streams cannot carry over: every rank then takes rank 0's trainer state (logged).

The plan, on the driver before any worker starts: what to do when the run name already exists.

``checkpoint.on_existing_run``:
- ``resume`` (default): continue from the newest COMPLETE checkpoint under
  ``<storage>/<run_name>/`` (incomplete ones are skipped with a warning naming them);
- ``refuse``: stop with one line naming the run and its location.
Either way a run that already reached ``train.max_steps`` is refused with one line: Ray Train
would otherwise "finish" it again by training zero steps (the same storage path and run name resume silently).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from training.checkpointing import markers
from training.checkpointing.markers import DCP_METADATA, MARKER_NAME, read_marker, sha256_of
from training.checkpointing.state import TrainerState, checkpoint_state
from training.storage import files

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
    run = markers.run_uri(storage_path, run_name)
    if not markers.run_exists(run):
        return ResumePlan(run_uri=run, existed=False)
    if on_existing_run == "refuse":
        raise ExistingRunError(
            f"{source}: checkpoint.on_existing_run: 'refuse' and run {run_name!r} already exists at {run} "
            "(choose a new checkpoint.run_name, delete the run, or set on_existing_run = 'resume')")
    latest = markers.find_latest_complete(run)
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


def ray_checkpoint_uri() -> str | None:
    """The URI of Ray Train's latest checkpoint for this run (restarts after a failure), if any."""
    try:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
    except Exception:  # not inside a Ray Train worker
        return None
    if checkpoint is None:
        return None
    import pyarrow.fs as pafs

    if isinstance(checkpoint.filesystem, pafs.S3FileSystem):
        return f"s3://{checkpoint.path}"
    return checkpoint.path


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _any(flag: bool) -> bool:
    if not _distributed():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=_cpu_group())
    return bool(value.item())


_GROUPS: dict[int, Any] = {}


def _cpu_group():
    """A gloo group for the restore's small agreements (CPU tensors, also when training on NCCL),
    one per default process group (tests create several in one process)."""
    world = id(dist.group.WORLD)
    if world not in _GROUPS:
        _GROUPS.clear()
        _GROUPS[world] = dist.new_group(backend="gloo")
    return _GROUPS[world]


def _from_rank0(value: Any) -> Any:
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=_cpu_group())
    return box[0]


def _run_of(checkpoint_uri: str) -> str:
    return checkpoint_uri.rstrip("/").rsplit("/", 1)[0]


WHOLE_FILE_SHARE = 0.25
"""A file of which this rank reads at least this share is fetched whole (and its sha256
checked); from the others only the byte ranges it reads are fetched."""


def byte_ranges(state: dict[str, Any], folder: Path) -> dict[str, list[tuple[int, int]]]:
    """``{file: [(offset, length), ...]}`` DCP reads for ``state`` (this rank's part), from the
    checkpoint's ``.metadata`` in ``folder``: DCP's own load plan, so it holds for any world size."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    planner = DefaultLoadPlanner()
    planner.set_up_planner({key: value.state_dict() for key, value in state.items()}, metadata, False)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for item in planner.create_local_plan().items:
        info = metadata.storage_data[item.storage_index]
        ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
    return {name: sorted(set(spans)) for name, spans in sorted(ranges.items())}


def fetch_plan(state: dict[str, Any], folder: Path, sizes: dict[str, int]) -> tuple[list[str], dict[str, list]]:
    """(files fetched whole, {file: byte ranges} fetched partly) for this rank. With the world
    size unchanged the whole files are this rank's own shard; the ranges are the few small
    replicated items DCP's de-duplication stored in other ranks' files."""
    whole, partial = [], {}
    for name, spans in byte_ranges(state, folder).items():
        if sum(length for _, length in spans) >= WHOLE_FILE_SHARE * sizes.get(name, 0):
            whole.append(name)
        else:
            partial[name] = spans
    return whole, partial


def _fetch(source: str, state: dict[str, Any], local: Path) -> str | None:
    """Fetch and verify this rank's files into ``local``; the problem, or None."""
    shutil.rmtree(local, ignore_errors=True)
    try:
        files.download_files(source, [MARKER_NAME, DCP_METADATA], local)
        marker = read_marker(local)
        if marker is None:
            return f"no readable {MARKER_NAME}"
        entries = {entry["path"]: entry for entry in marker["files"]}
        # DCP's .metadata is a pickle (torch 2.13 distributed/checkpoint/filesystem.py
        # read_metadata: pickle.load): its hash is checked BEFORE anything reads it.
        if problem := _mismatch(local, DCP_METADATA, entries):
            return problem
        whole, partial = fetch_plan(state, local, {name: entry["size"] for name, entry in entries.items()})
        missing = [name for name in whole + list(partial) if name not in entries]
        if missing:
            return f"{missing[0]} is not listed in {MARKER_NAME}"
        files.download_files(source, whole, local)
        for name, spans in partial.items():
            files.download_ranges(source, name, spans, local, size=entries[name]["size"])
        names = whole
    except (OSError, ValueError) as err:
        return f"cannot download: {err}"
    for name in names:
        if problem := _mismatch(local, name, entries):
            return problem
    return None


def _mismatch(local: Path, name: str, entries: dict[str, dict]) -> str | None:
    """Why ``local/name`` is not the file the marker lists (its writer's size and sha256), or None.
    The marker lies in the run's own prefix, which only the run's own identity may write."""
    if name not in entries:
        return f"{name} is not listed in {MARKER_NAME}"
    path, entry = local / name, entries[name]
    if path.stat().st_size != entry["size"]:
        return f"{name} has {path.stat().st_size} bytes, the marker says {entry['size']}"
    if sha256_of(path) != entry["sha256"]:
        return f"{name} has a different sha256 than the marker records"
    return None


def restore(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, trainer: TrainerState,
            local_root: str, resume_from: str = "", device: torch.device | None = None) -> str | None:
    """Load the newest complete checkpoint into model, optimizer and ``trainer`` (in place).

    Source: Ray's ``get_checkpoint()`` when this run already reported one (a restart after a
    failure), else ``resume_from`` (a checkpoint URI the driver found for a new run). Returns the
    URI it loaded, or None (fresh start). Every rank must call it. ``device`` is unused (the
    agreements run on CPU) and kept for callers.
    """
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    source = _from_rank0(ray_checkpoint_uri() or resume_from or None)
    tried: set[str] = set()
    while source:
        written_by = _from_rank0((markers.read_remote_marker(source) or {}).get("world_size") if rank == 0 else None)
        # Same world size: every rank its own trainer state. Otherwise rank 0's (the data
        # position is global; per-rank RNG streams cannot be mapped onto another world size).
        trainer_rank = rank if written_by in (None, world) else 0
        if trainer_rank != rank and rank == 0:
            log.warning("checkpoint %s was written by %s ranks, this run has %d: resharding through DCP "
                        "(every rank continues rank 0's RNG state)", source, written_by, world)
        state = checkpoint_state(model, optimizer, trainer, trainer_rank)
        local = Path(local_root) / "restore" / Path(source.rstrip("/")).name / f"rank_{rank}"
        problem = _fetch(source, state, local)
        if _any(problem is not None):
            if problem:
                log.warning("skipping checkpoint %s on rank %d: %s", source, rank, problem)
            tried.add(source)
            shutil.rmtree(local, ignore_errors=True)
            source = _from_rank0(_previous(source, tried) if rank == 0 else None)
            continue
        # Each rank reads its own folder: checkpoint_id may differ per rank.
        dcp.load(state, checkpoint_id=str(local), no_dist=not _distributed())
        if _distributed():
            dist.barrier(group=_cpu_group())
        shutil.rmtree(local, ignore_errors=True)
        _remove_if_empty(local.parent)
        trainer.restored_from = source
        log.info("rank %d restored step %d from %s", rank, trainer.step, source)
        return source
    if tried:
        log.warning("no complete checkpoint left after skipping %s: starting from step 0", sorted(tried))
    return None


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()  # the last rank of the node to finish removes the checkpoint's folder
    except OSError:
        pass


def _previous(source: str, tried: set[str]) -> str | None:
    found = markers.find_latest_complete(_run_of(source), skip=frozenset(tried))
    return found.uri if found else None
