"""One optimizer step's forward/backward, and the log window that turns steps into figures.

The loss of a step is the token-weighted mean over the WHOLE global batch: each rank sums its
token losses, the target token count is all-reduced once per step, and backward runs on
``sum * world / global_count`` (FSDP averages gradients over ranks). So the numbers do not
depend on how the global batch is split over ranks and micro batches.

Nothing here reads a device value on the host: the step's loss, token count and gradient norm
stay tensors until :class:`LogWindow` closes at a log step, where ONE synchronisation turns
every pending step into numbers (a ``.item()`` per step would stall the GPU queue each step).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist

from training import contract
from training.model import count_targets, loss_sum
from training.parallel import begin_micro_batch, end_accumulation


def forward_backward(model: torch.nn.Module, micro: list[dict[str, torch.Tensor]], *, device: torch.device,
                     world_size: int) -> torch.Tensor:
    """Accumulate the gradients of ``micro`` (this rank's micro batches of one step).

    Returns ``[loss sum, target tokens]`` of the GLOBAL batch as a float64 device tensor (one
    all-reduce); the host reads it only at a log step.
    """
    local_targets = float(sum(count_targets(b["labels"]) for b in micro))  # labels are still on the host
    global_targets = torch.tensor([local_targets], dtype=torch.float64, device=device)
    dist.all_reduce(global_targets)
    scale = world_size / global_targets.clamp(min=1.0)
    loss_total = torch.zeros(1, dtype=torch.float64, device=device)
    for index, batch in enumerate(micro):
        begin_micro_batch(model, index, len(micro))
        token_loss = loss_sum(model, batch, device)  # the host batch: indices and layout need no device read
        # FSDP averages gradients over ranks: scale so the result is d(global mean)/d(theta).
        (token_loss * scale.to(token_loss.dtype)).backward()
        loss_total += token_loss.detach().double()
    end_accumulation(model, len(micro))
    sums = torch.cat([loss_total, torch.tensor([local_targets], dtype=torch.float64, device=device)])
    dist.all_reduce(sums)
    return sums


class LogWindow:
    """The steps between two log steps: their pending device values and their wall time.

    Two rates per window, under one definition (:mod:`training.contract`): wall-clock
    (``tokens_per_s``, ``mfu`` over ``step_time_s``): the window's wall time per step, checkpoint,
    evaluation and report work included; compute-only (``compute_tokens_per_s``,
    ``compute_mfu`` over ``compute_s``): minus the time booked in :meth:`overhead`. Both ends of
    a window are synchronised with the device, so queued GPU work is never counted in the wrong
    window.
    """

    def __init__(self, throughput: Any, *, on_gpu: bool):
        self.throughput, self.on_gpu = throughput, on_gpu
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
            for (entry, _, _), (loss_sum_, targets), norm in zip(self.pending, sums, norms):
                rows.append({**entry, contract.LOSS: loss_sum_ / targets if targets > 0 else float("nan"),
                             contract.GRAD_NORM: norm})
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
