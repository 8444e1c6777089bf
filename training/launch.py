"""The driver side: a TorchTrainer with ScalingConfig and RunConfig built from the job config.

Runs where ``python -m training`` runs (the RayJob's entrypoint on the head pod, or locally, where
``ray.init()`` starts a local cluster). The run lives at ``<storage_path>/<run_name>``: Ray
Train's checkpoints, ``metrics.jsonl`` and ``run.json`` side by side.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import uuid
from typing import Any, Callable, Mapping

from training import contract, incidents, metric_sinks, run_logs, verdict, watchdog
from training.config import JobConfig
from training.contract import driver_exit_code, run_time_limit_seconds
from training.data import one_line, read_data_errors
from training.run_facts import NCCL_ENV_PREFIXES
from training.run_record import RunRecord, exposed_comm_handed
from training.storage import RunStorage
from training.verdict import outcome

# Driver environment variables the workers need too (the job's RAYTRAIN_* settings, S3 endpoint for tests,
# report cadence): in a running cluster the actors do not inherit the driver's environment.
FORWARDED_ENV_PREFIXES = (contract.ENV_PREFIX, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "AWS_ENDPOINT_URL", "AWS_REGION",
                          "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                          "AWS_SESSION_TOKEN", "AWS_PROFILE")
SUBMITTED_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor on a submitted job's driver: JSON whose ``runtime_env`` is the
job's own (the RayJob's runtimeEnvYAML), the parent of every actor's runtime env."""
COLLECTIVE_TIMEOUT_S = 600
"""TorchConfig ``timeout_s``: how long a collective may wait before the process group fails it
(NCCL's watchdog aborts; Ray restarts the workers up to ``checkpoint.max_failures``). Ray's
default is 1800 s: a rank lost in a collective held every GPU of the job for half an hour. The
longest legitimate wait is one rank reaching a collective late (a model or checkpoint still
loading on it), minutes, not half an hour."""
DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), "ray_results")


def run_storage(job: JobConfig) -> RunStorage:
    """The job's run storage (:mod:`training.storage`); empty = Ray's default local directory."""
    return RunStorage(job.checkpoint.storage_path or DEFAULT_STORAGE)


