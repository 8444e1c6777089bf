"""Per-GPU memory of an FSDP2 fine-tune, term by term, before any GPU is paid for.

The model (how the job in training/ runs): parameters stored in the job's dtype (fp32
master weights unless ``model.dtype = "bfloat16"``), FSDP2 ``fully_shard`` per decoder layer then
the root, MixedPrecisionPolicy bf16 compute on GPU (c = 2 bytes; 4 on CPU) with fp32 gradient
reduction, AdamW. Terms, in bytes per GPU:

* **parameters** ``P x b`` and **gradients** ``P x b`` (b = 4 for fp32 master weights, 2 for pure
  bf16), divided by the
  shard group: world size (full shard), GPUs per node (hybrid shard) or 1 (no shard);
* **optimizer state**: AdamW's two moments in fp32, ``8 x P``, divided the same way (torch keeps
  them in the parameter dtype, so on bf16 this over-counts by ``4 x P / shard``: the safe side);
* **FSDP working set** (sharded strategies only): the root's gathered parameters (embeddings and
  the tied output layer: the root is not resharded after forward), two decoder layers gathered at
  once (prefetch), and the unsharded fp32 gradients of the root and one layer before reduce-scatter;
* **accumulation** (sharded strategies with ``grad_accum_steps > 1``): every micro-batch
  reduce-scatters into the sharded gradient (training/parallel.py), so nothing beyond the
  working set, unless ``parallel.keep_params_gathered``: then every unit stays gathered from the
  first forward to the last backward, ``P x c``; with ``parallel.accumulation = "local"`` every
  unit's unsharded fp32 gradient sum lives through the step too, ``4 x P`` (trained parameters);
* **activations** saved for backward, per token and layer, in elements of the compute dtype:
  ``11 h + 4 i + 3 kv`` (two RMSNorms with their fp32 upcast, q/k/v before and after rotary,
  the attention output, SwiGLU's gate, up, SiLU and product; SDPA/flash attention keeps no
  ``seq x seq`` scores). With activation checkpointing per layer: the layer inputs (``h`` per
  layer) plus ONE layer's full activations, recomputed in backward; of every k-th layer only
  (``parallel.checkpoint_every``): the inputs of those ``L // k``, the full activations of the
  others, plus one recomputed layer's;
* **logits**: the output layer runs on target positions only and the cross-entropy in chunks
  (training/model.py): at most ``tokens x vocab x 2c`` (the compute-dtype logits and their
  gradient; every token a target) plus ONE chunk's fp32 logits and gradient,
  ``CE_CHUNK_TOKENS x vocab x 8``;
* **overhead**: CUDA context, NCCL buffers and cuBLAS workspaces, a flat 1.5 GiB.

Two variants change the sharded terms:

* ``parallel.cpu_offload`` (FSDP2's CPUOffloadPolicy): parameters, gradients and optimizer state
  leave the GPU for host memory (:attr:`MemoryEstimate.host`, per GPU): those three, the
  foreach AdamW step's one temporary per parameter (``4 x P``), a checkpoint's pinned copy of
  parameters and optimizer state, and the pinned allocator's power-of-two rounding of every
  parameter and gradient shard (:func:`pinned_host_bytes`: 1.9x for Qwen2.5-7B's on 8 GPUs); the
  FSDP working set stays. The measured plan
  (bench/bench_offload_transfer.py) replaces this where it exists;
* a ``lora`` model transform: the frozen base in its ``base_dtype`` (bf16: 2 bytes), gradients
  and AdamW state only for the fp32 adapters (:func:`lora_adapter_params`), and no unsharded
  gradient of the frozen weights in the working set.

The sum is compared with the usable memory of the GPU (its nominal size less 7 % for the driver)
after a 10 % allowance for allocator fragmentation.
"""
from __future__ import annotations

from dataclasses import dataclass

from training.config import JobConfig
from training.flops import HF_REQUIRED_KEYS, ModelShapes
from training.model_config import CE_CHUNK_TOKENS, ModelConfigError, read_model_config

