"""The job config: ONE schema, standard library only.

A job config (``jobs/*.toml``) says what a training run does: model, data, steps, sharding,
checkpointing, evaluation. It is parsed here and nowhere else: the training entry point, the
cdk8s charts and the preflight all call :func:`load_job_config`, so they validate with the very
code the job runs. This module imports nothing outside the standard library (a test proves it),
so charts/ and the CLI can use it without torch or ray.

The schema engine (spec_schema/, shared with environment.toml) checks the file's shape; each
section (:mod:`training.config_sections`, one dataclass per table) owns its rules
(``__post_init__``, raising :class:`FieldError` on its own field), and :class:`JobConfig` here
the rules across sections. Every error a user can cause is a
:class:`JobConfigError` whose text is one line naming the file, the field, the bad value and
what is allowed.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from spec_schema import FieldError, build_section, read_toml
from training.config_checks import JobConfigError, benchmark_task, one_of
from training.config_sections import (AcceptConfig, CheckpointConfig, DataConfig, EvalConfig, EvidenceConfig,
                                      ModelConfig, NetcheckConfig, OptimConfig, ParallelConfig, RayJobConfig,
                                      TrackingConfig, TrainConfig, WorldSize)
from training.model_config import seq_len_problem
from training.storage import RunStorage

JOB_KINDS = ("train", "netcheck")
"""``kind`` of a job config: what ``python -m training`` runs for it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    name: str
    """The job's name: RayJob name and default run name (lower-case DNS label)."""
    description: str = ""
    """Free text for people; reports leave it out of the factors compared."""
    kind: str = "train"
    """What the job runs: ``train`` (training/loop.py) or ``netcheck`` (training/netcheck/: the
    network's bus bandwidth, over EFA and over sockets, with a verdict; model and data unused)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """``[model]``: what is trained."""
    data: DataConfig = field(default_factory=DataConfig)
    """``[data]``: what it is trained on."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """``[train]``: steps, batch, learning rate."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """``[optim]``: AdamW's settings and the schedule's shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """``[parallel]``: workers, sharding, where it runs."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """``[checkpoint]``: where the run lives and how it resumes."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """``[eval]``: held-out evaluation."""
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    """``[evidence]``: what the run must prove about its transport."""
    rayjob: RayJobConfig = field(default_factory=RayJobConfig)
    """``[rayjob]``: the RayJob's limits on Kubernetes."""
    accept: AcceptConfig = field(default_factory=AcceptConfig)
    """``[accept]``: the criteria the result is judged against (the verdict)."""
    netcheck: NetcheckConfig = field(default_factory=NetcheckConfig)
    """``[netcheck]``: the network measurement (its own job kind, or before training)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """``[tracking]``: the MLflow server the run is logged to."""
    source: str = "<job config>"
    """Where this config came from (for error messages)."""

    def __post_init__(self) -> None:
        """Rules across sections; a FieldError here names the absolute field."""
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", self.name):
            raise FieldError("name", self.name, "is not a lower-case DNS label of at most 40 characters")
        one_of(self, "kind", JOB_KINDS)
        t, p, k = self.train, self.parallel, self.checkpoint
        if problem := seq_len_problem(t.seq_len, self.model.known_max_positions or None):
            raise FieldError("train.seq_len", t.seq_len, problem)
        if p.strategy == "hybrid_shard" and self.num_nodes < 2 and p.sized:
            raise FieldError("parallel.strategy", p.strategy,
                             f"needs >= 2 nodes (num_workers {p.num_workers} / workers_per_node {p.workers_per_node} = "
                             f"{self.num_nodes})")
        per_step = p.num_workers * t.micro_batch_size
        if p.sized and t.global_batch_size % per_step:
            raise FieldError("train.global_batch_size", t.global_batch_size,
                             f"must be divisible by num_workers x micro_batch_size ({p.num_workers} x "
                             f"{t.micro_batch_size} = {per_step})")
        if p.min_nodes and p.sized and p.min_nodes > self.num_nodes:
            raise FieldError("parallel.min_nodes", p.min_nodes,
                             f"is more than the job's nodes (num_workers {p.num_workers} / workers_per_node "
                             f"{p.workers_per_node} = {self.num_nodes}); allowed 0 (fixed) or 1..{self.num_nodes}")
        for world in self.world_sizes if p.sized else ():
            if t.global_batch_size % (world * t.micro_batch_size):
                raise FieldError("train.global_batch_size", t.global_batch_size,
                                 f"must be divisible by every elastic size x micro_batch_size (parallel.min_nodes "
                                 f"{p.min_nodes}: {world} workers x {t.micro_batch_size})")
        if p.grad_reduce_dtype == "bfloat16" and p.strategy != "full_shard" and p.sized and self.grad_accum_steps > 1:
            # FSDP2 holds the all-reduce back until the last micro batch and sums the held-back
            # ones in the reduce dtype, before the fp32 gradient exists (tests/training/test_accumulation.py).
            raise FieldError("parallel.grad_reduce_dtype", p.grad_reduce_dtype,
                             f"with {p.strategy} and {self.grad_accum_steps} micro batches per step would sum the "
                             "micro batches in bf16, not fp32 (use float32, or full_shard)")
        if p.grad_reduce_dtype == "bfloat16" and p.accumulation == "local" and p.sized and self.grad_accum_steps > 1:
            # FSDP2 keeps the unsharded gradient in the reduce dtype between micro batches
            # (torch 2.13 _fsdp_param.py to_accumulated_grad_if_needed): the sum would be bf16.
            raise FieldError("parallel.grad_reduce_dtype", p.grad_reduce_dtype,
                             f"with parallel.accumulation = 'local' and {self.grad_accum_steps} micro batches per step "
                             "would sum the unsharded gradients in bf16, not fp32 (use float32)")
        if k.storage_path and not RunStorage(k.storage_path).shared and p.use_gpu and self.num_nodes > 1:
            raise FieldError("checkpoint.storage_path", k.storage_path,
                             f"is a local directory but the job spans {self.num_nodes} nodes (use s3://bucket/prefix, "
                             "or file:///<path> of a file system every node mounts: every node writes its shards there)")
        for where, every in (("checkpoint.every_n_steps", k.every_n_steps), ("eval.every_n_steps", self.eval.every_n_steps)):
            if every > t.max_steps:
                raise FieldError(where, every, f"is more than train.max_steps ({t.max_steps}): it would never fall "
                                               "inside the run (0 = only at the end)")
        if self.eval.exact_match and self.is_infrastructure_check:
            # other kinds: the data check refuses data that holds no conversations (training/data/check.py)
            raise FieldError("eval.exact_match", True, "needs conversation data (data.kind 'synthetic' has none)")
        self._check_objective()
        if self.eval.benchmarks and self.is_infrastructure_check:
            raise FieldError("eval.benchmarks", list(self.eval.benchmarks),
                             "needs a tokenizer: data.kind 'synthetic' loads none")
        tasks = {benchmark_task(entry)[0] for entry in self.eval.benchmarks}
        for key in self.accept.benchmarks:
            if key.rpartition(".")[0] not in tasks:
                raise FieldError(f"accept.benchmarks.{key}", self.accept.benchmarks[key],
                                 f"names a task eval.benchmarks does not run (runs: {', '.join(sorted(tasks)) or 'none'})")
        if self.accept.exact_match_min and not self.eval.exact_match:
            raise FieldError("accept.exact_match_min", self.accept.exact_match_min,
                             "needs eval.exact_match = true (else it is never measured)")

    def _check_objective(self) -> None:
        """The objective against the data it trains on (the data check reads the records)."""
        from training.objectives.dpo import DATA_KINDS as PAIR_KINDS

        objective, kind = self.train.objective, self.data.kind
        if objective == "dpo" and kind not in PAIR_KINDS:
            raise FieldError("train.objective", objective, f"needs preference pairs: data.kind {kind!r} holds none "
                                                           f"(allowed: {', '.join(PAIR_KINDS)})")
        if objective != "dpo" and kind == "preference":
            raise FieldError("train.objective", objective, "cannot train on data.kind 'preference' (pairs): set "
                                                           "train.objective = 'dpo'")
        if objective == "dpo" and self.eval.exact_match:
            raise FieldError("eval.exact_match", True, "needs conversations; train.objective 'dpo' reads pairs")
        if self.accept.rewards_accuracy_min and objective != "dpo":
            raise FieldError("accept.rewards_accuracy_min", self.accept.rewards_accuracy_min,
                             f"needs train.objective = 'dpo' (got {objective!r}): only DPO has rewards")

    @property
    def run_name(self) -> str:
        return self.checkpoint.run_name or self.name

    @property
    def grad_accum_steps(self) -> int:
        return self.accum_steps_at(self.parallel.num_workers)

    def accum_steps_at(self, world_size: int) -> int:
        """Micro batches per worker per step at ``world_size`` workers: the global batch is fixed,
        an elastic run at fewer workers accumulates more."""
        return self.train.global_batch_size // (world_size * self.train.micro_batch_size)

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """Every worker count the job may run at, fewest first: ``(num_workers,)`` at a fixed size,
        whole nodes from ``parallel.min_nodes`` to ``num_workers / workers_per_node`` when elastic."""
        p = self.parallel
        if not p.min_nodes:
            return (p.num_workers,)
        return tuple(n * p.workers_per_node for n in range(p.min_nodes, self.num_nodes + 1))

    @property
    def elastic(self) -> bool:
        return len(self.world_sizes) > 1

    @property
    def num_nodes(self) -> int:
        return -(-self.parallel.num_workers // self.parallel.workers_per_node)

    @property
    def tokens_per_step(self) -> int:
        return self.train.global_batch_size * self.train.seq_len

    @property
    def measures_network(self) -> bool:
        """A netcheck job, or a training job that runs one first (``netcheck.run_first``)."""
        return self.kind == "netcheck" or self.netcheck.run_first

    @property
    def is_infrastructure_check(self) -> bool:
        """Synthetic tokens prove the plumbing, not a useful model."""
        return self.data.kind == "synthetic"

    def to_dict(self) -> dict[str, Any]:
        """The config as the table it is built from (``job_config_from_dict`` takes it back: the
        driver hands it to the workers), lists where the file has arrays."""
        out = _as_table(dataclasses.asdict(self))
        out.pop("source")
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def _as_table(value: Any) -> Any:
    """``dataclasses.asdict`` keeps tuples (``[[model.transforms]]``); a TOML array is a list."""
    if isinstance(value, dict):
        return {key: _as_table(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_table(item) for item in value]
    return value


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
            raise JobConfigError(f"{source}: {dotted}: {text!r} cannot be set: its parent is not a table")
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
    """A job config from its table (the file's, or the driver's copy handed to the workers)."""
    return build_section(JobConfig, dict(raw), source=source, error=JobConfigError, extra={"source": source})


def read_job_file(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The job config file as a table, with the ``section.key=value`` overrides applied, not yet
    validated: what callers that size a job (the charts, the preflight) read first."""
    source = str(path)
    return apply_overrides(read_toml(path, JobConfigError, "jobs/local.toml"), overrides or [], source)


def apply_overrides(raw: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """``raw`` with the ``section.key=value`` items set, each value read as the job reads its ``--set``."""
    for dotted, text in parse_overrides(overrides, source=f"{source} (--set)"):
        _set_dotted(raw, dotted, text, source)
    return raw


def load_job_config(path: str | Path, overrides: list[str] | None = None, world: WorldSize | None = None) -> JobConfig:
    """Read, override (``section.key=value``), size (``world``, over both) and validate a job config file."""
    raw = read_job_file(path, overrides)
    if world:
        world.apply(raw)
    return job_config_from_dict(raw, str(path))
