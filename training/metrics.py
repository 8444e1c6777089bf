"""Per-step metrics: loss, lr, grad norm, tokens/s, TFLOP/s and MFU per device, step time, memory.

The loop's steps reach them through :class:`LogWindow`: the steps between two log steps, read from
the device once per window, with the window's wall-clock and compute-only rates on its last row.

Rank 0 appends one JSON object per step (and per evaluation) to ``metrics.jsonl`` in a local
run directory and mirrors the file into the run's storage (local directory or S3) at the report
cadence and at the end, so a report can be rendered from storage alone. It also prints a console
progress line. Reporting to Ray happens in the loop at ``train.report_every_n_steps``: every
``ray.train.report`` waits for a controller poll (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by
default), so never every step.

The console: what a run shows on the terminal is the job's own lines (stage lines, one progress line per
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

The job's own progress line is written straight to stdout (:class:`MetricsLog`), so it is not
affected; nor are warnings and errors.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from training import contract, flops

if TYPE_CHECKING:
    from training.objectives import Objective

CPU_DEVICE = "cpu"


def peak_tflops_from_env(environ: Mapping[str, str], device: str = "") -> float | None:
    """The GPU's peak bf16 TFLOP/s as the manifest states it; None when absent (MFU then n/a,
    never guessed from the device name). A spot group of several GPU models states
    ``MODEL=peak,...`` (charts/cluster_spec.py): the entry whose model is a word of ``device``."""
    text = environ.get(contract.ENV_PEAK_TFLOPS, "")
    if "=" in text:
        words = device.upper().replace("-", " ").split()
        found = [peak for model, _, peak in (part.partition("=") for part in text.split(","))
                 if model.strip() and all(w in words for w in model.upper().split())]
        text = found[0] if len(found) == 1 else ""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def device_name(on_gpu: bool) -> str:
    """``torch.cuda.get_device_name()`` on GPU (e.g. ``NVIDIA L4``), ``cpu`` otherwise."""
    return torch.cuda.get_device_name() if on_gpu else CPU_DEVICE


def peak_memory_gib(on_gpu: bool) -> float:
    """Peak allocated GPU memory, or the process's peak resident set on CPU (GiB)."""
    if on_gpu:
        return torch.cuda.max_memory_allocated() / 2**30
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputModel:
    """What turns a step time into tokens/s, TFLOP/s and MFU for one run."""

    tokens_per_step: int
    """Global tokens per optimizer step (global batch x seq_len)."""
    world_size: int
    flops_per_token: float
    """Training FLOPs per token from the model's real shapes (training/flops.py)."""
    peak_tflops: float | None
    """Peak dense bf16 TFLOP/s of one device; None on CPU or when the manifest does not state it."""

    @classmethod
    def for_model(cls, hf_config: Any, *, seq_len: int, tokens_per_step: int, world_size: int,
                  device: str, environ: Mapping[str, str] | None = None,
                  trainable_params: int | None = None) -> "ThroughputModel":
        """``trainable_params``: the trained parameters when the base is frozen (LoRA): the FLOPs
        per token are then the ones a LoRA step executes (no weight gradients of the base,
        training/flops.py ``lora_training_flops_per_token``), not a full fine-tune's 6N."""
        shapes = flops.ModelShapes.from_hf_config(hf_config)
        peak = None if device == CPU_DEVICE else peak_tflops_from_env(os.environ if environ is None else environ, device)
        per_token = (flops.training_flops_per_token(shapes, seq_len) if trainable_params is None
                     else flops.lora_training_flops_per_token(shapes, seq_len, trainable_params))
        return cls(tokens_per_step=tokens_per_step, world_size=world_size, flops_per_token=per_token, peak_tflops=peak)

    def figures(self, step_time_s: float) -> dict[str, Any]:
        tokens_per_s = self.tokens_per_step / step_time_s
        per_device = tokens_per_s / self.world_size
        achieved = flops.achieved_tflops(per_device, self.flops_per_token)
        mfu = flops.mfu(per_device, self.flops_per_token, self.peak_tflops)
        return {contract.TOKENS_PER_S: tokens_per_s, contract.TOKENS_PER_S_PER_DEVICE: per_device,
                contract.TFLOPS_PER_DEVICE: achieved, contract.MFU: mfu}