GIB = 1024**3
OVERHEAD_BYTES = int(1.5 * GIB)
FRAGMENTATION = 1.10
USABLE_FRACTION = 0.93

class ShapesUnknown(ValueError):
    """The model's shapes cannot be found (one-line message). ``unreachable``: only because
    S3 does not answer from here (no credentials, no network), not because the model is wrong."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def shapes_for_job(job: JobConfig) -> tuple[ModelShapes, str]:
    """The model's shapes and where they came from: the ``config.json`` at ``model.path``
    (a local directory or an ``s3://`` prefix, read by :func:`training.model_config.read_model_config`,
    the reader the job's own checks use), else ``model.config`` (Qwen2Config keyword arguments,
    transformers' defaults for the rest). No table of known names: a hub id has no config.json
    here, and is refused with how to give one."""
    path = job.model.path
    if path:
        try:
            config = read_model_config(path, job.source)
        except ModelConfigError as err:
            raise ShapesUnknown(str(err), unreachable=path.startswith("s3://") and "cannot read" in str(err)) from None
        if config is None:
            raise ShapesUnknown(
                f"{job.source}: model.path: {path!r} has no readable config.json here (a hub id is not downloaded "
                "before the run): upload the model to s3://<bucket>/models/<name>/ or point model.path at a local "
                "folder holding its config.json")
        return ModelShapes.from_hf_config(config), f"{path}/config.json"
    config = {"model_type": "qwen2", **dict(job.model.config)}
    if all(key in config for key in HF_REQUIRED_KEYS):
        return ModelShapes.from_hf_config(config), "model.config"
    from transformers import Qwen2Config  # only when the config leans on Qwen2Config's defaults (slow import)

    return ModelShapes.from_hf_config(Qwen2Config(**dict(job.model.config))), "model.config (+ Qwen2Config defaults)"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """Bytes per GPU, term by term (see the module docstring)."""

    parameters: int
    gradients: int
    optimizer: int
    fsdp_working_set: int
    accumulation: int
    activations: int
    logits: int
    overhead: int
    activations_without_checkpointing: int
    activations_with_checkpointing: int
    shard_group: int
    activation_checkpointing: bool
    host: int = 0
    """Host bytes per GPU that ``parallel.cpu_offload`` keeps there (0 without it)."""
    reference: int = 0
    """DPO's frozen reference copy of a full fine-tune, sharded like the parameters (no gradients,
    no optimizer state); 0 for other objectives and for LoRA, whose reference is the same model
    with its adapters off (training/objectives/dpo.py). Its forward runs under no_grad: it saves
    no activations beside the policy's."""

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.fsdp_working_set + self.accumulation
                + self.activations + self.logits + self.overhead + self.reference)

    @property
    def required(self) -> int:
        """Total plus the fragmentation allowance: what must fit in the usable memory."""
        return int(self.total * FRAGMENTATION)

    def rows(self) -> list[tuple[str, int]]:
        act = "activations (checkpointed)" if self.activation_checkpointing else "activations"
        return [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer (AdamW fp32)", self.optimizer), ("FSDP gathered working set", self.fsdp_working_set),
                ("accumulation (kept gathered, local sum)", self.accumulation),
                (act, self.activations), ("logits + loss", self.logits), ("CUDA/NCCL overhead", self.overhead)] + (
                    [("DPO reference (frozen copy)", self.reference)] if self.reference else [])


def usable_bytes(gpu_memory_gib: float) -> int:
    """Usable bytes of a GPU of ``gpu_memory_gib`` (environment/instances.py): an L4 (24) gives 22.3 GiB,
    about what torch reports as its total (23,034 MiB)."""
    return int(gpu_memory_gib * GIB * USABLE_FRACTION)


def shard_group_size(strategy: str, world_size: int, workers_per_node: int) -> int:
    return {"full_shard": world_size, "hybrid_shard": min(workers_per_node, world_size), "no_shard": 1}[strategy]


