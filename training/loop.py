"""The training loop: ``train_loop_per_worker`` for Ray Train and :func:`train` underneath it.

One optimizer step = ``grad_accum_steps`` micro batches per rank. The loss of a step is the
token-weighted mean over the WHOLE global batch: each rank sums its token losses, the target
token count is all-reduced once per step, and backward runs on ``sum * world / global_count``
(FSDP averages gradients over ranks). So the numbers do not depend on how the global batch is
split over ranks and micro batches: 2 ranks give the losses of one process with the same batch.

The loop knows nothing of Ray beyond :class:`WorkerContext`; tests and benchmarks run
:func:`train` in plain processes (``local_context``) with the same code.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from training import evaluation, metrics, optim
from training.config import JobConfig, job_config_from_dict
from training.model import build_model, count_targets, loss_sum
from training.parallel import backend_for, build_mesh, parallelize

FAULT_STEP_ENV = "RAYTRAIN_FAULT_AT_STEP"
FAULT_RANK_ENV = "RAYTRAIN_FAULT_RANK"


@dataclass(kw_only=True)
class WorkerContext:
    """Where this worker runs: rank, world, and the run's storage (Ray's StorageContext or None)."""

    rank: int
    world_size: int
    local_rank: int
    storage: Any = None
    """Ray's StorageContext: ``storage_filesystem`` + ``experiment_fs_path`` (the run directory)."""
    local_dir: str = ""
    """Node-local scratch directory of this run (metrics before they are mirrored)."""
    report: Callable[[dict[str, Any]], None] = lambda m: None
    """Hands metrics to Ray Train (``ray.train.report``); a no-op outside Ray."""


def ray_context() -> WorkerContext:
    """The context inside a Ray Train worker (the process group is already initialised)."""
    import ray.train

    ctx = ray.train.get_context()
    storage = ctx.get_storage()
    local_dir = os.path.join(tempfile.gettempdir(), "raytrain-runs", ctx.get_experiment_name())
    return WorkerContext(rank=ctx.get_world_rank(), world_size=ctx.get_world_size(),
                         local_rank=ctx.get_local_rank(), storage=storage, local_dir=local_dir,
                         report=lambda m: ray.train.report(m))


