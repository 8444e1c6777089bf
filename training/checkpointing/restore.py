"""Restoring in a worker: within a run (``ray.train.get_checkpoint``) or a new run (a URI).

The remote-download race (pitfalls.md, Ray issue 48726) is avoided by downloading once per node
into our own folder: local rank 0 downloads and verifies (marker, sizes, sha256), every rank
waits (an all-reduce that also carries "this copy is bad"), all ranks load, a barrier, then local
rank 0 deletes the copy. A bad checkpoint is skipped with a warning naming it, and the newest
complete one before it is tried (rank 0 chooses and broadcasts, so every rank loads the same).
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from training.checkpointing import storage
from training.checkpointing.manager import local_rank
from training.checkpointing.marker import completeness_problem, read_marker
from training.checkpointing.state import TrainerState, checkpoint_state

log = logging.getLogger(__name__)


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


def _local_rank() -> int:
    return local_rank(dist.get_rank() if _distributed() else 0)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _any(flag: bool, device: torch.device) -> bool:
    if not _distributed():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _from_rank0(value: Any) -> Any:
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _run_of(checkpoint_uri: str) -> str:
    return checkpoint_uri.rstrip("/").rsplit("/", 1)[0]


def restore(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, trainer: TrainerState,
            local_root: str, resume_from: str = "", device: torch.device | None = None) -> str | None:
    """Load the newest complete checkpoint into model, optimizer and ``trainer`` (in place).

    Source: Ray's ``get_checkpoint()`` when this run already reported one (a restart after a
    failure), else ``resume_from`` (a checkpoint URI the driver found for a new run). Returns the
    URI it loaded, or None (fresh start). Every rank must call it.
    """
    device = device or torch.device("cpu")
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    source = _from_rank0(ray_checkpoint_uri() or resume_from or None)
    tried: set[str] = set()
    while source:
        local = Path(local_root) / "restore" / Path(source.rstrip("/")).name
        problem, mismatch, written_by = None, False, None
        if _local_rank() == 0:
            shutil.rmtree(local, ignore_errors=True)
            try:
                storage.download(source, local)
                problem = completeness_problem(local)
            except OSError as err:
                problem = f"cannot download: {err}"
            written_by = (read_marker(local) or {}).get("world_size") if problem is None else None
            if written_by is not None and written_by != world:
                mismatch = True
        if _any(mismatch, device):  # older checkpoints of the run have the same world size: stop
            raise RuntimeError(f"checkpoint {source} was written by {written_by or 'another number of'} ranks and "
                               f"this run has {world}: the trainer state (data position, RNG) is per rank; "
                               "run with the same number of workers or choose a new checkpoint.run_name")
        if _any(problem is not None, device):  # also the barrier: the copy is complete before anyone loads
            if problem:
                log.warning("skipping checkpoint %s: %s", source, problem)
            tried.add(source)
            if _local_rank() == 0:
                shutil.rmtree(local, ignore_errors=True)
            source = _from_rank0(_previous(source, tried) if rank == 0 else None)
            continue
        dcp.load(checkpoint_state(model, optimizer, trainer, rank), checkpoint_id=str(local),
                 no_dist=not _distributed())
        if _distributed():
            dist.barrier()  # everyone has read the files before they go
        if _local_rank() == 0:
            shutil.rmtree(local, ignore_errors=True)
        trainer.restored_from = source
        log.info("rank %d restored step %d from %s", rank, trainer.step, source)
        return source
    if tried:
        log.warning("no complete checkpoint left after skipping %s: starting from step 0", sorted(tried))
    return None


def _previous(source: str, tried: set[str]) -> str | None:
    found = storage.find_latest_complete(_run_of(source), skip=frozenset(tried))
    return found.uri if found else None
