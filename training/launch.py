"""The driver side: a TorchTrainer with ScalingConfig and RunConfig built from the job config.

Runs where ``python -m training`` runs (the RayJob's entrypoint on the head pod, or locally, where
``ray.init()`` starts a local cluster). The run lives at ``<storage_path>/<run_name>``: Ray
Train's checkpoints, ``metrics.jsonl`` and ``run.json`` side by side.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from training.config import JobConfig

# Driver environment variables the workers need too (fault injection, S3 endpoint for tests,
# report cadence): in a running cluster the actors do not inherit the driver's environment.
FORWARDED_ENV_PREFIXES = ("RAYTRAIN_", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "AWS_ENDPOINT_URL", "AWS_REGION",
                          "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "NCCL_")
DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), "ray_results")


def storage_location(job: JobConfig) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` for RunConfig.

    ``s3://`` goes through our own pyarrow S3 file system (it honours ``AWS_ENDPOINT_URL``), and
    then the path drops the scheme (pitfalls.md). Empty = Ray's default local directory.
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


def build_trainer(job: JobConfig, *, argv: list[str] | None = None) -> Any:
    """The TorchTrainer for ``job`` (not started)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.loop import train_loop_per_worker
    from training.parallel import backend_for

    p = job.parallel
    resources = {"CPU": p.cpus_per_worker}
    if p.use_gpu:
        resources["GPU"] = 1
    storage_path, storage_fs = storage_location(job)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": job.to_dict(), "source": job.source, "argv": list(argv or sys.argv)},
        torch_config=TorchConfig(backend=backend_for(p.use_gpu)),
        scaling_config=ScalingConfig(num_workers=p.num_workers, use_gpu=p.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=FailureConfig(max_failures=job.checkpoint.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=job.checkpoint.keep_last),
            worker_runtime_env={"env_vars": forwarded_env()},
        ),
    )


def run(job: JobConfig, *, argv: list[str] | None = None) -> int:
    """Fit the job; returns the process exit code (0 = succeeded)."""
    import ray

    if not ray.is_initialized():
        # RAY_ADDRESS (set in a RayJob) connects to the cluster; otherwise a local one starts.
        ray.init(runtime_env={"env_vars": forwarded_env()}, log_to_driver=True)
    trainer = build_trainer(job, argv=argv)
    try:
        result = trainer.fit()
    except Exception as err:  # TrainingFailedError and friends: one line, details in the logs
        print(f"training failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr, flush=True)
        return 1
    if getattr(result, "error", None):
        print(f"training failed: {result.error}", file=sys.stderr, flush=True)
        return 1
    print(f"run directory: {run_dir(job)}", flush=True)
    return 0
