"""Saving during training: async DCP save, the completeness marker, the report to Ray.

One :class:`CheckpointManager` per worker. The loop calls :meth:`CheckpointManager.step_end`
after every optimizer step and :meth:`CheckpointManager.finish` once at the end.

How a checkpoint at step s travels (nothing here waits for S3):
1. the loop thread snapshots the state - the only stall: a clone of the tensors on CPU, DCP's
   device-to-host staging (``dcp.async_save``) on GPU;
2. a background thread writes this rank's shards to ``<local_root>/<run>/checkpoint_<s>/rank_<r>``
   (DCP over a dedicated gloo group so it never interleaves with training collectives), hashes
   them, gathers every rank's file list, and rank 0 writes ``COMPLETE.json`` last;
3. at the first step where every rank's background work is done (one tiny CPU all-reduce per
   step over its own gloo group, no device sync, that also carries the SIGTERM flag and the
   number of uploads in flight), all ranks call ``ray.train.report(..., checkpoint=...,
   checkpoint_upload_mode=ASYNC)``. Ray Train hands reports to its controller strictly in
   order: a metrics-only report issued while an upload runs would wait for it (so the loop
   sends none while checkpointing); ASYNC uploads queue on one thread, each keeping its staged
   copy on the node's disk, so a due checkpoint is skipped (logged, counted in
   ``skipped_steps``) while :data:`MAX_QUEUED_UPLOADS` are still in flight. Ray uploads each rank's folder into the same
   ``<storage>/<run>/checkpoint_<s>/`` in the background, registers the checkpoint only once
   every rank's upload is done, and only then deletes checkpoints beyond ``num_to_keep``; so the
   last complete checkpoint is never deleted before a newer one is complete.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils._pytree import tree_map

from training import contract
from training.checkpointing import signals
from training.checkpointing.lease import LeaseLost
from training.checkpointing.markers import FileEntry, describe_files, write_marker
from training.checkpointing.state import TrainerState, checkpoint_state

log = logging.getLogger(__name__)

MAX_QUEUED_UPLOADS = 2
"""Uploads in flight (one running, one waiting) beyond which a due checkpoint is skipped."""

ReportFn = Callable[[dict[str, Any], str, str], None]
"""``report(metrics, local_folder, checkpoint_dir_name)``: hands a finished folder onwards."""


def checkpoint_dir_name(step: int) -> str:
    """The folder name of the checkpoint at ``step`` (sorts by step)."""
    return f"checkpoint_{step:08d}"


def ray_report(metrics: dict[str, Any], folder: str, dir_name: str) -> None:
    """Report to Ray Train with an ASYNC upload (the loop does not wait for S3)."""
    import ray.train
    from ray.train import Checkpoint
    from ray.train.v2.api.report_config import CheckpointUploadMode

    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder), checkpoint_dir_name=dir_name,
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     delete_local_checkpoint_after_upload=True)


SETTLE_TIMEOUT_S = 600.0
"""The longest :meth:`CheckpointManager.settle` waits for Ray Train to commit a reported checkpoint."""


@dataclass(kw_only=True, slots=True)
class SaveTiming:
    """How long one checkpoint held the loop (stall) and how long it took in total (write)."""

    step: int
    stall_s: float
    write_s: float = 0.0


@dataclass(kw_only=True, slots=True)
class _Pending:
    step: int
    folder: Path
    metrics: dict[str, Any]
    future: concurrent.futures.Future
    timing: SaveTiming
    started: float = field(default_factory=time.perf_counter)


def pinned_stager():
    """DCP's stager into PINNED host memory, reused across saves. Staging stays synchronous: the
    next optimizer step may only change the parameters once their copy is taken; the write to
    disk and the upload run in the background."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))


