"""The job config's sections: one dataclass per table of a job config file (``[model]``,
``[data]``, ``[train]``, ``[optim]``, ``[parallel]``, ``[checkpoint]``, ``[eval]``,
``[evidence]``, ``[accept]``, ``[tracking]``, ``[netcheck]``, ``[rayjob]``), each field with its
docstring and each section with its own rules (``__post_init__``, raising :class:`FieldError` on
its own field). The rules across sections are :class:`training.config.JobConfig`'s.
Standard library only, like training/config.py (charts/ and the CLI import it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from spec_schema import FieldError
from training.config_checks import (
    ADAMW_KERNELS, BAD_RECORD_POLICIES, BENCHMARK_METRICS, SHIPPED_BENCHMARKS, DATA_KINDS, DTYPES, INT32_MAX,
    LR_SCHEDULES, NO_DECAY_RULES, ON_EXISTING_RUN, OVERLONG_POLICIES, REDUCE_DTYPES, STRATEGIES, TORCH_SEED_RANGE,
    TRANSPORTS, benchmark_task, one_of, positive, s3_problem, tracking_uri_problem, ACCUMULATIONS, PLAN_MODES,
    PLAN_SETTINGS,
)
from training import contract
from training.model_config import check_config_keys, max_positions
from training.storage import storage_problem


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformConfig:
    """One ``[[model.transforms]]`` entry: a model transform applied after the model is built and
    before it is parallelized (training/model_transforms/)."""
    name: str
    """The transform: a file of training/model_transforms/ (its docstring says what it does)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The transform's own settings, judged by its ``check`` before any worker starts."""

    def __post_init__(self) -> None:
        from training.model_transforms import check_transform  # the registry (standard library at import)

        check_transform(self.name, self.options)


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
    transforms: tuple[TransformConfig, ...] = ()
    """Model transforms, in order, between building the model and parallelizing it (``[[model.transforms]]``)."""

    def __post_init__(self) -> None:
        one_of(self, "dtype", DTYPES)
        s3_problem(self, "path", "tokenizer")
        if not self.path and not self.config:
            raise FieldError("path", "", "is empty and model.config is empty: give a model path or a config")
        check_config_keys(self.config)
        positive(self, "max_position_embeddings", allow_zero=True)

    @property
    def known_max_positions(self) -> int | None:
        """The model's positions as far as the file says (``max_position_embeddings`` or the
        config table's), None when only the model's own config.json can tell."""
        known = [n for n in (self.max_position_embeddings, max_positions(self.config)) if n]
        return min(known) if known else None


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    kind: str = "synthetic"
    """``synthetic`` (random ids: infrastructure checks only) or a data format: the name of its
    file in training/data/formats/ (``text``, ``jsonl``, ``chat``, ``alpaca``, ``sharegpt``,
    ``hf``; each file's docstring says what it reads)."""
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

    def __post_init__(self) -> None:
        one_of(self, "kind", DATA_KINDS)
        one_of(self, "on_bad_record", BAD_RECORD_POLICIES)
        one_of(self, "overlong", OVERLONG_POLICIES)
        s3_problem(self, "path")
        if self.kind != "synthetic" and not self.path:
            raise FieldError("path", "", f"is empty but data.kind is {self.kind!r} (give a file, directory or s3:// prefix)")
        if self.path and not self.path.startswith("s3://") and self.kind != "synthetic":
            if not Path(self.path).exists():
                raise FieldError("path", self.path, "does not exist")
        if not 0.0 < self.eval_fraction < 0.5:
            raise FieldError("eval_fraction", self.eval_fraction, "must be between 0 and 0.5 (exclusive)")
        # numpy's SeedSequence (the shuffles: np.random.default_rng([seed, epoch])) takes only
        # non-negative entropy; a negative seed would fail in the workers.
        positive(self, "seed", allow_zero=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    seq_len: int = 512
    """Tokens per sequence (packed or padded to it); at most the model's ``max_position_embeddings``."""
    micro_batch_size: int = 1
    """Sequences per worker per forward/backward."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all workers (= workers x micro x accumulation)."""
    max_steps: int = 100
    """Optimizer steps the run trains (a resumed run counts the steps already done)."""
    lr: float = 2e-5
    """Peak AdamW learning rate, reached after ``warmup_steps`` (training/optim.py)."""
    warmup_steps: int = 10
    """Linear warm-up steps to ``lr``, then ``optim.schedule`` (cosine decay to ``lr x min_lr_ratio``
    by default); less than ``max_steps``."""
    min_lr_ratio: float = 0.1
    """The schedule's floor (``optim.schedule``: cosine or linear) as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip of the global gradient norm over all shards; 0 only measures it."""
    seed: int = 0
    """``torch.manual_seed`` of every worker (model init, dropout); the data order has ``data.seed``."""
    log_every_n_steps: int = 1
    """Cadence of the metrics rows (``metrics.jsonl``) and the progress line."""
    report_every_n_steps: int = 10
    """Cadence of ``ray.train.report`` for metrics (each report waits for a controller poll)."""
    objective: str = "sft"
    """What the loss is: a file of training/objectives/ (``sft``: next-token cross-entropy on the
    targets; ``dpo``: direct preference optimization on ``data.kind = "preference"`` pairs)."""
    objective_options: Mapping[str, Any] = field(default_factory=dict)
    """The objective's own settings, judged by its ``check`` (``dpo``: ``beta`` > 0, ``loss_type``
    sigmoid | robust, ``label_smoothing`` in [0, 0.5) with robust); run.json records them."""

    def __post_init__(self) -> None:
        from training.objectives import check_objective  # the registry (standard library at import)

        check_objective(self.objective, self.objective_options)
        positive(self, "seq_len", "micro_batch_size", "global_batch_size", "max_steps", "log_every_n_steps",
                 "report_every_n_steps", "lr")
        if self.seq_len < 8:
            raise FieldError("seq_len", self.seq_len, "must be >= 8")
        positive(self, "warmup_steps", "weight_decay", "grad_clip", allow_zero=True)
        if self.warmup_steps >= self.max_steps:
            raise FieldError("warmup_steps", self.warmup_steps, f"must be < train.max_steps ({self.max_steps})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise FieldError("min_lr_ratio", self.min_lr_ratio, "must be between 0 and 1")
        if not TORCH_SEED_RANGE[0] <= self.seed <= TORCH_SEED_RANGE[1]:
            raise FieldError("seed", self.seed, f"must be between {TORCH_SEED_RANGE[0]} and {TORCH_SEED_RANGE[1]} "
                                                "(torch.manual_seed's range)")


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """``[optim]``: AdamW and the shape of its schedule (training/optim.py). The peak rate, the
    warm-up, the schedule's floor, the weight decay and the gradient clip are ``[train]``'s
    ``lr``, ``warmup_steps``, ``min_lr_ratio``, ``weight_decay`` and ``grad_clip``. The defaults
    are the optimizer every run had before this section existed."""
    beta1: float = 0.9
    """AdamW's first-moment decay (``betas[0]``): at least 0, below 1 (torch.optim.AdamW's rule)."""
    beta2: float = 0.95
    """AdamW's second-moment decay (``betas[1]``): at least 0, below 1."""
    eps: float = 1e-8
    """AdamW's ``eps``, added to the root of the second moment: at least 0."""
    no_decay: str = "1d"
    """Parameters without weight decay: ``1d`` = those of fewer than 2 dimensions (biases and
    norm weights); ``none`` = every parameter decays."""
    kernel: str = "auto"
    """AdamW's implementation: ``auto`` = ``fused`` when the parameters are on a GPU, ``foreach``
    otherwise (CPU, and the host-held state of ``parallel.cpu_offload``); ``fused``,
    ``foreach`` or ``for_loop`` (one tensor at a time: the least temporary memory)."""
    schedule: str = "cosine"
    """Learning rate after the linear warm-up: ``cosine`` (half cosine) or ``linear`` down to
    ``lr x train.min_lr_ratio`` at the last step, or ``constant`` at ``lr``."""

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise FieldError(name, getattr(self, name), "must be at least 0 and below 1 (torch.optim.AdamW's betas)")
        positive(self, "eps", allow_zero=True)
        one_of(self, "no_decay", NO_DECAY_RULES)
        one_of(self, "kernel", ADAMW_KERNELS)
        one_of(self, "schedule", LR_SCHEDULES)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    strategy: str = "full_shard"
    """FSDP2 sharding: ``full_shard``, ``hybrid_shard`` (shard in a node, replicate across; >= 2
    nodes) or ``no_shard``."""
    num_workers: int = 0
    """Ray Train workers = world size (one per GPU on GPU clusters). 0 (or absent): a GPU job
    gets one worker per GPU of its node group, a CPU job one worker. A GPU job's size is decided
    by the charts from the spec (``charts/jobs.py: size_job``; 1 is one GPU) and reaches the job
    as :class:`WorldSize`, never as text."""
    workers_per_node: int = 1
    """GPUs (workers) per node; the hybrid mesh shards inside a node and replicates across. A
    GPU job's comes from its node group (:class:`WorldSize`)."""
    use_gpu: bool = False
    """Train on GPUs with NCCL; false: CPU with gloo (tests, the local demo)."""
    node_group: str = ""
    """The environment's GPU node group a GPU job runs on (``[[gpu_node_groups]] name``); empty =
    the first group. The charts and the preflight size the job to it."""
    cpus_per_worker: float = 1.0
    """Ray CPUs each Ray Train worker asks for."""
    min_nodes: int = 0
    """Elastic size: the fewest nodes (of ``workers_per_node`` workers each) the job goes on with
    after a lost node; 0 = a fixed size. The maximum is ``num_workers / workers_per_node``. Ray
    Train's elastic ``ScalingConfig(num_workers=(min, max))`` resumes on what is left and grows
    back when nodes return, with the SAME global batch (more micro batches per worker) and data
    order; the global batch must divide at every size between the bounds."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in the backward (less memory, more compute)."""
    checkpoint_every: int = 1
    """With ``activation_checkpointing``: checkpoint every k-th decoder block only (blocks k, 2k,
    ... counted from 1, as torchtitan's per-layer selective checkpointing): backward recomputes
    the forward of 1/k of the blocks and the others keep their activations. 1: every block.
    Without ``activation_checkpointing`` it changes nothing (``--set
    parallel.activation_checkpointing=false`` turns checkpointing off whatever k the file writes)."""
    compile: bool = False
    """``torch.compile`` each decoder block before sharding (training/parallel.py)."""
    keep_params_gathered: bool = False
    """With gradient accumulation: keep each block's parameters gathered from the first micro
    batch's forward to the last one's backward (one all-gather per block per step instead of
    two per micro batch), at the cost of the unsharded bf16 parameters for the whole step. The
    preflight's memory plan says whether it fits."""
    cpu_offload: bool = False
    """Full fine-tuning past GPU memory: FSDP2's ``CPUOffloadPolicy`` keeps the sharded fp32
    parameters, their gradients and AdamW's state in (pinned) host memory and runs the optimizer
    step on the CPU; the GPU holds the gathered bf16 parameters, activations and gradients before
    their reduce-scatter. Every step copies each shard to the GPU per all-gather and each
    gradient shard back (``bench/bench_offload_transfer.py``); the preflight sizes the host
    memory per node. Checkpoints are the same either way (a run may resume with it changed)."""
    grad_reduce_dtype: str = "float32"
    """Gradient reduce-scatter/all-reduce dtype on GPU: ``float32`` or ``bfloat16`` (half the
    bytes on the network; the master weights and AdamW stay fp32). ``bfloat16`` only with
    full_shard or without accumulation: hybrid_shard and no_shard would sum the micro batches in
    bf16 (refused)."""
    accumulation: str = "sharded"
    """Gradient accumulation over micro batches: ``sharded`` reduce-scatters every micro batch
    (no unsharded gradient outlives a block's backward); ``local`` sums each rank's unsharded
    fp32 gradient and reduce-scatters once per step (1/micro-batches of the gradient traffic, at
    the memory of one unsharded fp32 gradient of the trained parameters). Only with the
    float32 reduce dtype when a step has more than one micro batch."""
    plan: str = "as_written"
    """``as_written``: the settings in this file are the plan. ``auto``: the operator CLI's plan
    search (``raytrain-eks preflight`` shows it) picks the plan that is fastest at the slow end
    of its predicted range and fits, and submit runs it; the settings ``pinned`` names stay as
    written."""
    pinned: tuple[str, ...] = ()
    """With ``plan = "auto"``: the plan settings the search must keep as written (any of
    strategy, accumulation, activation_checkpointing, checkpoint_every, keep_params_gathered,
    grad_reduce_dtype, cpu_offload, compile, micro_batch_size)."""

    def __post_init__(self) -> None:
        one_of(self, "strategy", STRATEGIES)
        one_of(self, "grad_reduce_dtype", REDUCE_DTYPES)
        one_of(self, "accumulation", ACCUMULATIONS)
        one_of(self, "plan", PLAN_MODES)
        object.__setattr__(self, "pinned", tuple(self.pinned))
        for name in self.pinned:
            if name not in PLAN_SETTINGS:
                raise FieldError("pinned", name, f"is not a plan setting (allowed: {', '.join(PLAN_SETTINGS)})")
        positive(self, "num_workers", allow_zero=True)
        positive(self, "workers_per_node", "cpus_per_worker")
        positive(self, "min_nodes", allow_zero=True)
        positive(self, "checkpoint_every")
        if not self.use_gpu and not self.num_workers:
            object.__setattr__(self, "num_workers", 1)  # a CPU job's default: the file alone sizes it
        if self.num_workers % self.workers_per_node:
            raise FieldError("num_workers", self.num_workers,
                             f"must be a multiple of parallel.workers_per_node ({self.workers_per_node})")

    @property
    def checkpointed_every(self) -> int:
        """The plan's k: ``checkpoint_every`` with checkpointing on, 1 without (a plan without
        checkpointing is one plan whatever k the file writes)."""
        return self.checkpoint_every if self.activation_checkpointing else 1

    @property
    def sized(self) -> bool:
        """False for a GPU job whose file leaves its size to its node group (``num_workers``
        0): the charts and the preflight size it (:class:`WorldSize`) and validate it at that size."""
        return self.num_workers > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorldSize:
    """A GPU job's size, decided once from the spec and the job (``charts/jobs.py: size_job``)
    and handed to the job as typed entry-point arguments (:meth:`argv`, read back by
    ``python -m training``), applied over the file's ``[parallel]`` as numbers (:meth:`apply`)."""
    num_workers: int
    """Ray Train workers = GPUs of the job."""
    workers_per_node: int
    """Workers (GPUs) in each worker pod: the node's GPUs, or all of them for a job smaller than a node."""
    WORKERS_FLAG: ClassVar[str] = "--workers"
    """The entry point's argument carrying ``num_workers`` (``python -m training``)."""
    PER_NODE_FLAG: ClassVar[str] = "--workers-per-node"
    """The entry point's argument carrying ``workers_per_node``."""

    @property
    def worker_pods(self) -> int:
        return self.num_workers // self.workers_per_node

    def argv(self) -> list[str]:
        """The entry point's arguments that carry this size."""
        return [self.WORKERS_FLAG, str(self.num_workers), self.PER_NODE_FLAG, str(self.workers_per_node)]

    def __str__(self) -> str:
        return f"parallel.num_workers={self.num_workers} parallel.workers_per_node={self.workers_per_node}"

    def apply(self, raw: dict[str, Any]) -> None:
        """Set the size into a job file's table (before it is validated)."""
        parallel = raw.setdefault("parallel", {})
        if isinstance(parallel, dict):  # else the schema names the bad section
            parallel |= {"num_workers": self.num_workers, "workers_per_node": self.workers_per_node}


MIN_CHECKPOINT_MINUTES = 1.0
"""The shortest ``checkpoint.every_minutes``: the snapshot stalls the loop and the upload queue
holds two at most (training/checkpointing/manager.py), so a shorter cadence only skips saves."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    storage_path: str = ""
    """Ray Train storage (training/storage/__init__.py): ``s3://bucket/prefix``, ``file:///<path>`` of a
    file system every node mounts (FSx for Lustre, EFS), or a directory of this machine. On the
    cluster the charts set it from the spec's storage. Empty: no checkpoints."""
    run_name: str = ""
    """Run name under the storage path; empty = the job name."""
    every_n_steps: int = 0
    """0 = only at the end."""
    every_minutes: float = 0.0
    """Also checkpoint once this many minutes of training passed since the last checkpoint, the
    first that comes of this and ``every_n_steps`` (0 = by steps only): a failure then loses at
    most about this much, however long a step is."""
    keep_last: int = 2
    """Checkpoints Ray Train keeps in storage (``CheckpointConfig.num_to_keep``); older ones are deleted."""
    on_existing_run: str = "resume"
    """``resume`` (default) or ``refuse`` when the run name already exists in storage."""
    sigterm_grace_seconds: int = contract.NOTICE_CHECKPOINT_SECONDS
    """Time allowed for the final checkpoint after SIGTERM; pods get this plus a margin. The
    default fits EC2's two-minute spot notice (``training/contract.py``)."""
    max_failures: int = 2
    """Worker failures Ray Train recovers from within one run (restarts from the last checkpoint).
    Data errors are deterministic and never retried (training/data/__init__.py)."""
    export_hf: bool = True
    """Consolidate the final checkpoint into a Hugging Face directory next to the checkpoints."""

    def __post_init__(self) -> None:
        positive(self, "keep_last", "sigterm_grace_seconds")
        positive(self, "every_n_steps", "max_failures", "every_minutes", allow_zero=True)
        if self.every_minutes and self.every_minutes < MIN_CHECKPOINT_MINUTES:
            raise FieldError("every_minutes", self.every_minutes,
                             f"must be 0 (by steps only) or >= {MIN_CHECKPOINT_MINUTES:g} (a checkpoint is not free)")
        one_of(self, "on_existing_run", ON_EXISTING_RUN)
        if self.run_name and not re.fullmatch(r"(?a)[A-Za-z0-9][A-Za-z0-9._-]{0,127}", self.run_name):
            raise FieldError("run_name", self.run_name, "may hold only letters, digits, '.', '_' and '-'")
        if self.storage_path and (problem := storage_problem(self.storage_path)):
            raise FieldError("storage_path", self.storage_path, problem)
        s3_problem(self, "storage_path")


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    every_n_steps: int = 0
    """0 = only before (step 0) and after training."""
    max_batches: int = 8
    """Held-out batches per rank each evaluation reads, at most."""
    exact_match: bool = False
    """Generation-based exact match on the held-out conversations' last answers (conversation
    data: chat, alpaca, sharegpt, or a Hugging Face dataset of those)."""
    benchmarks: tuple[str, ...] = ()
    """Benchmark tasks scored before (the base model) and after training, sharded over the
    workers (training/evaluation.py): a shipped task's name (training/assets/benchmarks/) or a
    local ``.jsonl`` file of ``{"question", "choices", "answer"}`` (multiple choice by
    log-likelihood: acc, acc_norm) or ``{"question", "answer"}`` (greedy generation: exact_match)."""
    benchmark_max_questions: int = 0
    """Questions per task at most (0: all)."""

    def __post_init__(self) -> None:
        positive(self, "every_n_steps", allow_zero=True)
        positive(self, "max_batches")
        positive(self, "benchmark_max_questions", allow_zero=True)
        for i, entry in enumerate(self.benchmarks):
            _, path = benchmark_task(entry)
            if entry not in SHIPPED_BENCHMARKS and (not entry.endswith(".jsonl") or not path.is_file()):
                raise FieldError(f"benchmarks[{i}]", entry, f"is neither a shipped task ({', '.join(SHIPPED_BENCHMARKS)}) "
                                                            "nor an existing .jsonl file")


@dataclass(frozen=True, kw_only=True, slots=True)
class EvidenceConfig:
    require_transport: str = "any"
    """Fail fast unless NCCL's inter-node transport is this (``efa`` on EKS)."""

    def __post_init__(self) -> None:
        one_of(self, "require_transport", TRANSPORTS)


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
    rewards_accuracy_min: float = 0.0
    """DPO: the held-out reward accuracy after training (share of pairs whose chosen answer gets
    the higher reward) at least this; 0.5 is chance."""
    benchmarks: Mapping[str, float] = field(default_factory=dict)
    """Benchmark scores after training at least these: ``{"<task>.<metric>" = share}``, e.g.
    ``{"tiny-arith.acc" = 0.5}`` (``eval.benchmarks`` names the tasks; metrics: acc, acc_norm,
    exact_match)."""
    transport: str = "any"
    """NCCL's transport of the finished run must be this (a miss is an execution failure)."""

    def __post_init__(self) -> None:
        positive(self, "eval_loss_after_max", "improvement_min", "exact_match_min", "tokens_per_s_min",
                 "rewards_accuracy_min", allow_zero=True)
        for name in ("exact_match_min", "rewards_accuracy_min"):
            if getattr(self, name) > 1:
                raise FieldError(name, getattr(self, name), "must be a share between 0 and 1")
        for key, value in self.benchmarks.items():
            task, _, metric = key.rpartition(".")
            if not task or metric not in BENCHMARK_METRICS:
                raise FieldError(f"benchmarks.{key}", value, f"is not '<task>.<metric>' (metrics: {', '.join(BENCHMARK_METRICS)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise FieldError(f"benchmarks.{key}", value, "must be a share between 0 and 1")
        one_of(self, "transport", TRANSPORTS)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrackingConfig:
    """Where the driver logs the run besides storage (training/metric_sinks/mlflow.py)."""
    mlflow_uri: str = ""
    """MLflow tracking server: ``http(s)://host[:port]`` or a SageMaker managed MLflow ARN
    (``arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>``, SigV4-signed with
    the pod's role). Empty: ``MLFLOW_TRACKING_URI`` from the environment, else no MLflow."""
    mlflow_experiment: str = ""
    """The run's experiment (empty: ``MLFLOW_EXPERIMENT_NAME``, else the job's name)."""

    def __post_init__(self) -> None:
        problem = tracking_uri_problem(self.mlflow_uri) if self.mlflow_uri else None
        if problem:
            raise FieldError("mlflow_uri", self.mlflow_uri, problem)


@dataclass(frozen=True, kw_only=True, slots=True)
class NetcheckConfig:
    """What a ``kind = "netcheck"`` job measures (training/netcheck/): collective bus bandwidth
    for message sizes from ``min_bytes`` to ``max_bytes``, doubling (nccl-tests' ``-b -e -f 2``)."""
    min_bytes: int = 1 << 20
    """Smallest message, bytes."""
    max_bytes: int = 1 << 28
    """Largest message, bytes (<= 4 GiB)."""
    iters: int = 20
    """Timed collectives per size."""
    warmup_iters: int = 5
    """Untimed collectives per size first (connections, allocator)."""
    link_gbps: float = 0.0
    """The node's nominal network limit in Gbit/s; the charts set it from environment/instances.py
    (0 = unknown: no link criterion)."""
    min_link_fraction: float = 0.5
    """Verdict: inter-node all-reduce bus bandwidth at least this share of ``link_gbps``."""
    compare_socket: bool = True
    """Run a second time forced to NCCL's socket transport; verdict: EFA must beat it."""
    run_first: bool = False
    """A training job measures the network before it trains (the smoke job, so the pipeline's
    Smoke stage catches an image that slows the network); a rejected netcheck fails the run."""

    def __post_init__(self) -> None:
        positive(self, "min_bytes", "max_bytes", "iters", "link_gbps", "min_link_fraction",
                 "warmup_iters", allow_zero=True)
        positive(self, "min_bytes", "iters")
        if self.max_bytes < self.min_bytes or self.max_bytes > 1 << 32:
            raise FieldError("max_bytes", self.max_bytes, f"must be between min_bytes ({self.min_bytes}) and 4294967296")
        if self.min_link_fraction > 1:
            raise FieldError("min_link_fraction", self.min_link_fraction, "must be a share between 0 and 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class RayJobConfig:
    """How Kubernetes runs the job as a KubeRay RayJob (read by charts/, ignored by the job)."""
    active_deadline_minutes: int = 240
    """RayJob ``activeDeadlineSeconds`` / 60: a hung job stops paying for GPUs after this."""
    backoff_limit: int = 0
    """RayJob ``backoffLimit``: whole-job retries, each on a NEW RayCluster (resumes from the
    last checkpoint in storage), after ANY failure, deterministic ones too; none by default.
    Only a job's own cluster retries (KubeRay refuses it with ``clusterSelector``). Worker
    failures inside a run are ``checkpoint.max_failures``."""
    ttl_seconds_after_finished: int = 300
    """Seconds the finished job's cluster stays up for ``kubectl logs`` before it is deleted. With
    ``[queueing]`` the next queued job waits for its nodes meanwhile: the charts refuse more than
    its pre-running deadline less a scale-up (charts/jobs.py)."""

    def __post_init__(self) -> None:
        positive(self, "active_deadline_minutes")
        positive(self, "backoff_limit", "ttl_seconds_after_finished", allow_zero=True)
        for name, value, limit in (("active_deadline_minutes", self.active_deadline_minutes, INT32_MAX // 60),
                                   ("backoff_limit", self.backoff_limit, INT32_MAX),
                                   ("ttl_seconds_after_finished", self.ttl_seconds_after_finished, INT32_MAX)):
            if value > limit:
                raise FieldError(name, value, f"must be <= {limit} (the RayJob field is a 32-bit integer)")
