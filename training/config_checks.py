"""Validation of a job config: checks that need no model, data or cluster (those run in the
preflight and in the job). Standard library only, like training/config.py which re-exports
:class:`JobConfigError` and the allowed values from here.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

STRATEGIES = ("full_shard", "hybrid_shard", "no_shard")
DATA_KINDS = ("synthetic", "text", "jsonl", "chat")
BAD_RECORD_POLICIES = ("error", "skip")
OVERLONG_POLICIES = ("truncate", "refuse")
ON_EXISTING_RUN = ("resume", "refuse")
TRANSPORTS = ("any", "efa", "socket", "single-node")
DTYPES = ("auto", "bfloat16", "float32")
REDUCE_DTYPES = ("float32", "bfloat16")


class JobConfigError(ValueError):
    """A user error in a job config; ``str(err)`` is the one line to print."""


def _fail(source: str, where: str, value: Any, allowed: str) -> JobConfigError:
    return JobConfigError(f"{source}: {where}: {value!r} {allowed}")


def _positive(source: str, where: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise _fail(source, where, value, "must be >= 0" if allow_zero else "must be > 0")


def _one_of(source: str, where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise _fail(source, where, value, f"is not allowed (allowed: {', '.join(allowed)})")


def validate(c: Any) -> None:
    """Checks that need no model, data or cluster (those run in preflight and the job)."""
    s = c.source
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", c.name):
        raise _fail(s, "name", c.name, "is not a lower-case DNS label of at most 40 characters")
    _one_of(s, "model.dtype", c.model.dtype, DTYPES)
    if not c.model.path and not c.model.config:
        raise _fail(s, "model.path", "", "is empty and model.config is empty: give a model path or a config")
    from training.model_config import check_config_keys, check_seq_len  # stdlib; imports this module

    check_config_keys(c.model.config, s)
    _one_of(s, "data.kind", c.data.kind, DATA_KINDS)
    _one_of(s, "data.on_bad_record", c.data.on_bad_record, BAD_RECORD_POLICIES)
    _one_of(s, "data.overlong", c.data.overlong, OVERLONG_POLICIES)
    if c.data.kind != "synthetic" and not c.data.path:
        raise _fail(s, "data.path", "", f"is empty but data.kind is {c.data.kind!r} (give a file, directory or s3:// prefix)")
    if c.data.path and not c.data.path.startswith("s3://") and c.data.kind != "synthetic":
        if not Path(c.data.path).exists():
            raise _fail(s, "data.path", c.data.path, "does not exist")
    if not 0.0 < c.data.eval_fraction < 0.5:
        raise _fail(s, "data.eval_fraction", c.data.eval_fraction, "must be between 0 and 0.5 (exclusive)")
    t = c.train
    for name in ("seq_len", "micro_batch_size", "global_batch_size", "max_steps", "log_every_n_steps", "report_every_n_steps"):
        _positive(s, f"train.{name}", getattr(t, name))
    if t.seq_len < 8:
        raise _fail(s, "train.seq_len", t.seq_len, "must be >= 8")
    if c.model.max_position_embeddings and t.seq_len > c.model.max_position_embeddings:
        raise _fail(s, "train.seq_len", t.seq_len,
                    f"exceeds the model's max_position_embeddings ({c.model.max_position_embeddings})")
    check_seq_len(t.seq_len, c.model.config, s)
    _positive(s, "train.lr", t.lr)
    _positive(s, "train.warmup_steps", t.warmup_steps, allow_zero=True)
    if t.warmup_steps >= t.max_steps:
        raise _fail(s, "train.warmup_steps", t.warmup_steps, f"must be < train.max_steps ({t.max_steps})")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        raise _fail(s, "train.min_lr_ratio", t.min_lr_ratio, "must be between 0 and 1")
    _positive(s, "train.weight_decay", t.weight_decay, allow_zero=True)
    _positive(s, "train.grad_clip", t.grad_clip, allow_zero=True)
    p = c.parallel
    _one_of(s, "parallel.strategy", p.strategy, STRATEGIES)
    _one_of(s, "parallel.grad_reduce_dtype", p.grad_reduce_dtype, REDUCE_DTYPES)
    _positive(s, "parallel.num_workers", p.num_workers)
    _positive(s, "parallel.workers_per_node", p.workers_per_node)
    _positive(s, "parallel.cpus_per_worker", p.cpus_per_worker)
    if p.num_workers % p.workers_per_node:
        raise _fail(s, "parallel.num_workers", p.num_workers,
                    f"must be a multiple of parallel.workers_per_node ({p.workers_per_node})")
    # A GPU job still at one worker has not been sized yet: the charts and the preflight set its
    # size from the environment's node group and validate it again at that size.
    unsized_gpu_job = p.use_gpu and p.num_workers == 1
    if p.strategy == "hybrid_shard" and c.num_nodes < 2 and not unsized_gpu_job:
        raise _fail(s, "parallel.strategy", p.strategy,
                    f"needs >= 2 nodes (num_workers {p.num_workers} / workers_per_node {p.workers_per_node} = {c.num_nodes})")
    per_step = p.num_workers * t.micro_batch_size
    if t.global_batch_size % per_step:
        raise _fail(s, "train.global_batch_size", t.global_batch_size,
                    f"must be divisible by num_workers x micro_batch_size ({p.num_workers} x {t.micro_batch_size} = {per_step})")
    k = c.checkpoint
    _positive(s, "checkpoint.every_n_steps", k.every_n_steps, allow_zero=True)
    _positive(s, "checkpoint.keep_last", k.keep_last)
    _positive(s, "checkpoint.sigterm_grace_seconds", k.sigterm_grace_seconds)
    _positive(s, "checkpoint.max_failures", k.max_failures, allow_zero=True)
    _one_of(s, "checkpoint.on_existing_run", k.on_existing_run, ON_EXISTING_RUN)
    if k.run_name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", k.run_name):
        raise _fail(s, "checkpoint.run_name", k.run_name, "may hold only letters, digits, '.', '_' and '-'")
    if k.storage_path and "://" in k.storage_path and not k.storage_path.startswith(("s3://", "file://")):
        raise _fail(s, "checkpoint.storage_path", k.storage_path, "must be s3://bucket/prefix or a directory")
    if k.storage_path and not k.storage_path.startswith("s3://") and p.use_gpu and c.num_nodes > 1:
        raise _fail(s, "checkpoint.storage_path", k.storage_path,
                    f"is a local directory but the job spans {c.num_nodes} nodes (use s3://bucket/prefix: "
                    "every node writes its shards there)")
    _positive(s, "eval.every_n_steps", c.eval.every_n_steps, allow_zero=True)
    _positive(s, "eval.max_batches", c.eval.max_batches)
    if c.eval.exact_match and c.data.kind != "chat":
        raise _fail(s, "eval.exact_match", True, "needs data.kind = 'chat' (prompt/answer data)")
    _one_of(s, "evidence.require_transport", c.evidence.require_transport, TRANSPORTS)
    _positive(s, "rayjob.active_deadline_minutes", c.rayjob.active_deadline_minutes)
    _positive(s, "rayjob.backoff_limit", c.rayjob.backoff_limit, allow_zero=True)
    _positive(s, "rayjob.ttl_seconds_after_finished", c.rayjob.ttl_seconds_after_finished, allow_zero=True)
    _validate_accept(c)


def _validate_accept(c: Any) -> None:
    s, a = c.source, c.accept
    for name in ("eval_loss_after_max", "improvement_min", "exact_match_min", "tokens_per_s_min"):
        _positive(s, f"accept.{name}", getattr(a, name), allow_zero=True)
    if a.exact_match_min > 1:
        raise _fail(s, "accept.exact_match_min", a.exact_match_min, "must be a share between 0 and 1")
    if a.exact_match_min and not c.eval.exact_match:
        raise _fail(s, "accept.exact_match_min", a.exact_match_min, "needs eval.exact_match = true (else it is never measured)")
    _one_of(s, "accept.transport", a.transport, TRANSPORTS)