class CheckpointManager:
    """Saves the model, optimizer and trainer state every ``every_n_steps`` and at the end.

    ``report`` defaults to :func:`ray_report` inside a Ray Train worker and to nothing
    otherwise (the folders then stay under ``local_root``). ``every_n_steps=0``: only at the end
    (and on SIGTERM). ``async_save=False`` writes synchronously (for the benchmark's baseline).
    """

    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 trainer: TrainerState, local_root: str, run_name: str, every_n_steps: int = 0,
                 report: ReportFn | None = None, async_save: bool = True,
                 model_config: dict[str, Any] | None = None, device: torch.device | None = None,
                 uploads_in_flight: Callable[[], int] | None = None, lease: Any = None,
                 every_minutes: float = 0.0, on_notice: Callable[[int, Any, float], None] | None = None):
        self.model, self.optimizer, self.trainer = model, optimizer, trainer
        self.every_n_steps = every_n_steps
        self.every_minutes = every_minutes
        """Also save once this many minutes passed since the last save (0: by steps only)."""
        self._last_save_at = time.monotonic()
        self.async_save = async_save
        self.model_config = model_config
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.device = device or torch.device("cpu")
        self.root = Path(local_root) / run_name
        in_ray = _in_ray_train()
        self.report = report if report is not None else (ray_report if in_ray else _no_report)
        self.uploads_in_flight = uploads_in_flight or (ray_uploads_in_flight if in_ray else _nothing_in_flight)
        self.on_notice = on_notice
        """Called on every rank once the checkpoint on a drain notice is committed: ``(step,
        PreemptionInfo or None, seconds from the notice's agreement to the commit)``."""
        self.notice_step: int | None = None
        """The step checkpointed on a node drain's notice (None: no notice in this attempt)."""
        self.lease = lease
        """This attempt's :class:`~training.checkpointing.lease.Lease` (None: not checked)."""
        if local_rank(self.rank) == 0:
            # folders a killed attempt never handed over; the collective below makes the others wait
            shutil.rmtree(self.root, ignore_errors=True)
        # Collective: every rank creates the group here, at the same point of the program.
        self._ckpt_group = dist.new_group(backend="gloo") if self.distributed else None
        # The per-step agreement runs on CPU over its own group: no device sync, and never
        # interleaved with the background thread's collectives on the group above.
        self._agree_group = dist.new_group(backend="gloo") if self.distributed else None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckpt")
        # One stager for the run: its pinned host buffers are made at the first save and reused
        # by every later one (keyed by the shards' storages), instead of pageable copies per save.
        self._stager = pinned_stager() if self.async_save and self.device.type == "cuda" else None
        self._pending: _Pending | None = None
        self.timings: list[SaveTiming] = []
        self.last_saved_step = -1
        self.stopped_by_signal = False
        self.skipped_steps: list[int] = []
        """Due checkpoints skipped because :data:`MAX_QUEUED_UPLOADS` were still uploading."""

    # -- the loop's two calls -------------------------------------------------------------------

    def step_end(self, step: int, metrics: dict[str, Any] | None = None, *, max_steps: int | None = None) -> bool:
        """Call after each optimizer step. Saves when due; returns True when the loop must stop.

        Every rank must call it at every step (it runs one small all-reduce): ranks agree on
        whether a SIGTERM arrived anywhere and on when a background write is finished.
        """
        stop, ready, queued, late, notice = self._agree()
        if self._pending is not None and ready:
            self._finalize()
        if notice and not stop and self.notice_step is None:
            self._checkpoint_on_notice(step, metrics)  # holds; Ray Train restarts the workers
        # by steps or by time, the first that comes; every rank acts on the agreed answer
        due = (self.every_n_steps > 0 and step % self.every_n_steps == 0) or late
        final = max_steps is not None and step >= max_steps
        if stop:
            self.stopped_by_signal = True
            log.warning("rank %d: stop requested (SIGTERM/preemption): final checkpoint at step %d", self.rank, step)
        if due and not (stop or final) and queued >= MAX_QUEUED_UPLOADS:
            # The storage is slower than the cadence: queueing more would only fill the disk.
            self.skipped_steps.append(step)
            log.warning("rank %d: checkpoint at step %d skipped: %d uploads still in flight", self.rank, step, queued)
        elif due or stop or final:
            # the checkpoint's metrics (Ray's Result.metrics) say why the run ended early
            self.save(step, dict(metrics or {}, stopped_by_signal=True) if stop else (metrics or {}))
        if stop:
            self.wait()
            signals.final_checkpoint_written()
        return stop

    def _checkpoint_on_notice(self, step: int, metrics: dict[str, Any] | None) -> None:
        """A node of the run is draining: commit a checkpoint of THIS step boundary, then hold.

        Every rank agreed on the notice in this step's all-reduce, so every rank saves the same
        step. The checkpoint is committed (:meth:`settle`: Ray Train has registered it) before
        the hold, so the restart's ``get_checkpoint()`` returns it and no step is lost. The hold
        trains nothing more: a step after the notice would be lost with the node anyway unless a
        further checkpoint fitted the notice. Ray Train's controller waits in its PREEMPTING state
        until every worker ended or the drain's deadline passed, then restarts the worker group
        (``FailureConfig.max_preemption_failures``, unlimited by default) on the nodes that are
        not draining (ray 2.58 ``controller.py`` ``_handle_preempting_state``)."""
        began = time.time()
        info = signals.preemption_notice()
        log.warning("rank %d: node drain notice (%s): checkpoint at step %d, then hold", self.rank,
                    getattr(info, "preempted_node_to_ranks", "seen by another rank"), step)
        if self.last_saved_step != step:
            self.save(step, dict(metrics or {}, preemption_notice=True))
        self.settle()
        self.notice_step = step
        if self.on_notice is not None:
            self.on_notice(step, info, time.time() - began)
        deadline_ms = getattr(info, "deadline_ms", None)
        until = (deadline_ms / 1000 if deadline_ms else began + contract.SPOT_NOTICE_SECONDS) + contract.STOP_MARGIN_SECONDS
        while time.time() < until:
            time.sleep(1.0)
        # The drain was cancelled or its node outlived the deadline: go on through Ray Train's
        # failure path (a restart from the checkpoint just committed), never train on a node
        # that is about to go.
        raise DrainNotFollowed(f"node drain notice at step {step}: the run was not restarted by the deadline "
                               f"plus {contract.STOP_MARGIN_SECONDS} s")

    def due(self, step: int, *, max_steps: int | None = None) -> bool:
        """Whether :meth:`step_end` at ``step`` starts a checkpoint (barring a SIGTERM): the loop
        books that time as checkpoint overhead. (A checkpoint by time is decided by every rank
        together inside :meth:`step_end`; here this rank's own clock says whether one is near.)"""
        return ((self.every_n_steps > 0 and step % self.every_n_steps == 0) or (max_steps is not None and step >= max_steps)
                or self._late())

    def _late(self) -> bool:
        return self.every_minutes > 0 and time.monotonic() - self._last_save_at >= self.every_minutes * 60

    def finish(self, step: int, metrics: dict[str, Any] | None = None) -> None:
        """Make sure the final step is checkpointed and handed to Ray; blocks until written."""
        if self.last_saved_step != step:
            self.save(step, metrics or {})
        self.wait()
        self._executor.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, metrics: dict[str, Any]) -> None:
        """Start a checkpoint of the current state at ``step`` (waits for a previous one first)."""
        self.wait()
        began = time.perf_counter()
        folder = self.root / checkpoint_dir_name(step) / f"rank_{self.rank}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        state = checkpoint_state(self.model, self.optimizer, self.trainer, self.rank)
        self._last_save_at = time.monotonic()
        timing = SaveTiming(step=step, stall_s=0.0)
        if self.async_save and self.device.type == "cpu":
            # A plain clone is the cheapest snapshot on CPU (DCP's default stager measured ~3x
            # slower here); the write then runs in the background like dcp.async_save's thread.
            staged = tree_map(_detached_copy, {key: value.state_dict() for key, value in state.items()})
            future = self._executor.submit(self._write_and_seal, staged, folder, step)
        elif self.async_save:  # GPU: DCP stages device -> host memory, then writes in a thread
            written = dcp.async_save(state, checkpoint_id=str(folder), process_group=self._ckpt_group,
                                     no_dist=not self.distributed, async_stager=self._stager)
            future = self._executor.submit(self._seal_after, written, folder, step)
        else:
            dcp.save(state, checkpoint_id=str(folder), process_group=self._ckpt_group, no_dist=not self.distributed)
            future = concurrent.futures.Future()
            future.set_result(self._seal(folder, step))
        timing.stall_s = time.perf_counter() - began
        self._pending = _Pending(step=step, folder=folder, metrics=dict(metrics, step=step), future=future,
                                 timing=timing, started=began)
        self.last_saved_step = step
        if not self.async_save:
            self._finalize()

    def wait(self) -> None:
        """Block until the pending checkpoint is written, sealed and reported."""
        if self._pending is not None:
            began = time.perf_counter()
            self._pending.future.result()
            self._pending.timing.stall_s += time.perf_counter() - began
            self._finalize()

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Every rank, at the same point: wait until the pending checkpoint is written, sealed and
        reported, every rank got here, and Ray Train committed every checkpoint this worker
        reported (``ray.train.get_all_reported_checkpoints`` in ``COMMITTED`` mode, ray 2.58
        ``train/v2/api/train_fn_utils.py``: it blocks until the controller has processed every
        ``ray.train.report`` of this worker; ``timeout_s`` bounds it). Then a restart's
        ``get_checkpoint()`` returns the newest checkpoint the run saved."""
        self.wait()  # its report is a collective of Ray Train's: every rank calls settle
        if self.distributed:
            dist.barrier(group=self._agree_group)
        if not _in_ray_train() or not self.timings:
            return
        import ray.train

        newest = checkpoint_dir_name(self.timings[-1].step)
        began = time.perf_counter()
        committed = ray.train.get_all_reported_checkpoints(
            consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=timeout_s)
        names = [Path(c.checkpoint.path).name for c in committed]
        if newest not in names:
            log.warning("rank %d: Ray Train returned %s without %s after %.0f s (limit %.0f s)", self.rank,
                        names or "no checkpoint", newest, time.perf_counter() - began, timeout_s)

    def _write_and_seal(self, staged: dict[str, Any], folder: Path, step: int) -> None:
        dcp.save(staged, checkpoint_id=str(folder), process_group=self._ckpt_group, no_dist=not self.distributed)
        self._seal(folder, step)

    def _seal_after(self, written: Any, folder: Path, step: int) -> None:
        # async_save returns a Future (or, with async staging, a response holding one)
        (getattr(written, "upload_completion", None) or written).result()
        self._seal(folder, step)

    def _seal(self, folder: Path, step: int) -> None:
        """Hash this rank's files, gather all ranks' lists; rank 0 writes the marker last."""
        if self.rank == 0 and self.model_config is not None:
            import json

            (folder / "model_config.json").write_text(json.dumps(self.model_config, sort_keys=True), encoding="utf-8")
        mine = [FileEntry(path=e.path, size=e.size, sha256=e.sha256) for e in describe_files(folder)]
        # Rank 0 reads the lease; every rank learns its answer in the gather it already makes.
        lost = self._lease_problem() if self.lease is not None and self.rank == 0 else None
        everyone: list[Any] = [(mine, lost)]
        if self.distributed:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, (mine, lost), group=self._ckpt_group)
        if everyone[0][1]:  # no marker, no report: Ray Train neither stores nor prunes for us
            raise LeaseLost(f"checkpoint at step {step} not written: this trainer lost its run: {everyone[0][1]}")
        if self.rank == 0:
            files = [entry for rank_files, _ in everyone for entry in rank_files]
            write_marker(folder, step=step, world_size=self.world_size, files=files,
                         extra={"tokens_seen": self.trainer.tokens_seen, "written_at": time.time()})
        if self.distributed:  # nobody reports before the marker exists
            dist.barrier(group=self._ckpt_group)

    def _lease_problem(self) -> str | None:
        # Fail closed, and as an answer every rank gets in the gather (a raise on rank 0 alone
        # would leave the others waiting in it): an unreadable lease seals nothing.
        try:
            return self.lease.problem()
        except OSError as err:
            return str(err)

    def _finalize(self) -> None:
        pending, self._pending = self._pending, None
        pending.future.result()  # re-raises a failed write: a broken checkpoint is never reported
        pending.timing.write_s = time.perf_counter() - pending.started
        began = time.perf_counter()
        self.report(pending.metrics, str(pending.folder), checkpoint_dir_name(pending.step))
        pending.timing.stall_s += time.perf_counter() - began
        self.timings.append(pending.timing)

    # -- agreement ------------------------------------------------------------------------------

    def _agree(self) -> tuple[bool, bool, int, bool, bool]:
        """(any rank asked to stop, every rank's write is done, most uploads in flight on a rank,
        a rank's clock says a checkpoint by time is due: clocks differ, the answer may not; any rank
        saw a node drain notice)."""
        stop = signals.stop_requested()
        notice = signals.preemption_notice() is not None
        busy = self._pending is not None and not self._pending.future.done()
        queued = int(self.uploads_in_flight())
        late = self._late()
        if not self.distributed:
            return stop, not busy, queued, late, notice
        flags = torch.tensor([int(stop), int(busy), queued, int(late), int(notice)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._agree_group)
        return bool(flags[0]), not bool(flags[1]), int(flags[2]), bool(flags[3]), bool(flags[4])


class DrainNotFollowed(RuntimeError):
    """A drain's notice passed its deadline without Ray Train restarting the run."""


