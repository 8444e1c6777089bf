"""The job config: ONE schema, standard library only.

A job config (``jobs/*.toml``) says what a training run does: model, data, steps, sharding,
checkpointing, evaluation. It is parsed here and nowhere else: the training entry point, the
cdk8s charts and the preflight all call :func:`load_job_config`, so they validate with the very
code the job runs. This module imports nothing outside the standard library (a test proves it),
so charts/ and the CLI can use it without torch or ray.

Every error a user can cause is a :class:`JobConfigError` whose text is one line naming the file,
the field, the bad value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from training.config_checks import (  # noqa: F401  (re-exported: one schema, one place to import from)
    BAD_RECORD_POLICIES, DATA_KINDS, DTYPES, ON_EXISTING_RUN, STRATEGIES, TRANSPORTS, JobConfigError, _fail, validate,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    path: str = ""
    """Hugging Face model: a local directory, an ``s3://`` prefix, or a hub id. Empty: build a
    randomly initialised model from ``config`` (tiny models for tests and the local demo)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """Qwen2Config keyword arguments used when ``path`` is empty."""
    tokenizer: str = ""
    """Tokenizer directory or ``s3://`` prefix; empty means the model's own."""
    dtype: str = "auto"
    """Parameter (master weight) dtype: ``auto`` = float32, computing in bfloat16 on GPU through
    FSDP's mixed precision; ``bfloat16`` = pure bf16 weights and optimizer state (less memory,
    small updates may round away)."""
    max_position_embeddings: int = 0
    """Read from the model's config.json by the job; 0 here means 'not known yet'."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    kind: str = "synthetic"
    """``synthetic`` (random ids: infrastructure checks only), ``text``, ``jsonl`` or ``chat``."""
    path: str = ""
    """File or directory, local or ``s3://``; unused for synthetic."""
    eval_fraction: float = 0.05
    """Share of documents held out for evaluation, chosen deterministically by seed."""
    on_bad_record: str = "error"
    """``error``: stop naming file and line; ``skip``: skip and count in the run record."""
    overlong: str = "truncate"
    """A chat conversation longer than ``train.seq_len`` (conversations are never split across
    blocks): ``truncate`` to its first seq_len tokens (counted in the run record) or ``refuse``."""
    seed: int = 1234
    """Shuffle seed (documents and blocks)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    seq_len: int = 512
    micro_batch_size: int = 1
    """Sequences per worker per forward/backward."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all workers (= workers x micro x accumulation)."""
    max_steps: int = 100
    lr: float = 2e-5
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of ``lr``."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every_n_steps: int = 1
    report_every_n_steps: int = 10
    """Cadence of ``ray.train.report`` for metrics (each report waits for a controller poll)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    strategy: str = "full_shard"
    num_workers: int = 1
    """Ray Train workers = world size (one per GPU on GPU clusters)."""
    workers_per_node: int = 1
    """GPUs (workers) per node; the hybrid mesh shards inside a node and replicates across."""
    use_gpu: bool = False
    node_group: str = ""
    """The environment's GPU node group a GPU job runs on (``[[gpu_node_groups]] name``); empty =
    the first group. The charts and the preflight size the job to it."""
    cpus_per_worker: float = 1.0
    activation_checkpointing: bool = False
    compile: bool = False
    keep_params_gathered: bool = False
    """With gradient accumulation: keep each block's parameters gathered from the first micro
    batch's forward to the last one's backward (one all-gather per block per step instead of
    two per micro batch), at the cost of the unsharded bf16 parameters for the whole step. The
    preflight's memory plan says whether it fits."""
    grad_reduce_dtype: str = "float32"
    """Gradient reduce-scatter/all-reduce dtype on GPU: ``float32`` or ``bfloat16`` (half the
    bytes on the network; the master weights and AdamW stay fp32)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    storage_path: str = ""
    """Ray Train storage: ``s3://bucket/prefix`` or a shared directory. Empty: no checkpoints."""
    run_name: str = ""
    """Run name under the storage path; empty = the job name."""
    every_n_steps: int = 0
    """0 = only at the end."""
    keep_last: int = 2
    on_existing_run: str = "resume"
    """``resume`` (default) or ``refuse`` when the run name already exists in storage."""
    sigterm_grace_seconds: int = 120
    """Time allowed for the final checkpoint after SIGTERM; pods get this plus a margin."""
    max_failures: int = 2
    """Worker failures Ray Train recovers from within one run (restarts from the last checkpoint).
    Data errors are deterministic and never retried (training/data/failure.py)."""
    export_hf: bool = True
    """Consolidate the final checkpoint into a Hugging Face directory next to the checkpoints."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    every_n_steps: int = 0
    """0 = only before (step 0) and after training."""
    max_batches: int = 8
    exact_match: bool = False
    """Generation-based exact match for prompt/answer (chat) data."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvidenceConfig:
    require_transport: str = "any"
    """Fail fast unless NCCL's inter-node transport is this (``efa`` on EKS)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AcceptConfig:
    """Acceptance criteria, declared before the run; the record's verdict judges them
    (training/verdict.py). 0 (or ``any``) = no such criterion."""
    eval_loss_after_max: float = 0.0
    """Held-out loss after training at most this."""
    improvement_min: float = 0.0
    """Held-out loss before minus after at least this (loss units, not a ratio)."""
    exact_match_min: float = 0.0
    """Exact match after training at least this share (needs eval.exact_match)."""
    tokens_per_s_min: float = 0.0
    """Steady-state tokens/s over all devices at least this."""
    transport: str = "any"
    """NCCL's transport of the finished run must be this (a miss is an execution failure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RayJobConfig:
    """How Kubernetes runs the job as a KubeRay RayJob (read by charts/, ignored by the job)."""
    active_deadline_minutes: int = 240
    """RayJob ``activeDeadlineSeconds`` / 60: a hung job stops paying for GPUs after this."""
    backoff_limit: int = 1
    """RayJob ``backoffLimit``: whole-job retries, each on a NEW RayCluster (resumes from the
    last checkpoint in storage). Worker failures inside a run are ``checkpoint.max_failures``."""
    ttl_seconds_after_finished: int = 300
    """Seconds the finished job's cluster stays up for ``kubectl logs`` before it is deleted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    name: str
    """The job's name: RayJob name and default run name (lower-case DNS label)."""
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    rayjob: RayJobConfig = field(default_factory=RayJobConfig)
    accept: AcceptConfig = field(default_factory=AcceptConfig)
    source: str = "<job config>"
    """Where this config came from (for error messages)."""

    @property
    def run_name(self) -> str:
        return self.checkpoint.run_name or self.name

    @property
    def grad_accum_steps(self) -> int:
        return self.train.global_batch_size // (self.parallel.num_workers * self.train.micro_batch_size)

    @property
    def num_nodes(self) -> int:
        return -(-self.parallel.num_workers // self.parallel.workers_per_node)

    @property
    def tokens_per_step(self) -> int:
        return self.train.global_batch_size * self.train.seq_len

    @property
    def is_infrastructure_check(self) -> bool:
        """Synthetic tokens prove the plumbing, not a useful model."""
        return self.data.kind == "synthetic"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("source")
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


_SECTIONS = {
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "parallel": ParallelConfig,
    "checkpoint": CheckpointConfig, "eval": EvalConfig, "evidence": EvidenceConfig,
    "rayjob": RayJobConfig, "accept": AcceptConfig,
}


def _coerce(source: str, where: str, value: Any, expected: Any) -> Any:
    """Check a TOML value against a dataclass field type (bool is not an int here)."""
    kind = expected if isinstance(expected, str) else getattr(expected, "__name__", str(expected))
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise _fail(source, where, value, "is not allowed (expected true or false)")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(source, where, value, "is not allowed (expected an integer)")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(source, where, value, "is not allowed (expected a number)")
    if kind == "str":
        if isinstance(value, str):
            return value
        raise _fail(source, where, value, "is not allowed (expected a string)")
    if kind.startswith("Mapping"):
        if isinstance(value, dict):
            return dict(value)
        raise _fail(source, where, value, "is not allowed (expected a table)")
    raise TypeError(f"unsupported field type {expected!r}")  # a bug in this module


def _build_section(cls: type, table: Mapping[str, Any], prefix: str, source: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    kwargs = {}
    for key, value in table.items():
        where = f"{prefix}{key}"
        if key not in known:
            raise _fail(source, where, key, f"is not a known field (known: {', '.join(sorted(known))})")
        kwargs[key] = _coerce(source, where, value, known[key].type)
    return cls(**kwargs)


def _set_dotted(raw: dict[str, Any], dotted: str, text: str, source: str) -> None:
    """Apply one ``--set section.key=value`` override; the value is parsed as a TOML value."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word is a string: --set data.path=/x/y.jsonl
    parts = dotted.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise _fail(source, dotted, text, "cannot be set: its parent is not a table")
    node[parts[-1]] = value


def parse_overrides(items: list[str], source: str = "--set") -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobConfigError(f"{source}: {item!r} is not key=value (e.g. train.max_steps=20)")
        pairs.append((key.strip(), value.strip()))
    return pairs


def job_config_from_dict(raw: Mapping[str, Any], source: str) -> JobConfig:
    raw = dict(raw)
    top = {f.name for f in dataclasses.fields(JobConfig) if f.name != "source"}
    for key in raw:
        if key not in top:
            raise _fail(source, key, key, f"is not a known field (known: {', '.join(sorted(top))})")
    if "name" not in raw:
        raise JobConfigError(f"{source}: name: missing (a lower-case DNS label, e.g. 'smoke')")
    kwargs: dict[str, Any] = {"source": source}
    for key, value in raw.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise _fail(source, key, value, "is not allowed (expected a table)")
            kwargs[key] = _build_section(_SECTIONS[key], value, f"{key}.", source)
        else:
            kwargs[key] = _coerce(source, key, value, "str")
    config = JobConfig(**kwargs)
    validate(config)
    return config


def read_job_file(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The job config file as a table, with the ``section.key=value`` overrides applied, not yet
    validated: what callers that size a job (the charts, the preflight) read first."""
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobConfigError(f"{source}: file not found") from None
    except IsADirectoryError:
        raise JobConfigError(f"{source}: is a directory, not a job config (e.g. jobs/local.toml)") from None
    except UnicodeDecodeError as err:
        raise JobConfigError(f"{source}: not UTF-8 text (byte {err.start}): not a job config") from None
    except OSError as err:
        raise JobConfigError(f"{source}: cannot be read ({err.strerror or err})") from None
    except tomllib.TOMLDecodeError as err:
        raise JobConfigError(f"{source}: not valid TOML: {err}") from None
    for dotted, text in parse_overrides(overrides or [], source=f"{source} (--set)"):
        _set_dotted(raw, dotted, text, source)
    return raw


def load_job_config(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read, override (``section.key=value``) and validate a job config file."""
    return job_config_from_dict(read_job_file(path, overrides), str(path))