def storage_location(job: JobConfig) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` for RunConfig.

    ``s3://`` goes through our own pyarrow S3 file system (it honours ``AWS_ENDPOINT_URL``), and
    then the path drops the scheme (Ray Train's rule for a custom ``storage_filesystem``); a
    shared or local directory is its path.
    """
    storage = run_storage(job)
    if storage.kind == "s3":
        from training.storage.files import s3_filesystem

        return storage.path, s3_filesystem()
    return storage.path, None


def run_dir(job: JobConfig) -> str:
    """``<storage_path>/<run_name>`` as a URI (``s3://...`` or a path)."""
    return run_storage(job).run(job.run_name)


def job_network_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's OWN NCCL_*/FI_* variables (:data:`training.run_facts.NCCL_ENV_PREFIXES`).

    In a submitted job (a RayJob) the driver runs on the head pod, whose NCCL/libfabric
    settings (the image's, for a CPU node) are not the job's: the GPU pods set their own, and a
    forwarded head value would override them. The job's own are those of its runtime env, which
    Ray's job supervisor hands the driver in :data:`SUBMITTED_JOB_ENV` (ray 2.58.0,
    dashboard/modules/job/job_supervisor.py ``_get_driver_env_vars``). Outside a submitted job
    the driver's environment is the job's."""
    return {k: v for k, v in job_own_env(environ).items() if k.startswith(NCCL_ENV_PREFIXES)}


def job_own_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's own variables: its runtime env's in a submitted job (:data:`SUBMITTED_JOB_ENV`),
    else the driver's environment."""
    if SUBMITTED_JOB_ENV in environ:
        try:
            own = (json.loads(environ[SUBMITTED_JOB_ENV]).get("runtime_env") or {}).get("env_vars") or {}
        except (ValueError, AttributeError):
            own = {}
    else:
        own = environ
    return {k: str(v) for k, v in own.items()}


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the driver hands its workers: :data:`FORWARDED_ENV_PREFIXES` and the job's own
    network variables (:func:`job_network_env`)."""
    environ = os.environ if environ is None else environ
    # The health gate's injected readings belong to one node (its raylet's environment), never to every worker.
    return {**{k: v for k, v in environ.items()
               if k.startswith(FORWARDED_ENV_PREFIXES) and k != contract.ENV_GATE_DEVICE},
            **job_network_env(environ)}


ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The CUDA caching allocator's settings, read once at its first use in this order (torch 2.13
c10/cuda/CUDAAllocatorConfig.h ``instance()``: ``PYTORCH_CUDA_ALLOC_CONF``, else
``PYTORCH_ALLOC_CONF``; c10/core/AllocatorConfig.h: the latter is the new generic name)."""
GPU_ALLOCATOR_SETTINGS = "expandable_segments:True"
"""Segments that grow in place instead of a new ``cudaMalloc`` per size class: FSDP2's gathered
parameters and reduce-scatter buffers change size layer by layer, and fixed segments fragment
around them (the headroom the planner allows as fragmentation). torchtitan's launcher sets the
same. Its saving on an L4 needs a GPU to measure (docs/gpu-step.md)."""


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings for GPU workers: the job's own (:func:`job_own_env`, not the head
    pod's) when it sets either variable, passed on as they are (ours, read first, would hide its
    ``PYTORCH_ALLOC_CONF``), else expandable segments."""
    job = job_own_env(environ)
    own = {k: job[k] for k in ALLOCATOR_ENV if k in job}
    return own or {ALLOCATOR_ENV[0]: GPU_ALLOCATOR_SETTINGS}


def worker_env(job: JobConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The workers' environment: the forwarded driver variables and, on GPU, NCCL's debug log
    settings from process start (the worker creates the folder before its first collective:
    :func:`training.transport.prepare_worker`) and the CUDA allocator's (:func:`allocator_env`),
    which must be there before the worker's first CUDA allocation."""
    environ = os.environ if environ is None else environ
    env = forwarded_env(environ)
    if job.parallel.use_gpu:
        from training.transport import NCCL_LOG_DIR, nccl_debug_env

        from training.watchdog import flight_recorder_env

        env.update(nccl_debug_env(NCCL_LOG_DIR, env))
        env.update(allocator_env(environ))
        # NCCL's flight recorder: its dump on a collective timeout lands in the same node-local
        # folder, where a hang's probe copies it into <run>/incidents/ (training/watchdog.py).
        env.update({k: v for k, v in flight_recorder_env(NCCL_LOG_DIR).items() if k not in env})
    return env


def lease_holder(environ: Mapping[str, str] | None = None) -> str:
    """Who this driver is, for a second trainer's refusal: the Ray job (KubeRay submits a RayJob
    as ``<RayJob name>-<suffix>``: ray 2.58 job_supervisor.py puts the submission id in the
    driver's job config metadata), the host (on EKS the head pod) and the pid."""
    environ = os.environ if environ is None else environ
    try:
        submission = (json.loads(environ.get(SUBMITTED_JOB_ENV, "{}")).get("metadata") or {}).get("job_submission_id")
    except (ValueError, AttributeError):
        submission = None
    who = f"Ray job {submission}" if submission else "python -m training"
    return f"{who} on {socket.gethostname()} (pid {os.getpid()})"


def connect_ray() -> None:
    """``ray.init`` once: RAY_ADDRESS (set in a RayJob) connects to the cluster; otherwise a local
    one starts. A submitted job (`ray job submit`, KubeRay) already carries its runtime env, and
    Ray refuses a second one that repeats its keys: ours is forwarded only outside a submitted job."""
    import ray

    if not ray.is_initialized():
        submitted = SUBMITTED_JOB_ENV in os.environ
        ray.init(**({} if submitted else {"runtime_env": {"env_vars": forwarded_env()}}), log_to_driver=True)


def build_trainer(job: JobConfig, *, resume_from: str = "", data_error_token: str = "run",
                  lease: dict[str, Any] | None = None, callbacks: list[Any] | None = None) -> Any:
    """The TorchTrainer for ``job`` (not started); ``resume_from``: a checkpoint URI for a new run;
    ``lease``: this attempt's (:meth:`training.checkpointing.Lease.to_dict`), checked by the workers;
    ``callbacks``: Ray Train ``UserCallback``s run by its controller (the watchdog's notes)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.metrics import ray_train_logging_config
    from training.loop import train_loop_per_worker
    from training.parallel import backend_for

    # Ray Train would chdir each worker into its trial folder: the job config's relative paths
    # (data, tokenizer) must keep resolving against the job's working directory.
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    # Ray Train's PreemptionWatcher stays on (its default): it is how a node drain's notice
    # reaches the workers, which then checkpoint at the step boundary (training/checkpointing/manager.py).
    p = job.parallel
    resources = {"CPU": p.cpus_per_worker}
    if p.use_gpu:
        resources["GPU"] = 1
    storage_path, storage_fs = storage_location(job)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": job.to_dict(), "source": job.source, "run_dir": run_dir(job),
                           "resume_from": resume_from, "cwd": os.getcwd(), "data_error_token": data_error_token,
                           "lease": lease},
        torch_config=TorchConfig(backend=backend_for(p.use_gpu, p.cpu_offload), timeout_s=COLLECTIVE_TIMEOUT_S),
        scaling_config=scaling_config(job, resources),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            # a node drained with notice restarts on Ray Train's own preemption budget
            # (FailureConfig.max_preemption_failures, unlimited by default), not on max_failures
            failure_config=FailureConfig(max_failures=job.checkpoint.max_failures,
                                         controller_failure_limit=placement_retries()),
            checkpoint_config=CheckpointConfig(num_to_keep=job.checkpoint.keep_last),
            worker_runtime_env={"env_vars": worker_env(job)},
            logging_config=ray_train_logging_config(),  # INFO to the log files only
            callbacks=list(callbacks or []),
        ),
    )


REPLACEMENT_WAIT_S = 1200.0
"""The longest a run waits, over its whole life, for its workers to be placed (a node kept out by
the health gate or lost, and no capacity left for the group): a new GPU node joins an EKS cluster
in about 5-10 minutes (assumed), this allows twice that. :data:`contract.ENV_REPLACEMENT_WAIT_S`
overrides it."""
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 60.0
"""Ray Train's wait for a worker group's placement (ray 2.58 ``train/v2/_internal/constants.py``)."""


class NotPlaced(RuntimeError):
    """The run's workers could not be placed again within :data:`REPLACEMENT_WAIT_S`."""


def placement_retries(environ: Mapping[str, str] | None = None) -> int:
    """Ray Train's ``FailureConfig.controller_failure_limit``: a worker group that cannot be placed
    within the start timeout is a controller failure that Ray Train retries (ray 2.58
    ``failure_handling/default.py``: ``WorkerGroupStartupTimeoutError`` is retryable), WITHOUT a
    limit by default (-1): a run whose node was kept out and never replaced would wait for its
    deadline with every other GPU held. The first try and the retries together make
    :data:`REPLACEMENT_WAIT_S` (the limit counts retries, and Ray Train raises on the one past it;
    the count is the run's, never reset)."""
    return placement_tries(environ)[0] - 1


def placement_tries(environ: Mapping[str, str] | None = None) -> tuple[int, float]:
    """``(tries, start timeout)``: how many start timeouts make the replacement wait."""
    environ = os.environ if environ is None else environ
    try:
        wait = float(environ.get(contract.ENV_REPLACEMENT_WAIT_S) or REPLACEMENT_WAIT_S)
        timeout = max(float(environ.get(START_TIMEOUT_ENV) or DEFAULT_START_TIMEOUT_S), 1.0)
    except ValueError:
        wait, timeout = REPLACEMENT_WAIT_S, DEFAULT_START_TIMEOUT_S
    return max(1, math.ceil(wait / timeout)), timeout


def unplaced_reason(error: BaseException, found: list[dict[str, Any]], environ: Mapping[str, str] | None = None) -> str:
    """One line for a run that ended because its workers could not be placed again ("" for any
    other error): the node the health gate kept out (or lost) and the bound waited."""
    # Ray Train's ControllerError keeps the controller's own exception (ray 2.58
    # ``train/v2/api/exceptions.py``); its text says only "The worker group startup timed out".
    inner = getattr(error, "controller_failure", None)
    if type(inner).__name__ != "WorkerGroupStartupTimeoutError" and "startup timed out" not in str(error):
        return ""
    tries, timeout = placement_tries(environ)
    kept = [i for i in found if i.get("kind") in (incidents.HEALTH_GATE, incidents.NODE_LOST, incidents.PREEMPTION)
            and i.get("resumed_from_step") is None]
    who = (f"{kept[-1]['kind']} of node {', '.join(kept[-1].get('nodes') or ['?'])}" if kept else "no fault recorded")
    return (f"no capacity for the worker group after {who}: not placed within {tries * timeout:.0f} s "
            f"({tries} x the {timeout:.0f} s start timeout; {contract.ENV_REPLACEMENT_WAIT_S})")


ELASTIC_RESIZE_INTERVAL_S = 60.0
"""Ray Train's ``elastic_resize_monitor_interval_s`` (its default): how often an elastic run below
its maximum looks for capacity that came back; a grow restarts the workers from the last
checkpoint, so checking more often than a checkpoint interval only loses steps."""


def scaling_config(job: JobConfig, resources: dict[str, float]) -> Any:
    """Ray Train's ScalingConfig: ``num_workers=(min, max)`` for an elastic job
    (``parallel.min_nodes``; ray 2.58 ``train/v2/api/config.py``), else the one size."""
    from ray.train import ScalingConfig

    p = job.parallel
    sizes = job.world_sizes
    interval = float(os.environ.get(contract.ENV_ELASTIC_RESIZE_S, ELASTIC_RESIZE_INTERVAL_S))
    return ScalingConfig(num_workers=(sizes[0], sizes[-1]) if job.elastic else p.num_workers, use_gpu=p.use_gpu,
                         resources_per_worker=resources, elastic_resize_monitor_interval_s=interval)


def _cluster_shape(job: JobConfig) -> dict[str, Any]:
    p = job.parallel
    return {"nodes": job.num_nodes, "world_size": p.num_workers,
            "gpus_per_node": p.workers_per_node if p.use_gpu else 0, "workers_per_node": p.workers_per_node,
            "world_sizes": list(job.world_sizes)}


def start_record(job: JobConfig, argv: list[str], where: str = "") -> RunRecord:
    """run.json's first write (status ``running``), by the driver, its only writer; ``where``:
    the run directory (default :func:`run_dir`)."""
    record = RunRecord(where or run_dir(job))
    record.start(job_config=job.to_dict(), is_infrastructure_check=job.is_infrastructure_check,
                 cluster=_cluster_shape(job), command=argv,
                 exposed_comm=exposed_comm_handed(job.checkpoint.storage_path, job.run_name))
    return record


def finish_record(record: RunRecord, *, returned: dict[str, Any] | None, error: BaseException | None = None,
                  data_errors: list[dict] | None = None) -> dict[str, Any]:
    """The driver's one merge and run.json's final write: how the run ended (the data markers,
    the error the fit raised, or the summary rank 0 returned) and the workers' facts
    (:data:`training.contract.WORKER_RECORD_FIELDS`); then the verdict and its exit code."""
    summary = dict(returned or {})
    facts = summary.pop(contract.WORKER_FACTS, None) or {}
    code = None
    if data_errors:
        # Deterministic bad input: one line, exit 2, not retried (the workers returned).
        status, message, code = "failed", one_line(data_errors), 2
        failure = {contract.FAILURE_STAGE: contract.STAGE_DATA, "rank": data_errors[0].get("rank"),
                   "error_class": data_errors[0].get("error_class"), "error": message}
    elif error is not None:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        status, message = "failed", f"{type(error).__name__}: {first}"
        # The cause chain and Ray's text of the worker errors name the real failure behind a wrapper.
        text = verdict.describe_exception(error) + " " + str(error)
        failure = {contract.FAILURE_STAGE: verdict.failure_stage(text), "error": message,
                   "error_class": type(error).__name__, "rank": None}
    else:
        status, message, _ = outcome(summary)
        failure = verdict.failure_of_summary(summary) or {}
    fields = {key: value for key, value in facts.items() if key in contract.WORKER_RECORD_FIELDS}
    fields.update(_incidents_and_cost(record, summary, fields))
    if failure:
        fields[contract.FAILURE] = failure
    # The exit code is the verdict's, except 2 (refused data); finish() gives a stop its 143.
    return record.finish(status=status, error=message, exit_code=code, **fields)


def _incidents_and_cost(record: RunRecord, summary: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``attempts`` and ``cost`` from the workers' notes (training/incidents.py); each
    drain notice's checkpoint becomes ONE ``preemption`` incident, absorbing the watchdog's
    incidents its drain caused (training/incidents.py ``absorb``). Never fails the record."""
    from datetime import datetime, timezone

    from training import incidents

    tokens = summary.get(contract.TOKENS_SEEN) or 0
    on_gpu = bool(((record.data.get("job_config") or {}).get("parallel") or {}).get("use_gpu"))
    try:
        found = incidents.summarize(record.run_dir, end=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                   on_gpu=on_gpu)
        if found["preemptions"]:  # one incident per drain: the node loss after its notice is folded in
            record.update(**{contract.INCIDENTS: incidents.absorb(incidents.of_record(record.data), found["preemptions"],
                                                                 found["notes"])})
        cost = incidents.cost_of(found["attempts"], end=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                tokens=int(tokens), incidents=incidents.of_record(record.data), environ=os.environ)
        return {"attempts": found["attempts"], contract.COST: cost}
    except Exception as err:  # noqa: BLE001 - storage hiccup: the record says so
        return {contract.COST: {"error": f"{type(err).__name__}: {err}"}}


def run_in_process(job: JobConfig, ctx: Any, *, argv: list[str] | None = None, **train_args: Any) -> dict[str, Any]:
    """The driver and the worker of ONE plain process (tests, benchmarks; no Ray): rank 0 starts
    the record, :func:`training.loop.train` runs, rank 0 finishes the record as :func:`run`
    does, in ``ctx.run_dir``. Returns the final record ({} on other ranks and without a run
    directory); never raises a training error."""
    from training.loop import train

    record = start_record(job, list(argv or sys.argv), ctx.run_dir) if ctx.rank == 0 and ctx.run_dir else None
    sinks = metric_sinks.open_driver(job, record.run_dir, record.data) if record is not None else None
    returned, error = None, None
    try:
        returned = train(job, ctx, **train_args)
    except Exception as err:  # noqa: BLE001 - the record says what failed, as run() does
        error = err
    if record is None:
        return {}
    final = finish_record(record, returned=returned, error=error)
    sinks.after_run(final)
    return final


def run(job: JobConfig, *, argv: list[str] | None = None, before_fit: Callable[[JobConfig], dict] | None = None) -> int:
    """Fit the job; returns the process exit code: the verdict's (training/verdict.py: 0 accepted,
    1 execution-failed, 3 rejected), 2 refused input (before start, or data the job cannot read),
    143 stopped by SIGTERM (resumable). ``before_fit``: run once the record exists, before the
    fit; its result is run.json's ``netcheck`` (training/netcheck/__init__.py ``before_training``)."""
    from training import checkpointing

    argv = list(argv or sys.argv)
    lease = None
    if job.checkpoint.storage_path:
        # One writer per run: taken before anything is restored or written, released at the end.
        lease = checkpointing.Lease(run=run_dir(job), attempt=uuid.uuid4().hex, holder=lease_holder())
        try:
            lease.acquire()
        except checkpointing.LeaseHeld as err:
            print(f"error: {job.source}: {err}", file=sys.stderr, flush=True)
            return 2
    try:
        return _run(job, argv, lease, before_fit)
    finally:
        if lease is not None:
            lease.release()


def _run(job: JobConfig, argv: list[str], lease: Any, before_fit: Callable[[JobConfig], dict] | None = None) -> int:
    """:func:`run` while this attempt holds the run's lease (None: no storage, no lease)."""
    from training import checkpointing

    resume_from = ""
    if job.checkpoint.storage_path:
        try:
            plan = checkpointing.plan_resume(storage_path=job.checkpoint.storage_path, run_name=job.run_name,
                                             on_existing_run=job.checkpoint.on_existing_run,
                                             max_steps=job.train.max_steps, world_size=job.parallel.num_workers,
                                             source=job.source)
        except checkpointing.ExistingRunError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return 2
        resume_from = plan.resume_from
        if resume_from:
            print(f"resuming {job.run_name} from step {plan.resume_step}: {resume_from}", flush=True)
    connect_ray()
    record = start_record(job, argv)
    sinks = metric_sinks.open_driver(job, run_dir(job), record.data)  # MLflow follows the run from here
    stop_flag = limit = None
    if job.checkpoint.storage_path:  # keep the reference: the flag actor lives as long as it
        stop_flag = checkpointing.forward_driver_sigterm(job.run_name, job.checkpoint.sigterm_grace_seconds)
        # The run's own wall-clock limit: KubeRay only marks an -on-cluster RayJob failed at its deadline.
        seconds = run_time_limit_seconds(job.rayjob.active_deadline_minutes, job.checkpoint.sigterm_grace_seconds)
        limit = checkpointing.stop_driver_after(seconds, f"time limit {seconds} s reached (rayjob.active_deadline_minutes "
                                                         f"{job.rayjob.active_deadline_minutes} less the stop wait)")
    heartbeat = checkpointing.keep_renewed(lease) if lease is not None else None
    token = uuid.uuid4().hex[:12]  # this attempt's data-error markers (training/data/__init__.py)
    returned, error, data_errors = None, None, []
    watch = watchdog.Watchdog(run_name=job.run_name, run_dir=run_dir(job), record=record, max_steps=job.train.max_steps,
                              world_size=job.parallel.num_workers, on_gpu=job.parallel.use_gpu,
                              eval_every=job.eval.every_n_steps, checkpoint_every=job.checkpoint.every_n_steps,
                              checkpoint_minutes=job.checkpoint.every_minutes,
                              stopping=checkpointing.stop_was_requested).start()
    try:
        if before_fit is not None:  # netcheck.run_first: a rejection fails the run (stage transport)
            record.update(netcheck=before_fit(job))
        result = build_trainer(job, resume_from=resume_from, data_error_token=token,
                               lease=lease.to_dict() if lease is not None else None,
                               callbacks=[watch.callback()]).fit()
        if getattr(result, "error", None):
            raise result.error
        data_errors = read_data_errors(run_dir(job), token)
        returned = result.return_value  # rank 0's summary and facts (None after a data refusal)
    except Exception as err:  # TrainingFailedError and friends: one line, details in the logs
        error = err
    watch.stop()  # its last look records the final attempt's errors before the record's last write
    reason = unplaced_reason(error, record.data.get(contract.INCIDENTS) or []) if error is not None else ""
    if reason:
        error = NotPlaced(reason)
    if heartbeat is not None:
        heartbeat.set()
    if limit is not None:
        limit.cancel()
    final = finish_record(record, returned=returned, error=error, data_errors=data_errors)
    sinks.after_run(final)  # the verdict to TensorBoard, MLflow's last metrics and status, ...
    del stop_flag
    if final.get("error"):
        print(f"{'error' if data_errors else 'training failed'}: {final['error']}", file=sys.stderr, flush=True)
    elif (returned or {}).get(contract.EXPORTED):
        print(f"exported: {returned[contract.EXPORTED]}", flush=True)
    print(f"run directory: {run_dir(job)} ({final['status']})", flush=True)
    judged = final.get("verdict") or {}
    # A failure's reason is the error line above: the verdict adds only its stage (one line per error).
    print("verdict: " + (f"EXECUTION-FAILED ({judged.get('stage')})" if judged.get("verdict") == verdict.EXECUTION_FAILED
                         else verdict.headline(judged)), flush=True)
    run_logs.copy_cluster_logs(run_dir(job))  # before the cluster goes: training/run_logs.py
    # its own time limit is a planned end: exit 0, or KubeRay would retry it (training/contract.py)
    return driver_exit_code(final["status"], final["exit_code"], checkpointing.time_limit_reached())
