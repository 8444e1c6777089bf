"""The training loop: ``train_loop_per_worker`` for Ray Train and :func:`train` underneath it.

One optimizer step = ``grad_accum_steps`` micro batches per rank. The loss of a step is the
token-weighted mean over the WHOLE global batch: each rank sums its token losses, the target
token count is all-reduced once per step, and backward runs on ``sum * world / global_count``
(FSDP averages gradients over ranks). So the numbers do not depend on how the global batch is
split over ranks and micro batches: 2 ranks give the losses of one process with the same batch.

One step's forward/backward is :func:`forward_backward`; :class:`training.metrics.LogWindow`
turns steps into figures. A step reads no device value on the host: its loss, token count and
gradient norm stay tensors until the window closes at a log step, where ONE synchronisation turns
every pending step into numbers (a ``.item()`` per step would stall the GPU queue each step).

The loop knows nothing of Ray beyond :class:`WorkerContext`; tests and benchmarks run
:func:`train` in plain processes (``local_context``) with the same code.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from training import contract, evaluation, health_gate, incidents, metrics, objectives, optim, transport, watchdog
from training.config import JobConfig, job_config_from_dict
from training.metric_sinks import open_metrics
from training import model as forward_fns
from training.model import build_model, export_config
from training.model_transforms.lora import lora_base_problem
from training.objectives import Objective, sft
from training.parallel import begin_micro_batch, build_mesh, end_accumulation, parallelize
from training.data.tokenizer import chat_format


def forward_backward(model: torch.nn.Module, micro: list[dict[str, torch.Tensor]], *, device: torch.device,
                     world_size: int, objective: Objective | None = None) -> torch.Tensor:
    """Accumulate the gradients of ``micro`` (this rank's micro batches of one step) under
    ``objective`` (training/objectives/; None: ``sft``).

    Returns ``[loss sum, units, *extra sums]`` of the GLOBAL batch as a float64 device tensor
    (one all-reduce; units: target tokens for sft, pairs for dpo); the host reads it only at a
    log step.
    """
    objective = objective or sft.SFT(forward_fns)
    local_units = float(sum(objective.units(b) for b in micro))  # the batch is still on the host
    global_units = torch.tensor([local_units], dtype=torch.float64, device=device)
    dist.all_reduce(global_units)
    scale = world_size / global_units.clamp(min=1.0)
    totals = torch.zeros(1 + len(objective.extra), dtype=torch.float64, device=device)
    for index, batch in enumerate(micro):
        begin_micro_batch(model, index, len(micro))
        loss, extra = objective.loss(model, batch, device)  # the host batch: indices and layout need no device read
        # FSDP averages gradients over ranks: scale so the result is d(global mean)/d(theta).
        (loss * scale.to(loss.dtype)).backward()
        totals += torch.cat([loss.detach().double().reshape(1), extra])
    end_accumulation(model, len(micro))
    sums = torch.cat([totals[:1], torch.tensor([local_units], dtype=torch.float64, device=device), totals[1:]])
    dist.all_reduce(sums)
    return sums


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
    in_ray: bool = False
    run_dir: str = ""
    """``<storage_path>/<run_name>`` (local path or ``s3://``): run.json lives there."""
    checkpoint_root: str = ""
    """Node-local folder where checkpoints are written before their upload."""
    checkpoint_report: Callable[[dict[str, Any], str, str], None] | None = None
    """How a written checkpoint folder travels on (None: Ray's report inside Ray)."""
    local_world_size: int | None = None
    """Workers on this node (Ray's placement); None outside Ray, where it is not known."""
    uploads_in_flight: Callable[[], int] | None = None
    """Checkpoint uploads still running or queued (None: Ray's own count inside Ray)."""


def ray_context(run_dir: str = "") -> WorkerContext:
    """The context inside a Ray Train worker (the process group is already initialised)."""
    import ray.train

    from training.checkpointing import local_checkpoint_root
    from training.run_logs import scratch_key

    ctx = ray.train.get_context()
    storage = ctx.get_storage()
    key = scratch_key(run_dir, ctx.get_experiment_name())  # training/run_logs.py: by storage location
    local_dir = os.path.join(tempfile.gettempdir(), "raytrain-runs", key)
    return WorkerContext(rank=ctx.get_world_rank(), world_size=ctx.get_world_size(),
                         local_rank=ctx.get_local_rank(), storage=storage, local_dir=local_dir,
                         report=lambda m: ray.train.report(m), in_ray=True, run_dir=run_dir,
                         checkpoint_root=os.path.join(local_checkpoint_root(), key), local_world_size=ctx.get_local_world_size())


def local_context(local_dir: str, *, rank: int = 0, world_size: int = 1, run_dir: str = "") -> WorkerContext:
    """A context for a plain process (tests, benchmarks): initialises a gloo group if needed.

    With ``run_dir`` checkpoints are copied there the way Ray Train would upload them."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                init_method=f"file://{os.path.join(local_dir, 'pg-store')}")
    report = None
    if run_dir:
        from training.checkpointing import copy_report

        report = copy_report(run_dir)
    return WorkerContext(rank=rank, world_size=world_size, local_rank=rank, local_dir=local_dir, run_dir=run_dir,
                         checkpoint_root=os.path.join(local_dir, "checkpoints"), checkpoint_report=report)


def open_data(job: JobConfig, ctx: WorkerContext) -> tuple[Any, Any]:
    """This rank's DataBundle (``.train`` stateful stream, ``.eval_batches()``, ``.stats``,
    ``.eval_prompts``) and the tokenizer (None for synthetic data)."""
    from training.data import build_data

    tokenizer = None
    if job.data.kind != "synthetic":
        from training.data.tokenizer import load_tokenizer, tokenizer_location

        tokenizer = load_tokenizer(tokenizer_location(job.model))
    return build_data(job, tokenizer, rank=ctx.rank, world_size=ctx.world_size), tokenizer


def train(job: JobConfig, ctx: WorkerContext, *, data: Any = None, tokenizer: Any = None,
          resume_from: str = "", lease: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the job on this worker; returns the run's summary (the same on every rank). Rank 0's
    also carries, under :data:`training.contract.WORKER_FACTS`, the run.json fields the workers
    read (:data:`training.contract.WORKER_RECORD_FIELDS`): the driver merges them into the record
    once (:func:`training.launch.finish_record`). A worker writes metrics and its NCCL log, never
    run.json."""
    from training.run_logs import upload_nccl_log

    transport.prepare_worker(job.parallel.use_gpu)  # before ANY collective: NCCL opens its file once
    try:
        return _train(job, ctx, data=data, tokenizer=tokenizer, resume_from=resume_from, lease=lease)
    finally:
        upload_nccl_log(ctx.run_dir, ctx.rank, transport.NCCL_LOG_DIR if job.parallel.use_gpu else None)


def _train(job: JobConfig, ctx: WorkerContext, *, data: Any, tokenizer: Any, resume_from: str,
           lease: dict[str, Any] | None) -> dict[str, Any]:
    from training import checkpointing as ckpt_api
    from training.run_facts import gather
    from training.transport import hosts_from_evidence

    if job.parallel.use_gpu and not torch.cuda.is_available():
        raise RuntimeError("parallel.use_gpu = true but this worker sees no CUDA device "
                           "(check the pod's nvidia.com/gpu limit and the device plugin)")
    # Registered with the driver's progress watchdog (training/watchdog.py) before the model
    # build, data open, gather and restore: a rank stuck in any of them is then a hang it sees.
    progress = (watchdog.rank_progress(job.run_name, ctx.rank, None, ctx.local_dir) if ctx.in_ray
                else watchdog.Progress(None, ctx.rank, os.getpid()))
    on_gpu = job.parallel.use_gpu
    device = torch.device("cuda", ctx.local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    # The health gate, at every attempt's start: a node whose GPU is slow or has memory errors is
    # named in run.json and kept out of the next attempt before the group spends anything on it.
    if ctx.in_ray:
        health_gate.check(progress, on_gpu=on_gpu, device=device,
                             device_name=torch.cuda.get_device_name(device) if on_gpu else "")
    # Same seed on every rank: fully_shard keeps each rank's slice of ITS OWN full copy.
    torch.manual_seed(job.train.seed)
    model = build_model(job.model, seq_len=job.train.seq_len, on_gpu=on_gpu)
    hf_config, model_config = model.config, export_config(model)
    # The step's loss (training/objectives/): made before FSDP, so DPO's frozen reference of a
    # full fine-tune is a copy of the unsharded base, then sharded the same way below.
    objective = objectives.get(job.train.objective).make(model, job, forward_fns)
    mesh = build_mesh(job.parallel.strategy, job.parallel.workers_per_node, on_gpu, ctx.local_world_size)
    for module in (model, getattr(objective, "frozen", None)):
        if module is not None:
            parallelize(module, mesh, strategy=job.parallel.strategy, on_gpu=on_gpu,
                        activation_checkpointing=job.parallel.activation_checkpointing and module is model,
                        compile=job.parallel.compile, keep_gathered=job.parallel.keep_params_gathered,
                        reduce_dtype=job.parallel.grad_reduce_dtype, cpu_offload=job.parallel.cpu_offload,
                        accumulation=job.parallel.accumulation, checkpoint_every=job.parallel.checkpoint_every)
    optimizer = optim.build_optimizer(model, job.train, job.optim)
    scheduler = optim.build_scheduler(optimizer, job.train, job.optim)
    data, tokenizer = (data, tokenizer) if data is not None else open_data(job, ctx)
    evidence, refused = transport.transport_evidence(job, on_gpu)
    # What this run's workers read for run.json; rank 0 returns it with the summary.
    facts = gather(job, rank=ctx.rank, world_size=ctx.world_size, data=data, on_gpu=on_gpu, run_dir=ctx.run_dir)
    if facts is not None:
        facts.update(transport=evidence, hosts=hosts_from_evidence(evidence),
                     data=data.stats.to_dict() if hasattr(data, "stats") else {})
    if refused:
        return _returned(refuse(refused, ctx), facts)

    trainer = ckpt_api.TrainerState(data=data.train, scheduler=scheduler)
    ckpt = None
    if job.checkpoint.storage_path:
        if ctx.in_ray:
            ckpt_api.install_worker_handler(job.checkpoint.sigterm_grace_seconds, run_name=job.run_name)
        ckpt_api.restore(model=model, optimizer=optimizer, trainer=trainer, local_root=ctx.checkpoint_root,
                         resume_from=resume_from, device=device)
        if problem := lora_base_problem(model, trainer):
            return _returned(refuse(problem, ctx), facts)
        placed = incidents.node_ranks(ctx.rank, ctx.world_size, ctx.in_ray)
        if ctx.rank == 0 and ctx.run_dir:  # training/incidents.py: the driver sees no restart
            incidents.write_note(ctx.run_dir, incidents.NOTE_START, incidents.start_note(
                world_size=ctx.world_size, node_ranks=placed or {}, resumed_from_step=trainer.step,
                run_dir=ctx.run_dir, environ=os.environ))

        def noticed(step: int, info: Any, seconds: float) -> None:
            if ctx.rank == 0 and ctx.run_dir:
                incidents.write_note(ctx.run_dir, incidents.NOTE_NOTICE, incidents.notice_note(
                    step=step, info=info, seconds=seconds, world_size=ctx.world_size))
            # the steps up to the notice, this one included, reach storage before the node goes
            for row in window.close(metrics.peak_memory_gib(on_gpu)):
                log.write(row)
            log.sync()

        ckpt = ckpt_api.CheckpointManager(
            model=model, optimizer=optimizer, trainer=trainer, local_root=ctx.checkpoint_root, run_name=job.run_name,
            every_n_steps=job.checkpoint.every_n_steps, report=ctx.checkpoint_report, device=device,
            model_config=model_config, uploads_in_flight=ctx.uploads_in_flight,
            lease=ckpt_api.Lease(**lease) if lease else None, every_minutes=job.checkpoint.every_minutes,
            on_notice=noticed)
    # Restored: each finished step from here goes to the watchdog; no wait.
    progress.started(trainer.step)

    # LoRA (a frozen base): the MFU counts the FLOPs a LoRA step executes; a DTensor's numel()
    # is its global size
    frozen = any(not p.requires_grad for p in model.parameters())
    throughput = metrics.ThroughputModel.for_model(
        hf_config, seq_len=job.train.seq_len, tokens_per_step=job.tokens_per_step,
        world_size=ctx.world_size, device=metrics.device_name(on_gpu),
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad) if frozen else None)
    log = open_metrics(job, ctx)  # metrics.jsonl, Prometheus, ...: training/metric_sinks/
    # The global batch is the job's at every size: an elastic run at fewer workers accumulates
    # more micro batches (training/config.py checked that it divides at every size).
    t, accum = job.train, job.accum_steps_at(ctx.world_size)
    steps: list[dict[str, Any]] = []

    def held_out() -> dict[str, Any] | None:
        figures = evaluation.evaluate(model, data.eval_batches(), device=device,
                                      max_batches=job.eval.max_batches, step=trainer.step, objective=objective)
        if figures and job.eval.exact_match and tokenizer is not None:
            # The model's own stop tokens: its generation config's eos ids, the tokenizer's eos
            # and the end-of-turn token its chat template closes answers with.
            stop = chat_format(tokenizer, getattr(model, "generation_config", None)).stop_ids
            figures.update(evaluation.exact_match(model, data.eval_prompts, device=device, stop_ids=stop,
                                                  decode=tokenizer.decode) or {})
        if figures:
            log.write(figures)
        return figures

    def benchmarks() -> dict[str, Any] | None:
        """The benchmark tasks (``eval.benchmarks``), sharded over the ranks."""
        if not job.eval.benchmarks:
            return None
        stop = chat_format(tokenizer, getattr(model, "generation_config", None)).stop_ids
        result = evaluation.benchmark(model, tokenizer, job.eval.benchmarks, device=device, rank=ctx.rank,
                                      world_size=ctx.world_size, max_questions=job.eval.benchmark_max_questions,
                                      stop_ids=stop, step=trainer.step)
        log.write(evaluation.benchmark_row(result))
        return result

    # A resumed run keeps the figures measured before ANY training (stored in the trainer state).
    before = trainer.extra.get("eval_before") if trainer.restored_from else None
    if before is None:
        before = held_out()
        trainer.extra["eval_before"] = before
    bench_before = trainer.extra.get("benchmarks_before") if trainer.restored_from else None
    if bench_before is None:
        bench_before = benchmarks()  # the base model's scores
        trainer.extra["benchmarks_before"] = bench_before
    model.train()
    stopped = False
    window = metrics.LogWindow(throughput, on_gpu=on_gpu, objective=objective)
    while trainer.step < t.max_steps and not stopped:
        micro = [data.train.next_batch() for _ in range(accum)]
        sums = forward_backward(model, micro, device=device, world_size=ctx.world_size, objective=objective)
        grad_norm = optim.clip_gradients(model, t.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.step += 1
        trainer.tokens_seen += job.tokens_per_step
        step, last = trainer.step, trainer.step == t.max_steps
        window.add({contract.KIND: contract.KIND_TRAIN, contract.STEP: step, contract.LR: lr,
                    contract.TOKENS_SEEN: trainer.tokens_seen}, sums, grad_norm)
        if ckpt is not None:
            with window.overhead(due=ckpt.due(step, max_steps=t.max_steps)):
                # the checkpoint report carries the loss of the last logged step (no host sync here)
                stopped = ckpt.step_end(step, {contract.LOSS: steps[-1][contract.LOSS] if steps else None},
                                        max_steps=t.max_steps)
        evaluated = bool(job.eval.every_n_steps and step % job.eval.every_n_steps == 0 and not last)
        if evaluated:
            with window.overhead():
                held_out()
        # Ray Train handles reports in order: a metrics-only report after an ASYNC checkpoint
        # report waits for that upload. With checkpoints the metrics travel in metrics.jsonl
        # and with each checkpoint's own report; without, a metrics-only report is harmless.
        sync_now = step % t.report_every_n_steps == 0 and not last  # metrics.jsonl to storage
        report_now = sync_now and ckpt is None
        if step % t.log_every_n_steps == 0 or last or stopped or sync_now:
            rows = window.close(metrics.peak_memory_gib(on_gpu))
            for row in rows:
                log.write(row)
            steps.extend(rows)
            log.checkpoints(ckpt.timings if ckpt is not None else ())
            log.print(metrics.progress_line(rows[-1], t.max_steps, (window.last_step_s or 0.0) * (t.max_steps - step)))
            if sync_now:  # booked as overhead of the next window
                with window.overhead():
                    log.sync()
                    if report_now:
                        ctx.report({k: v for k, v in rows[-1].items() if v is not None})
        progress.step(step, heavy=evaluated or (ckpt is not None and ckpt.last_saved_step == step))

    after = None if stopped else held_out()  # the SIGTERM grace period is for the checkpoint
    bench_after = None if stopped else benchmarks()
    figures = evaluation.before_after(before, after)
    if ckpt is not None:
        ckpt.finish(trainer.step, {contract.LOSS: steps[-1][contract.LOSS] if steps else float("nan"), **figures})
        log.checkpoints(ckpt.timings)  # the writes that ended after the last step
    summary = {contract.KIND: contract.KIND_SUMMARY, "steps": trainer.step, contract.TOKENS_SEEN: trainer.tokens_seen,
               "losses": [e[contract.LOSS] for e in steps], "stopped_by_signal": stopped,
               "resumed_from": trainer.restored_from, **figures}
    if ckpt is not None and job.checkpoint.export_hf and not stopped:
        from training.checkpointing.export import export_on_workers

        summary.update(export_on_workers(model, ctx, model_config, job))
    log.write(summary)
    log.print(evaluation.eval_line(figures, stopped=stopped))
    if bench_after:
        log.print(evaluation.benchmark_line(bench_before, bench_after))
    log.close()
    if facts is not None:
        facts.update(throughput=contract.throughput_summary(steps), eval={"before": before, "after": after},
                     benchmarks={"before": bench_before, "after": bench_after} if job.eval.benchmarks else None,
                     objective=objectives.settings(job.train.objective, job.train.objective_options),
                     exports=summary.get(contract.EXPORTS, {}),
                     checkpoints=[{"step": x.step, "stall_s": x.stall_s, "write_s": x.write_s} for x in ckpt.timings]
                     if ckpt is not None else [])
    if ckpt is None:  # with checkpoints the final checkpoint's report carries these figures
        ctx.report({"step": trainer.step, "stopped_by_signal": stopped,
                    **{k: v for k, v in figures.items() if v is not None}})
    return _returned(summary, facts)


def refuse(reason: str, ctx: WorkerContext) -> dict[str, Any]:
    """End the run before training (the transport gate refused it), terminally, in the summary
    row the workers return, never raised: Ray would retry an exception ``max_failures`` times and
    a retry cannot change the transport. The driver reads the reason from the summary row and
    fails the run with this one line (:func:`training.verdict.outcome`)."""
    summary = {contract.KIND: contract.KIND_SUMMARY, "steps": 0, contract.REFUSED: reason}
    log = metrics.MetricsLog(ctx.local_dir, enabled=ctx.rank == 0, storage=ctx.storage)
    log.write(summary)
    log.print(f"refused: {reason}")
    log.close()
    return summary


def _returned(summary: dict[str, Any], facts: dict[str, Any] | None) -> dict[str, Any]:
    """What :func:`train` hands back: the summary row (as logged), plus rank 0's facts."""
    return {**summary, contract.WORKER_FACTS: facts} if facts is not None else summary


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's per-worker entry: rebuild the validated job config, then :func:`train`. Its
    return value on rank 0 reaches the driver as ``Result.return_value`` (None: the data was
    refused, the driver reads the markers)."""
    from training.metrics import quiet_worker_console

    quiet_worker_console()  # Ray's per-report lines go to the log files only
    cwd = loop_config.get("cwd", "")
    if cwd and os.path.isdir(cwd):  # same machine as the driver (local runs); in a cluster the
        os.chdir(cwd)               # runtime env's working_dir is already the cwd
    job = job_config_from_dict(loop_config["job"], loop_config.get("source", "<job config>"))
    transport.prepare_worker(job.parallel.use_gpu)  # before ANY collective (agree_on_data below is the first)
    ctx = ray_context(loop_config.get("run_dir", ""))
    # Data first: a data error is deterministic, so it must end the run, not be retried by Ray
    # (training/data/__init__.py: the ranks agree, the failed ones leave a marker, all return).
    from training.data import DataError
    from training.data import agree_on_data, storage_writer

    data = tokenizer = error = None
    try:
        data, tokenizer = open_data(job, ctx)
    except DataError as err:
        error = err
    device = torch.device("cuda", ctx.local_rank) if job.parallel.use_gpu else torch.device("cpu")
    writer = storage_writer(ctx.storage, loop_config.get("data_error_token", "run"), ctx.rank)
    if not agree_on_data(error, rank=ctx.rank, device=device, write=writer):
        return None
    return train(job, ctx, data=data, tokenizer=tokenizer, resume_from=loop_config.get("resume_from", ""),
                 lease=loop_config.get("lease"))
