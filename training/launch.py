"""The driver side: a TorchTrainer with ScalingConfig and RunConfig built from the job config.

Runs where ``python -m training`` runs (the RayJob's entrypoint on the head pod, or locally, where
``ray.init()`` starts a local cluster). The run lives at ``<storage_path>/<run_name>``: Ray
Train's checkpoints, ``metrics.jsonl`` and ``run.json`` side by side.
"""
from __future__ import annotations

import os
import sys
import uuid
from typing import Any

from training import contract, run_logs, verdict
from training.config import JobConfig
from training.data.failure import one_line, read_data_errors

# Driver environment variables the workers need too (fault injection, S3 endpoint for tests,
# report cadence): in a running cluster the actors do not inherit the driver's environment.
FORWARDED_ENV_PREFIXES = (contract.ENV_PREFIX, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "AWS_ENDPOINT_URL", "AWS_REGION",
                          "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                          "AWS_SESSION_TOKEN", "AWS_PROFILE", "NCCL_")
DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), "ray_results")


def storage_location(job: JobConfig) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` for RunConfig.

    ``s3://`` goes through our own pyarrow S3 file system (it honours ``AWS_ENDPOINT_URL``), and
    then the path drops the scheme (Ray Train's rule for a custom ``storage_filesystem``). Empty = Ray's default local directory.
    """
    path = job.checkpoint.storage_path or DEFAULT_STORAGE
    if path.startswith("s3://"):
        from training.data.remote import s3_filesystem

        return path[len("s3://"):].rstrip("/"), s3_filesystem()
    return os.path.abspath(path.removeprefix("file://")), None


def run_dir(job: JobConfig) -> str:
    """``<storage_path>/<run_name>`` as a URI (``s3://...`` or a local path)."""
    path = job.checkpoint.storage_path or DEFAULT_STORAGE
    if path.startswith("s3://"):
        return f"{path.rstrip('/')}/{job.run_name}"
    return os.path.join(os.path.abspath(path.removeprefix("file://")), job.run_name)


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def worker_env(job: JobConfig) -> dict[str, str]:
    """The workers' environment: the forwarded driver variables and, on GPU, NCCL's debug log
    settings from process start (the loop also creates the folder before NCCL's first use)."""
    env = forwarded_env()
    if job.parallel.use_gpu:
        from training.nccl_log import NCCL_LOG_DIR, nccl_debug_env

        env.update(nccl_debug_env(NCCL_LOG_DIR, env))
    return env


def build_trainer(job: JobConfig, *, argv: list[str] | None = None, resume_from: str = "",
                  data_error_token: str = "run") -> Any:
    """The TorchTrainer for ``job`` (not started); ``resume_from``: a checkpoint URI for a new run."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.console import ray_train_logging_config, without_preemption_watcher
    from training.loop import train_loop_per_worker
    from training.parallel import backend_for

    # Ray Train would chdir each worker into its trial folder: the job config's relative paths
    # (data, tokenizer) must keep resolving against the job's working directory.
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    without_preemption_watcher()  # training/console.py: its error line on every run
    p = job.parallel
    resources = {"CPU": p.cpus_per_worker}
    if p.use_gpu:
        resources["GPU"] = 1
    storage_path, storage_fs = storage_location(job)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": job.to_dict(), "source": job.source, "argv": list(argv or sys.argv),
                           "run_dir": run_dir(job), "resume_from": resume_from, "cwd": os.getcwd(),
                           "data_error_token": data_error_token},
        torch_config=TorchConfig(backend=backend_for(p.use_gpu)),
        scaling_config=ScalingConfig(num_workers=p.num_workers, use_gpu=p.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=job.checkpoint.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=job.checkpoint.keep_last),
            worker_runtime_env={"env_vars": worker_env(job)},
            logging_config=ray_train_logging_config(),  # INFO to the log files only
        ),
    )


def _cluster_shape(job: JobConfig) -> dict[str, Any]:
    p = job.parallel
    return {"nodes": job.num_nodes, "world_size": p.num_workers,
            "gpus_per_node": p.workers_per_node if p.use_gpu else 0, "workers_per_node": p.workers_per_node}


def _last_summary(job: JobConfig) -> dict[str, Any]:
    """The loop's final ``summary`` line from the run's metrics.jsonl ({} if there is none)."""
    import json

    from training.checkpointing.storage import filesystem_for

    try:
        fs, path = filesystem_for(f"{run_dir(job)}/metrics.jsonl")
        with fs.open_input_stream(path) as stream:
            lines = stream.read().decode("utf-8").splitlines()
    except (OSError, ValueError):
        return {}
    summaries = [json.loads(line) for line in lines if '"kind": "summary"' in line]
    return summaries[-1] if summaries else {}


def outcome(summary: dict[str, Any]) -> tuple[str, str | None, int]:
    """``(status, error, exit code)`` of a fit that returned, from the loop's summary row. A
    refusal (e.g. the transport gate) ends the workers normally, so Ray does not retry it."""
    if summary.get(contract.REFUSED):
        return "failed", summary[contract.REFUSED], 1
    if summary.get(contract.EXPORT_ERROR):
        return "failed", f"export: {summary[contract.EXPORT_ERROR]}", 1
    if summary.get("stopped_by_signal"):
        return "stopped", None, 143
    return "succeeded", None, 0


def run(job: JobConfig, *, argv: list[str] | None = None) -> int:
    """Fit the job; returns the process exit code: the verdict's (training/verdict.py: 0 accepted,
    1 execution-failed, 3 rejected), 2 refused input (before start, or data the job cannot read),
    143 stopped by SIGTERM (resumable)."""
    import ray

    from training import checkpointing
    from training.run_record import RunRecord, read_json

    argv = list(argv or sys.argv)
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
    if not ray.is_initialized():
        # RAY_ADDRESS (set in a RayJob) connects to the cluster; otherwise a local one starts.
        # A submitted job (`ray job submit`, KubeRay) already carries its runtime env, and Ray
        # refuses a second one that repeats its keys: forward ours only outside a submitted job.
        submitted = "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ
        ray.init(**({} if submitted else {"runtime_env": {"env_vars": forwarded_env()}}), log_to_driver=True)
    record = RunRecord(run_dir(job))
    record.start(job_config=job.to_dict(), is_infrastructure_check=job.is_infrastructure_check,
                 cluster=_cluster_shape(job), command=argv)
    stop_flag = None
    if job.checkpoint.storage_path:  # keep the reference: the flag actor lives as long as it
        stop_flag = checkpointing.forward_driver_sigterm(job.run_name, job.checkpoint.sigterm_grace_seconds)
    status, error, code = "succeeded", None, None
    failure: dict[str, Any] = {}
    token = uuid.uuid4().hex[:12]  # this attempt's data-error markers (training/data/failure.py)
    try:
        result = build_trainer(job, argv=argv, resume_from=resume_from, data_error_token=token).fit()
        if getattr(result, "error", None):
            raise result.error
        data_errors = read_data_errors(run_dir(job), token)
        if data_errors:
            # Deterministic bad input: one line, exit 2, not retried (the workers returned).
            status, error, code = "failed", one_line(data_errors), 2
            failure = {contract.FAILURE_STAGE: contract.STAGE_DATA, "rank": data_errors[0].get("rank"),
                       "error_class": data_errors[0].get("error_class"), "error": error}
            print(f"error: {error}", file=sys.stderr, flush=True)
        else:
            summary = _last_summary(job)
            status, error, code = outcome(summary)
            failure = verdict.failure_of_summary(summary) or {}
            if error:
                print(f"training failed: {error}", file=sys.stderr, flush=True)
    except Exception as err:  # TrainingFailedError and friends: one line, details in the logs
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        status, error = "failed", f"{type(err).__name__}: {first}"
        # The worker names the stage in the record; this is for failures it could not write.
        text = verdict.describe_exception(err) + " " + str(err)
        failure = {contract.FAILURE_STAGE: verdict.failure_stage(text), "error": error, "rank": None}
        print(f"training failed: {error}", file=sys.stderr, flush=True)
    if status == "succeeded" and _last_summary(job).get(contract.EXPORTED):
        print(f"exported: {_last_summary(job)[contract.EXPORTED]}", flush=True)
    try:
        record.data = read_json(record.uri)  # rank 0 added hosts, transport, throughput, eval
    except (OSError, ValueError):
        pass
    if failure and not (record.data.get(contract.FAILURE) or {}).get(contract.FAILURE_STAGE):
        record.data[contract.FAILURE] = failure
    # The exit code is the verdict's, except 2 (refused data); finish() gives a stop its 143.
    final = record.finish(status=status, error=error, exit_code=2 if code == 2 else None)
    del stop_flag
    print(f"run directory: {run_dir(job)} ({status})", flush=True)
    judged = final.get("verdict") or {}
    # A failure's reason is the error line above: the verdict adds only its stage (one line per error).
    print("verdict: " + (f"EXECUTION-FAILED ({judged.get('stage')})" if judged.get("verdict") == verdict.EXECUTION_FAILED
                         else verdict.headline(judged)), flush=True)
    run_logs.copy_cluster_logs(run_dir(job))  # before the cluster goes: training/run_logs.py
    return final["exit_code"]
