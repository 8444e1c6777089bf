"""The job config's allowed values, its error type and the small rules its sections share.
Standard library only, like training/config.py; it imports nothing of the job config itself, so
the sections (config_sections.py) and the model checks (model_config.py) both build on it
without importing each other back.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from spec_schema import FieldError, SchemaError

STRATEGIES = ("full_shard", "hybrid_shard", "no_shard")
FILE_KINDS = tuple(sorted(p.stem for p in (Path(__file__).parent / "data" / "formats").glob("*.py")
                          if not p.stem.startswith("_")))
"""The data formats: one file each in training/data/formats/, named by its kind (the registry)."""
DATA_KINDS = ("synthetic", *FILE_KINDS)
BAD_RECORD_POLICIES = ("error", "skip")
BENCHMARK_DIR = Path(__file__).parent / "assets" / "benchmarks"
"""The tiny benchmark tasks the project ships: ``<name>.jsonl`` each (training/evaluation.py)."""
SHIPPED_BENCHMARKS = tuple(sorted(p.stem for p in BENCHMARK_DIR.glob("*.jsonl")))
BENCHMARK_METRICS = ("acc", "acc_norm", "exact_match")
"""lm-evaluation-harness's names: multiple choice gives acc and acc_norm, generation exact_match."""


def benchmark_task(entry: str) -> tuple[str, Path]:
    """``(task name, file)`` of one ``eval.benchmarks`` entry: a shipped task's name, or a
    ``.jsonl`` file (its name without the suffix is the task's)."""
    if entry in SHIPPED_BENCHMARKS:
        return entry, BENCHMARK_DIR / f"{entry}.jsonl"
    return Path(entry).stem, Path(entry)
OVERLONG_POLICIES = ("truncate", "refuse")
ON_EXISTING_RUN = ("resume", "refuse")
TRANSPORTS = ("any", "efa", "socket", "single-node")
DTYPES = ("auto", "bfloat16", "float32")
INT32_MAX = 2**31 - 1
"""The RayJob's ``activeDeadlineSeconds``, ``backoffLimit`` and ``ttlSecondsAfterFinished`` are
``format: int32`` in KubeRay v1.7.0's CRD (config/crd/bases/ray.io_rayjobs.yaml): the API server
refuses a larger value at ``kubectl apply``."""
TORCH_SEED_RANGE = (-(2**63), 2**64 - 1)
"""What ``torch.manual_seed`` accepts (torch 2.13 torch/random.py: "must be within the inclusive
range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff]"; outside, a RuntimeError in the workers)."""
REDUCE_DTYPES = ("float32", "bfloat16")
ACCUMULATIONS = ("sharded", "local")
"""``parallel.accumulation``: gradients reduce-scattered every micro batch, or summed unsharded
on each rank and reduce-scattered once per step (training/parallel.py ``begin_micro_batch``)."""
PLAN_MODES = ("as_written", "auto")
"""``parallel.plan``: run the file's plan, or let the operator CLI's plan search fill every plan
setting ``parallel.pinned`` does not name (raytrain_eks/planning/plan_search.py)."""
PLAN_SETTINGS = ("strategy", "accumulation", "activation_checkpointing", "checkpoint_every", "keep_params_gathered",
                 "grad_reduce_dtype", "cpu_offload", "compile", "micro_batch_size")
"""The settings the plan search chooses (``micro_batch_size`` is ``train.micro_batch_size``)."""
NO_DECAY_RULES = ("1d", "none")
"""``optim.no_decay``: which parameters AdamW does not decay (training/optim.py)."""
ADAMW_KERNELS = ("auto", "fused", "foreach", "for_loop")
"""``optim.kernel``: torch.optim.AdamW's implementation (``fused=``, ``foreach=``, neither)."""
LR_SCHEDULES = ("cosine", "linear", "constant")
"""``optim.schedule``: the learning rate's shape after the linear warm-up (training/optim.py)."""


S3_URI = re.compile(r"s3://[^/]+(/.*)?")
"""An ``s3://`` value: a bucket (or the placeholder the charts fill in), then an optional key."""


def s3_problem(section: Any, *names: str) -> None:
    """Each named ``s3://`` field names a bucket (a bare ``s3://`` would fail deep in the job)."""
    for name in names:
        value = getattr(section, name)
        if value.startswith("s3://") and not S3_URI.fullmatch(value):
            raise FieldError(name, value, "is not s3://bucket/prefix (a bucket name, then the key prefix)")


class JobConfigError(SchemaError):
    """A user error in a job config; ``str(err)`` is the one line to print."""


def positive(section: Any, *names: str, allow_zero: bool = False) -> None:
    """Each named field of ``section`` is > 0 (>= 0 with ``allow_zero``)."""
    for name in names:
        value = getattr(section, name)
        if value < 0 or (value == 0 and not allow_zero):
            raise FieldError(name, value, "must be >= 0" if allow_zero else "must be > 0")


def one_of(section: Any, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(section, name)
    if value not in allowed:
        raise FieldError(name, value, f"is not allowed (allowed: {', '.join(allowed)})")


MLFLOW_ARN_FORM = "arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>"
MLFLOW_PARTITIONS = ("aws", "aws-us-gov")


def tracking_uri_problem(uri: str) -> str | None:
    """Why the driver cannot log to this MLflow tracking URI through the REST API
    (training/mlflow_rest.py), or None: ``http(s)://host[:port]`` or a SageMaker managed MLflow
    tracking server ARN (:data:`MLFLOW_ARN_FORM`, signed with SigV4)."""
    if uri.startswith(("http://", "https://")):
        return None if uri.split("://", 1)[1].strip("/") else "names no host"
    if not uri.startswith("arn:"):
        return f"is not http(s)://host[:port] nor a SageMaker MLflow ARN ({MLFLOW_ARN_FORM})"
    parts = uri.split(":")
    if len(parts) < 6 or parts[2] != "sagemaker" or not parts[5].startswith("mlflow-tracking-server/") or not parts[3]:
        return f"is not a SageMaker MLflow tracking server ARN ({MLFLOW_ARN_FORM})"
    if parts[1] not in MLFLOW_PARTITIONS:
        return f"partition {parts[1]!r} is not supported ({', '.join(MLFLOW_PARTITIONS)})"
    return None