class LogWindow:
    """The steps between two log steps: their pending device values and their wall time.

    Two rates per window, under one definition (:mod:`training.contract`): wall-clock
    (``tokens_per_s``, ``mfu`` over ``step_time_s``): the window's wall time per step, checkpoint,
    evaluation and report work included; compute-only (``compute_tokens_per_s``,
    ``compute_mfu`` over ``compute_s``): minus the time booked in :meth:`overhead`. Both ends of
    a window are synchronised with the device, so queued GPU work is never counted in the wrong
    window.
    """

    def __init__(self, throughput: Any, *, on_gpu: bool, objective: Objective | None = None):
        if objective is None:  # sft by default, as the loop's; imported here: the driver imports this module too
            from training import model as forward_fns
            from training.objectives import sft

            objective = sft.SFT(forward_fns)
        self.throughput, self.on_gpu, self.objective = throughput, on_gpu, objective
        self.pending: list[tuple[dict[str, Any], torch.Tensor, Any]] = []
        self.overhead_s = 0.0
        self.started = time.perf_counter()
        self.last_step_s: float | None = None

    def _sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize()

    def add(self, entry: dict[str, Any], sums: torch.Tensor, grad_norm: Any) -> None:
        """A finished step: ``entry`` has the host-side fields; the rest is resolved at :meth:`close`."""
        self.pending.append((entry, sums.detach(), grad_norm))

    @contextmanager
    def overhead(self, due: bool = True) -> Iterator[None]:
        """Time non-step work; when ``due`` (work will happen), the device is drained first so
        the step's queued compute is not booked as overhead."""
        if not due:
            yield
            return
        self._sync()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.overhead_s += time.perf_counter() - began

    def close(self, peak_memory_gib: float | None = None) -> list[dict[str, Any]]:
        """Synchronise once, resolve every pending step, put the window's figures on the last
        row; returns the rows (oldest first) and starts the next window."""
        self._sync()
        now = time.perf_counter()
        wall = now - self.started
        rows: list[dict[str, Any]] = []
        if self.pending:
            sums = torch.stack([s for _, s, _ in self.pending]).cpu().tolist()  # the one host read
            norms = [float(n.full_tensor() if hasattr(n, "full_tensor") else n) for _, _, n in self.pending]
            for (entry, _, _), step_sums, norm in zip(self.pending, sums, norms):
                rows.append({**entry, **self.objective.figures(step_sums), contract.GRAD_NORM: norm})
            steps = len(rows)
            compute = max(wall - self.overhead_s, 1e-9)
            self.last_step_s = wall / steps
            compute_figures = self.throughput.figures(compute / steps)
            rows[-1].update(self.throughput.figures(wall / steps))
            rows[-1].update({contract.STEP_TIME_S: wall / steps, contract.COMPUTE_S: compute / steps,
                             contract.COMPUTE_TOKENS_PER_S: compute_figures[contract.TOKENS_PER_S],
                             contract.COMPUTE_MFU: compute_figures[contract.MFU],
                             contract.WINDOW_S: wall, contract.OVERHEAD_S: self.overhead_s,
                             contract.PEAK_MEMORY_GIB: peak_memory_gib, contract.WALL_TIME: time.time()})
        self.pending, self.overhead_s, self.started = [], 0.0, now
        return rows


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_line(record: dict[str, Any], max_steps: int, eta_s: float) -> str:
    """``step 12/100 | loss 3.2145 | lr 1.0e-04 | 5,123 tok/s | mfu 41.2% | eta 3m12s``."""
    mfu = record.get("mfu")
    mfu_text = "n/a" if mfu is None else f"{100 * mfu:.1f}%"
    return (f"step {record['step']}/{max_steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            f"gnorm {record['grad_norm']:.3f} | {record['tokens_per_s']:,.0f} tok/s | mfu {mfu_text} | "
            f"eta {format_duration(eta_s)}")


class MetricsLog:
    """Rank 0's JSONL metrics file, mirrored into the run's storage; a no-op on other ranks.

    ``storage`` is Ray's StorageContext (or None outside Ray): the file lands at
    ``<experiment_fs_path>/metrics.jsonl`` on its ``storage_filesystem``.
    """

    FILE_NAME = contract.METRICS_NAME

    def __init__(self, local_dir: str | Path, *, enabled: bool, storage: Any = None, stream=sys.stdout):
        self.enabled = enabled
        self.local_path = Path(local_dir) / self.FILE_NAME
        self.storage = storage
        self.stream = stream
        self._dirty = False
        if enabled:
            self.local_path.parent.mkdir(parents=True, exist_ok=True)
            # Start from what storage holds (a retry or resume continues the history; a step
            # redone after a restore appears again and the later record wins), else empty.
            self.local_path.write_bytes(self._stored_bytes())
            self._file = self.local_path.open("a", encoding="utf-8")

    def _stored_bytes(self) -> bytes:
        if self.storage is None:
            return b""
        import pyarrow.fs as pafs

        fs, path = self.storage.storage_filesystem, f"{self.storage.experiment_fs_path}/{self.FILE_NAME}"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return b""
        from training.storage.files import read_stored

        return read_stored(fs, path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        self._dirty = True

    def print(self, line: str) -> None:
        if self.enabled:
            # Not print(): Ray Train patches print() to log as well, which doubles every line.
            self.stream.write(line + "\n")
            self.stream.flush()

    def sync(self) -> None:
        """Copy the whole file to storage (S3 cannot append; the file is small)."""
        if not (self.enabled and self._dirty and self.storage is not None):
            return
        fs, base = self.storage.storage_filesystem, self.storage.experiment_fs_path
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(f"{base}/{self.FILE_NAME}") as out:
            out.write(self.local_path.read_bytes())
        self._dirty = False

    def close(self) -> None:
        if self.enabled:
            self.sync()
            self._file.close()


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
    workers inherit the setting: the variable is in Ray Train's ``ENV_VARS_TO_PROPAGATE``). Only
    a netcheck does: a training run keeps it on, it is how a node drain's notice reaches the
    workers (training/checkpointing/manager.py checkpoints on it).

    The watcher is an actor whose constructor arguments (the workers' actor handles) go through
    the object store while it may restart, so Ray core logs an error line for it on every run
    (``core_worker.cc``: "Actor with class name: 'PreemptionWatcher' ... has constructor arguments
    in the object store and max_restarts > 0"): harmless, and the price of the notice in a
    training run; a netcheck has no checkpoint to save on a notice. A value the user set is kept."""
    import os

    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