def _detached_copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def ray_uploads_in_flight() -> int:
    """Reports of this worker that Ray Train has not yet handed to its controller (ASYNC
    checkpoint uploads still running or queued); a metrics-only report would wait for them."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        context = get_train_context()
        return max(0, context.report_call_index - context.current_report_index)
    except Exception:  # another Ray version: count none (checkpoints are then never skipped)
        return 0


def _nothing_in_flight() -> int:
    return 0


def _no_report(metrics: dict[str, Any], folder: str, dir_name: str) -> None:
    """Outside Ray Train the folder stays where it was written."""


def local_rank(default: int) -> int:
    """This process's rank on its node: Ray Train's, else ``LOCAL_RANK``, else ``default``."""
    try:
        import ray.train

        return ray.train.get_context().get_local_rank()
    except Exception:  # not inside a Ray Train worker
        return int(os.environ.get("LOCAL_RANK", default))


def _in_ray_train() -> bool:
    try:
        import ray.train

        ray.train.get_context()
        return True
    except Exception:  # not inside a Ray Train worker
        return False


def local_checkpoint_root() -> str:
    """Node-local scratch space for checkpoints before their upload (env overrides)."""
    return os.environ.get(contract.ENV_CHECKPOINT_LOCAL_DIR, "/tmp/raytrain-checkpoints")