def local_context(local_dir: str, *, rank: int = 0, world_size: int = 1, init_method: str = "") -> WorkerContext:
    """A context for a plain process (tests, benchmarks): initialises a gloo group if needed."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                init_method=init_method or f"file://{os.path.join(local_dir, 'pg-store')}")
    return WorkerContext(rank=rank, world_size=world_size, local_rank=rank, local_dir=local_dir)


@dataclass(kw_only=True)
class TrainerState:
    """The loop's own resumable state (``Stateful``: travels in the checkpoint)."""

    step: int = 0
    """Optimizer steps completed."""
    tokens_seen: int = 0
    """Global tokens trained on (input positions, including those without loss)."""
    data: Any = None
    """The train stream (``state_dict``/``load_state_dict``): the exact data position."""
    scheduler: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen,
                "data": self.data.state_dict() if self.data is not None else None,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                "extra": dict(self.extra)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        if self.data is not None and state.get("data") is not None:
            self.data.load_state_dict(state["data"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"].get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.extra = dict(state.get("extra") or {})


def maybe_inject_fault(step: int, rank: int, ctx: WorkerContext) -> None:
    """Test/demo hook: ``RAYTRAIN_FAULT_AT_STEP=k`` (+ ``RAYTRAIN_FAULT_RANK=r``, default 0) makes
    rank r exit hard once after k steps. A marker in the run's storage makes the retry pass."""
    at = os.environ.get(FAULT_STEP_ENV)
    if not at or step != int(at) or rank != int(os.environ.get(FAULT_RANK_ENV, "0")):
        return
    name = f"fault-injected-at-step-{step}-rank-{rank}"
    if ctx.storage is not None:
        fs, base = ctx.storage.storage_filesystem, ctx.storage.experiment_fs_path
        import pyarrow.fs as pafs

        if fs.get_file_info(f"{base}/{name}").type != pafs.FileType.NotFound:
            return
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(f"{base}/{name}") as out:
            out.write(b"injected\n")
    else:
        marker = os.path.join(ctx.local_dir, name)
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    print(f"[fault injection] rank {rank} exits after step {step}", file=sys.stderr, flush=True)
    os._exit(1)


def open_data(job: JobConfig, ctx: WorkerContext, hf_config: Any) -> Any:
    """The data source for this rank: ``.train`` (a stateful iterator of micro batches) and
    ``.eval_batches()`` (held-out batches of this rank)."""
    import training.data as data_package

    if hasattr(data_package, "open_data"):  # the data package owns every kind
        return data_package.open_data(job, rank=ctx.rank, world_size=ctx.world_size,
                                      vocab_size=hf_config.vocab_size)
    if job.data.kind != "synthetic":
        raise RuntimeError(f"data.kind {job.data.kind!r}: training.data.open_data is not available")
    return _InterimSynthetic(job, ctx.rank, ctx.world_size, hf_config.vocab_size)


class _InterimSynthetic:
    """Random ids until training.data provides ``open_data`` (interim; removed then).

    Step s's global batch depends only on (seed, s); rank r takes its contiguous slice."""

    def __init__(self, job: JobConfig, rank: int, world: int, vocab: int):
        self.job, self.rank, self.world, self.vocab, self.position = job, rank, world, vocab, 0
        self.train = self

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        t = self.job.train
        per_rank = t.global_batch_size // self.world
        step, k = divmod(self.position, per_rank // t.micro_batch_size)
        self.position += 1
        gen = torch.Generator().manual_seed(self.job.data.seed * 1_000_003 + step)
        rows = torch.randint(0, self.vocab, (t.global_batch_size, t.seq_len), generator=gen)
        ids = rows[self.rank * per_rank:][k * t.micro_batch_size:(k + 1) * t.micro_batch_size]
        return {"input_ids": ids, "labels": ids.clone()}

    def eval_batches(self) -> list[dict[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.job.data.seed - 1)
        ids = torch.randint(0, self.vocab, (self.job.train.micro_batch_size, self.job.train.seq_len), generator=gen)
        return [{"input_ids": ids, "labels": ids.clone()}]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def train(job: JobConfig, ctx: WorkerContext, *, data: Any = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Run the job on this worker; returns the run's summary (the same on every rank)."""
    on_gpu = job.parallel.use_gpu and torch.cuda.is_available()
    device = torch.device("cuda", ctx.local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    # Same seed on every rank: fully_shard keeps each rank's slice of ITS OWN full copy.
    torch.manual_seed(job.train.seed)
    model = build_model(job.model, seq_len=job.train.seq_len, on_gpu=on_gpu)
    hf_config = model.config
    mesh = build_mesh(job.parallel.strategy, job.parallel.workers_per_node, on_gpu)
    parallelize(model, mesh, strategy=job.parallel.strategy, on_gpu=on_gpu,
                activation_checkpointing=job.parallel.activation_checkpointing, compile=job.parallel.compile)
    optimizer = optim.build_optimizer(model, job.train)
    scheduler = optim.build_scheduler(optimizer, job.train)
    data = data if data is not None else open_data(job, ctx, hf_config)
    state = TrainerState(data=data.train, scheduler=scheduler)

    throughput = metrics.ThroughputModel.for_model(
        hf_config, seq_len=job.train.seq_len, tokens_per_step=job.tokens_per_step,
        world_size=ctx.world_size, device=metrics.device_name(on_gpu))
    log = metrics.MetricsLog(ctx.local_dir, enabled=ctx.rank == 0, storage=ctx.storage)
    timer = metrics.StepTimer()
    t = job.train
    accum = job.grad_accum_steps
    losses: list[float] = []

    before = evaluation.evaluate(model, data.eval_batches(), device=device, max_batches=job.eval.max_batches, step=state.step)
    if before:
        log.write(before)
    model.train()
    while state.step < t.max_steps:
        maybe_inject_fault(state.step, ctx.rank, ctx)
        timer.start()
        micro = [next(state.data) for _ in range(accum)]
        local_targets = sum(count_targets(b["labels"]) for b in micro)
        sums = torch.tensor([0.0, float(local_targets)], dtype=torch.float64, device=device)
        counts = sums[1:].clone()
        dist.all_reduce(counts)
        global_targets = max(1.0, float(counts.item()))
        compute_start = time.perf_counter()
        for batch in micro:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            token_loss = loss_sum(model, batch)
            (token_loss * (ctx.world_size / global_targets)).backward()
            sums[0] += token_loss.detach().double()
        grad_norm = optim.clip_gradients(model, t.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(on_gpu)
        compute_s = time.perf_counter() - compute_start
        dist.all_reduce(sums)
        loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        state.step += 1
        state.tokens_seen += job.tokens_per_step
        losses.append(loss)
        step_time = timer.stop()
        record = {"kind": "train", "step": state.step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens_seen": state.tokens_seen, "step_time_s": step_time, "compute_s": compute_s,
                  "peak_memory_gib": metrics.peak_memory_gib(on_gpu), **throughput.figures(step_time)}
        log.write(record)
        if state.step % t.log_every_n_steps == 0 or state.step == t.max_steps:
            log.print(metrics.progress_line(record, t.max_steps, timer.eta(t.max_steps - state.step)))
        if job.eval.every_n_steps and state.step % job.eval.every_n_steps == 0 and state.step < t.max_steps:
            figures = evaluation.evaluate(model, data.eval_batches(), device=device,
                                          max_batches=job.eval.max_batches, step=state.step)
            if figures:
                log.write(figures)
        if state.step % t.report_every_n_steps == 0 and state.step < t.max_steps:
            log.sync()
            ctx.report({k: v for k, v in record.items() if v is not None})

    after = evaluation.evaluate(model, data.eval_batches(), device=device, max_batches=job.eval.max_batches, step=state.step)
    if after:
        log.write(after)
    summary = {"kind": "summary", "steps": state.step, "tokens_seen": state.tokens_seen,
               "losses": losses, **evaluation.before_after(before, after)}
    log.write(summary)
    log.print(evaluation.eval_line(summary))
    log.close()
    ctx.report({"step": state.step, "loss": losses[-1] if losses else float("nan"),
                **{k: v for k, v in evaluation.before_after(before, after).items() if v is not None}})
    return summary


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry: rebuild the validated job config, then :func:`train`."""
    job = job_config_from_dict(loop_config["job"], loop_config.get("source", "<job config>"))
    train(job, ray_context(), argv=loop_config.get("argv"))