def pinned_host_bytes(nbytes: int) -> int:
    """The host memory a PINNED allocation of ``nbytes`` takes: torch 2.13's CachingHostAllocator
    rounds every block up to the next power of two (ATen/core/CachingHostAllocator.h:300-309;
    ``pinned_max_round_threshold`` is unlimited by default, c10/core/AllocatorConfig.h:361).
    ``CPUOffloadPolicy(pin_memory=True)`` makes one such allocation per parameter (its padded
    shard, ``_fsdp_param.py``:312-315 ``pin_memory()``) and one per gradient shard it copies to the
    host (``_fsdp_collectives.py``:729-743 ``.to("cpu", non_blocking=True)``)."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def pinned_rounding(shard_bytes) -> int:
    """What :func:`pinned_host_bytes` adds over the tensors' own bytes, one allocation each."""
    return sum(pinned_host_bytes(b) - b for b in shard_bytes)


def _offloaded_shards(shapes: ModelShapes, shard: int, param_bytes: int, full: bool) -> list[int]:
    """Bytes of each pinned allocation of one rank under ``parallel.cpu_offload``: every weight
    matrix's padded row shard (FSDP2 shards dim 0), and with ``full`` (all parameters trained)
    its gradient shard too; norms and biases are too small to matter."""
    in_out = list(_projection_dims(shapes).values()) * shapes.num_layers
    in_out += [(shapes.hidden_size, shapes.vocab_size)] * (1 if shapes.tie_word_embeddings else 2)
    shards = [-(-rows // shard) * cols * param_bytes for cols, rows in in_out]  # a weight is [out, in]
    return shards * 2 if full else shards


def _projection_dims(shapes: ModelShapes) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each projection of a decoder layer, by module name."""
    h, i = shapes.hidden_size, shapes.intermediate_size
    q, kv = shapes.num_heads * shapes.attention_head_dim, shapes.num_kv_heads * shapes.attention_head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_adapter_params(shapes: ModelShapes, options: dict) -> int:
    """Parameters of the ``lora`` transform's adapters: ``rank x (in + out)`` per targeted
    projection per layer (training/model_transforms/lora.py; its defaults where not given)."""
    from training.model_transforms.lora import settings

    opts = settings(dict(options))
    dims = _projection_dims(shapes)
    per_layer = sum(opts["rank"] * sum(dims[t]) for t in opts["targets"] if t in dims)
    return shapes.num_layers * per_layer


def estimate_memory(shapes: ModelShapes, *, strategy: str, world_size: int, workers_per_node: int,
                    seq_len: int, micro_batch_size: int, activation_checkpointing: bool,
                    param_bytes: int = 4, compute_bytes: int = 2, grad_accum_steps: int = 1,
                    keep_gathered: bool = False, cpu_offload: bool = False,
                    trainable: int | None = None, local_accumulation: bool = False,
                    checkpoint_every: int = 1) -> MemoryEstimate:
    """Per-GPU memory of one training step at the peak (end of forward / start of backward).
    ``trainable``: the trained parameters when they are not all of them (LoRA's fp32 adapters,
    the rest frozen at ``param_bytes``)."""
    shard = shard_group_size(strategy, world_size, workers_per_node)
    n = shapes.num_params()
    h, i = shapes.hidden_size, shapes.intermediate_size
    kv = shapes.num_kv_heads * shapes.attention_head_dim
    tokens = seq_len * micro_batch_size
    root_params = shapes.vocab_size * h * (1 if shapes.tie_word_embeddings else 2) + h
    layer_params = shapes.layer_matmul_params()
    working = accumulation = 0
    if shard > 1:
        unsharded_grads = (root_params + layer_params) * 4 if trainable is None else 0
        working = (root_params + 2 * layer_params) * compute_bytes + unsharded_grads
        if grad_accum_steps > 1 and keep_gathered:
            accumulation = n * compute_bytes
        if grad_accum_steps > 1 and local_accumulation:  # every unit's unsharded fp32 gradient sum
            accumulation += (n if trainable is None else trainable) * 4
    per_token_layer = (11 * h + 4 * i + 3 * kv) * compute_bytes
    full = tokens * shapes.num_layers * per_token_layer
    stored = shapes.num_layers // checkpoint_every  # blocks k, 2k, ... (training/parallel.py)
    checkpointed = (tokens * stored * h * compute_bytes + tokens * (shapes.num_layers - stored) * per_token_layer
                    + tokens * per_token_layer)
    logits = tokens * shapes.vocab_size * 2 * compute_bytes + min(tokens, CE_CHUNK_TOKENS) * shapes.vocab_size * 8
    trained = n if trainable is None else trainable
    parameters = (n * param_bytes if trainable is None else n * param_bytes + trainable * 4) // shard
    gradients = trained * (param_bytes if trainable is None else 4) // shard
    optimizer = 8 * trained // shard
    host = 0
    if cpu_offload:  # the three sharded terms live in host memory, with the step's temporary and a staged copy
        host = parameters + gradients + optimizer + 4 * trained // shard + parameters + optimizer
        host += pinned_rounding(_offloaded_shards(shapes, shard, param_bytes, full=trainable is None))
        parameters = gradients = optimizer = 0
    return MemoryEstimate(
        parameters=parameters, gradients=gradients, optimizer=optimizer,
        fsdp_working_set=working, accumulation=accumulation, activations=checkpointed if activation_checkpointing else full,
        logits=logits, overhead=OVERHEAD_BYTES, activations_without_checkpointing=full,
        activations_with_checkpointing=checkpointed, shard_group=shard,
        activation_checkpointing=activation_checkpointing, host=host)


def estimate_for_job(job: JobConfig, shapes: ModelShapes, strategy: str | None = None) -> MemoryEstimate:
    """The job's plan (``strategy``: another sharding strategy for the same job)."""
    import dataclasses

    p, t = job.parallel, job.train
    lora = lora_options(job)
    estimate = estimate_memory(shapes, strategy=strategy or p.strategy, world_size=p.num_workers, workers_per_node=p.workers_per_node,
                           seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                           activation_checkpointing=p.activation_checkpointing,
                           param_bytes=storage_bytes(job), compute_bytes=compute_bytes(job),
                           grad_accum_steps=job.grad_accum_steps, keep_gathered=p.keep_params_gathered,
                           cpu_offload=p.cpu_offload, local_accumulation=p.accumulation == "local",
                           checkpoint_every=p.checkpointed_every,
                           trainable=None if lora is None else lora_adapter_params(shapes, lora))
    if t.objective == "dpo" and lora is None:
        frozen = shapes.num_params() * storage_bytes(job) // estimate.shard_group
        estimate = dataclasses.replace(estimate, reference=0 if p.cpu_offload else frozen,
                                       host=estimate.host + (frozen if p.cpu_offload else 0))
    return estimate


def lora_options(job: JobConfig) -> dict | None:
    """The job's ``lora`` transform options, or None when it trains the whole model."""
    return next((dict(t.options) for t in job.model.transforms if t.name == "lora"), None)


def storage_bytes(job: JobConfig) -> int:
    """Bytes per stored (base) parameter: fp32 master weights unless the job asks for pure bf16;
    a LoRA job's frozen base in its ``base_dtype``."""
    lora = lora_options(job)
    if lora is not None:
        from training.model_transforms.lora import settings

        return 2 if settings(lora)["base_dtype"] == "bfloat16" else 4
    return 2 if job.model.dtype == "bfloat16" else 4


def compute_bytes(job: JobConfig) -> int:
    """Bytes per gathered parameter / activation: bf16 on GPU (FSDP mixed precision), fp32 on CPU."""
    return 2 if job.parallel.use_gpu else 4
