"""Figures of the full-size job MEASURED on CPU by the real code (bench/bench_full_size_plan.py),
and the step-time prediction built on them, for the preflight.

The bench builds the model from its config under fake tensors on a fake process group of
2 x g6.12xlarge (8 ranks, 4 per node) and measures peak memory per GPU (FSDP2's memory tracker),
FLOPs executed per micro batch (recompute included) and the bytes of every collective per step.
``bench/bench_full_size_plan.py --publish`` writes them to ``measured_plan.json`` beside this
module; :func:`lookup` finds the measurement of a job, :func:`predict` turns counts into time.

Prediction (per GPU, per optimizer step of ``A`` micro batches):

- compute: FLOPs executed / (peak bf16 x :data:`SUSTAINED_FRACTION`);
- collectives: ring bytes each GPU sends (all-gather and reduce-scatter ``(n-1)/n`` of the
  buffer, all-reduce twice that), over PCIe inside a node (:data:`PCIE_GBYTES_PER_S`) and over
  the node's one EFA link across nodes (shared by the node's GPUs in hybrid shard's replicate
  rings; a world ring crosses it once per node);
- exposed: per micro batch, the collective time its compute cannot hide (links in parallel);
- MFU: model FLOPs (training/flops.py) / (step time x peak);
- ``parallel.cpu_offload`` (bench/bench_offload_transfer.py counted its copies): the larger
  direction's bytes per step at :data:`PCIE_GBYTES_PER_S`, added whole (an upper bound: a
  gradient shard added to one already on the host is copied blocking, torch 2.13
  ``_fsdp_collectives.py`` ``foreach_reduce``). The CPU AdamW step is not in it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from environment.instances import INSTANCE_TYPES
from raytrain_eks.planning.memory_estimate import FRAGMENTATION, OVERHEAD_BYTES

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "full_size_plan.json"
PUBLISHED = Path(__file__).resolve().parent / "measured_plan.json"

SUSTAINED_FRACTION = 0.5
"""Share of the peak bf16 rate the step's kernels sustain on an L4 (its 72 W power cap holds
large bf16 matmuls near half the datasheet peak). An assumption until ``make gpu-check`` measures it."""
PCIE_GBYTES_PER_S = 12.0
"""Ring bandwidth per GPU inside a g6.12xlarge (L4s on PCIe Gen4 x16, no NVLink: NCCL goes
through host memory). An assumption, stated so a measurement can replace it."""

MODEL_CONFIGS: dict[str, dict] = {
    "Qwen2.5-0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),
    "Qwen2.5-3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    "Qwen2.5-14B": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                        rms_norm_eps=1e-6, tie_word_embeddings=False),
}
"""The models the bench measures (bench/bench_full_size_plan.py, bench/gpu_check.py build them from
these) and the family jobs' tests (jobs/family/): the published config.json of
Qwen/Qwen2.5-{0.5B,1.5B,3B,7B,14B}-Instruct, hand-checked. A job's shapes never come from here: the preflight reads its model's config.json
(raytrain_eks/planning/memory_estimate.py); this only says which measurement a model's shapes match."""


@dataclass(frozen=True, slots=True)
class Cluster:
    instance: str = "g6.12xlarge"
    nodes: int = 2

    @property
    def gpus_per_node(self) -> int:
        return INSTANCE_TYPES[self.instance].gpus

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus_per_node": self.gpus_per_node, "world_size": self.world_size}


def ring_links(entry: dict, strategy: str, cluster: Cluster) -> tuple[float, float]:
    """(PCIe bytes per GPU, EFA bytes per node) of one collective entry."""
    n = entry["group_size"]
    sent = entry["bytes"] * (n - 1) / n * (2 if entry["kind"] == "all_reduce" else 1)
    if cluster.nodes < 2:
        return sent, 0.0
    if n == cluster.world_size and strategy != "hybrid_shard":  # one ring over every GPU
        return sent, sent
    if strategy == "hybrid_shard" and n == cluster.nodes:  # the replicate rings, one per GPU of a node
        return 0.0, sent * cluster.gpus_per_node
    return sent, 0.0


def predict(result: dict, cluster: Cluster, *, sustained: float = SUSTAINED_FRACTION,
            pcie_gbytes_per_s: float = PCIE_GBYTES_PER_S, efa_gbytes_per_s: float | None = None) -> dict:
    """Step time and MFU of a measured variant on ``cluster`` (see the module docstring); the
    rates are the stated points unless given (:func:`predict_range`; EFA: the line rate)."""
    instance = INSTANCE_TYPES[cluster.instance]
    peak = instance.gpu_bf16_tflops * 1e12
    accum = result["global_batch_size"] // (cluster.world_size * result["micro_batch_size"])
    micro_s = result["executed_flops_per_micro_batch"] / (peak * sustained)
    link = (instance.network_gbps / 8 if efa_gbytes_per_s is None else efa_gbytes_per_s) * 1e9
    pcie = efa = 0.0
    exposed = 0.0
    for micro in ("first", "middle", "last"):
        pcie_m = efa_m = 0.0
        for entry in result["collectives"]:
            # measured over 2 micro batches (a schedule whose middle ones repeat the first): first
            per_micro = entry.get(f"{micro}_bytes", entry.get("first_bytes", entry["bytes"] / accum))
            p, e = ring_links({**entry, "bytes": per_micro}, result["strategy"], cluster)
            pcie_m, efa_m = pcie_m + p, efa_m + e
        weight = max(0, accum - 2) if micro == "middle" else 1
        pcie, efa = pcie + weight * pcie_m, efa + weight * efa_m
        exposed += weight * max(0.0, max(pcie_m / (pcie_gbytes_per_s * 1e9), efa_m / link) - micro_s)
    compute_s = accum * micro_s
    copies_s = offload_copy_bytes(result, accum) / (pcie_gbytes_per_s * 1e9)
    step_s = compute_s + exposed + copies_s
    model_flops = accum * result["model_flops_per_micro_batch"]
    return {"grad_accum_steps": accum, "compute_s": round(compute_s, 3), "exposed_comm_s": round(exposed, 3),
            "offload_copy_s": round(copies_s, 3),
            "step_s": round(step_s, 3), "mfu": round(model_flops / (step_s * peak), 4),
            "executed_over_model_flops": round(result["executed_flops_per_micro_batch"]
                                               / result["model_flops_per_micro_batch"], 3),
            "pcie_bytes_per_gpu": int(pcie), "efa_bytes_per_node": int(efa),
            "sustained_fraction": sustained, "pcie_gbytes_per_s": pcie_gbytes_per_s}


def predict_range(result: dict, cluster: Cluster) -> tuple[float, float]:
    """(fast, slow) step seconds of :func:`predict` at the two ends of the published rates the
    step-time model uses (raytrain_eks/planning/gpu_figures.py: bf16 GEMM rate over peak, PCIe and EFA
    bandwidth): the range of a plan with no micro-batch trace (raytrain_eks/planning/step_model.py)."""
    from raytrain_eks.planning.gpu_figures import published

    instance = INSTANCE_TYPES[cluster.instance]
    rates = published(instance.gpu_model, instance.network_gbps)
    fast, slow = (predict(result, cluster, sustained=getattr(rates.gemm, end) / rates.peak_tflops,
                          pcie_gbytes_per_s=getattr(rates.pcie, end), efa_gbytes_per_s=getattr(rates.efa, end))["step_s"]
                  for end in ("high", "low"))
    return fast, slow


def offload_copy_bytes(result: dict, accum: int) -> int:
    """Bytes per step of the larger direction of ``parallel.cpu_offload``'s host<->GPU copies
    (0 without offload): first + (A - 2) x middle + last micro batch, as counted."""
    offload = result.get("offload")
    if not offload:
        return 0
    return int(max(d["first_bytes"] + max(0, accum - 2) * d["middle_bytes"] + d["last_bytes"]
                   for d in (offload["h2d"], offload["d2h"])))


def load(path: Path = PUBLISHED) -> list[dict]:
    """The published measurements (empty when none are)."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    return [{"cluster": data["cluster"], **r} for r in data["results"]]


def model_name(shapes) -> str | None:
    """The measured model with these shapes (training.flops.ModelShapes), if any."""
    for name, config in MODEL_CONFIGS.items():
        if (shapes.hidden_size, shapes.num_layers, shapes.vocab_size) == (
                config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]):
            return name
    return None


def required_bytes(result: dict) -> int:
    """What a measured plan must fit: the tracked tensors' peak plus the CUDA/NCCL overhead and
    the fragmentation allowance the memory model adds (raytrain_eks/planning/memory_estimate.py). With
    ``parallel.cpu_offload``: the GPU's share of the peak and the copies staged on it."""
    offload = result.get("offload")
    peak = offload["gpu_peak_bytes"] + offload["gpu_staging_bytes"] if offload else result["peak_bytes"]
    return int((peak + OVERHEAD_BYTES) * FRAGMENTATION)


def host_bytes_per_gpu(result: dict) -> int:
    """Host memory one GPU's worker holds under ``parallel.cpu_offload`` (0 without): the
    measured host peak (sharded parameters, gradients, AdamW's state and its step's temporaries)
    plus the pinned copy a checkpoint stages, which the job keeps for every later checkpoint
    (training/checkpointing/manager.py ``pinned_stager``), plus the pinned allocator's rounding of
    each parameter and gradient shard (raytrain_eks/planning/memory_estimate.py ``pinned_host_bytes``)."""
    offload = result.get("offload")
    if not offload:
        return 0
    return int(offload["host_peak_bytes"] + offload["checkpoint_staging_bytes"] + offload["pinned_rounding_bytes"])


def for_job(job, shapes, instance: str, results: list[dict] | None = None) -> dict | None:
    """The measurement of ``job``'s exact plan on its cluster (the same GPU type and node count
    as measured), with its prediction for the job's global batch; None when not measured."""
    results = load() if results is None else results
    name = model_name(shapes)
    p, t = job.parallel, job.train
    cluster = Cluster(instance=instance, nodes=job.num_nodes)
    if name is None or not p.use_gpu or instance not in INSTANCE_TYPES or p.num_workers != cluster.world_size:
        return None
    measured_here = [r for r in results if (r.get("cluster") or {}).get("instance") == instance
                     and (r.get("cluster") or {}).get("nodes") == cluster.nodes]
    plan = job_plan(job)
    if plan is None:  # measured: no transform, or LoRA alone
        return None
    found = lookup(measured_here, model=name, **plan)
    if found is None or job.grad_accum_steps < 2:  # measured with accumulation
        return None
    found = {**found, "global_batch_size": t.global_batch_size}
    if t.objective == "dpo":
        found = with_dpo_reference(found)
    return {**found, "prediction": predict(found, cluster), "range_s": predict_range(found, cluster),
            "required_bytes": required_bytes(found), "host_bytes_per_gpu": host_bytes_per_gpu(found)}


def with_dpo_reference(found: dict) -> dict:
    """A measured next-token plan turned into DPO's with LoRA (training/objectives/dpo.py): the
    same memory (the reference is the model with its adapters off, its forward under no_grad saves
    nothing), and each micro batch runs one more forward: a third more model FLOPs executed
    (model FLOPs = 3 x forward) and one more pass of the forward's all-gathers (the measured
    all-gathers are the forward's and, with parameters resharded after forward, the backward's:
    one more of those two). Derived from the measurement, not measured: ``dpo_derived`` says so."""
    forward = found["model_flops_per_micro_batch"] / 3
    passes = 2 if not found.get("keep_gathered") else 1
    collectives = [{**c, **{k: c[k] * (passes + 1) / passes for k in ("bytes", "first_bytes", "middle_bytes",
                                                                       "last_bytes") if k in c}}
                   if c["kind"] == "all_gather" else c for c in found["collectives"]]
    return {**found, "executed_flops_per_micro_batch": found["executed_flops_per_micro_batch"] + forward,
            "model_flops_per_micro_batch": found["model_flops_per_micro_batch"] + forward,
            "collectives": collectives, "dpo_derived": True}


def job_plan(job) -> dict | None:
    """What a measurement of ``job`` is keyed by (:func:`lookup`'s arguments but the model): its
    parallel settings, sequence, micro batch and :func:`lora_key`; None for a job with another
    model transform (never measured). bench/bench_full_size_plan.py ``--jobs`` measures a job's
    plan from the same keys."""
    transforms = [(x.name, dict(x.options)) for x in job.model.transforms]
    if transforms and [n for n, _ in transforms] != ["lora"]:
        return None
    p, t = job.parallel, job.train
    return dict(strategy=p.strategy, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                activation_checkpointing=p.activation_checkpointing, checkpoint_every=p.checkpointed_every,
                reduce_dtype=p.grad_reduce_dtype,
                keep_gathered=p.keep_params_gathered, compile=p.compile, cpu_offload=p.cpu_offload,
                lora=lora_key(transforms[0][1]) if transforms else None, accumulation=p.accumulation)


def published_model(model_path: str) -> str | None:
    """The :data:`MODEL_CONFIGS` entry a model folder holds by its name (``.../Qwen2.5-7B-Instruct``
    is ``Qwen2.5-7B``), or None: how the bench picks a shipped job's model (``--jobs``) and the
    tests put its config.json where the job names it. The preflight itself reads the shapes from
    that file."""
    name = model_path.rstrip("/").rsplit("/", 1)[-1].removesuffix("-Instruct")
    return name if name in MODEL_CONFIGS else None


def lora_key(options: dict) -> dict:
    """What of a LoRA transform's options changes the measured memory, FLOPs and collectives
    (training/model_transforms/lora.py, defaults filled in): alpha only scales."""
    from training.model_transforms.lora import settings

    opts = settings(options)
    return {"rank": opts["rank"], "targets": sorted(opts["targets"]), "dropout": float(opts["dropout"]),
            "base_dtype": opts["base_dtype"]}


def lookup(results: list[dict], *, model: str, strategy: str, seq_len: int, micro_batch_size: int,
           activation_checkpointing: bool, reduce_dtype: str = "float32", keep_gathered: bool = False,
           compile: bool = False, cpu_offload: bool = False, lora: dict | None = None,
           accumulation: str = "sharded", checkpoint_every: int = 1) -> dict | None:
    """The shipped code's measurement of exactly this plan, or None. A row without ``compile``
    was measured uncompiled (bench/bench_full_size_plan.py never compiles); one without
    ``cpu_offload`` without offload; one without ``lora`` training the whole model (else
    :func:`lora_key` of its options); one without ``accumulation`` with sharded accumulation; one
    without ``checkpoint_every`` checkpointed every block (or none)."""
    for r in results:
        if (r["code"], r["model"], r["strategy"], r["seq_len"], r["micro_batch_size"], r["activation_checkpointing"],
                r["reduce_dtype"], r["keep_gathered"], r.get("compile", False), r.get("cpu_offload", False),
                r.get("lora"), r.get("accumulation", "sharded"), r.get("checkpoint_every", 1)) == (
                "after", model, strategy, seq_len, micro_batch_size, activation_checkpointing, reduce_dtype,
                keep_gathered, compile, cpu_offload, lora, accumulation, checkpoint_every):
            return r
    return None


def render(found: dict, *, hand_required: int) -> list[str]:
    """The preflight's lines for a measured plan (:func:`for_job`)."""
    gib, p = 1024**3, found["prediction"]
    comm = ", ".join(f"{c['kind']} over {c['group_size']}: {c['bytes'] / 1e9:.1f} GB" for c in found["collectives"])
    offload = found.get("offload")
    on_gpu = offload["gpu_peak_bytes"] + offload["gpu_staging_bytes"] if offload else found["peak_bytes"]
    lines = [
        "measured   bench/bench_full_size_plan.py (the job's code on fake tensors, fake 2-node process group)",
        f"  peak memory      {on_gpu / gib:.2f} GiB of tensors per GPU; with overhead and fragmentation "
        f"{found['required_bytes'] / gib:.2f} GiB (the hand formula says {hand_required / gib:.2f})",
        f"  FLOPs            executed / model = {p['executed_over_model_flops']:.2f} (recompute and skipped "
        f"logits show); per GPU per step: {comm}",
        f"  predicted step   {found['range_s'][1]:.2f}-{found['range_s'][0]:.2f} s (slow-fast) over the published rates "
        f"(raytrain_eks/planning/gpu_figures.py); its fast end: {p['compute_s']:.2f} compute at {p['sustained_fraction']:.0%} "
        f"of peak + {p['exposed_comm_s']:.2f} exposed collectives"
        + (f" + {p['offload_copy_s']:.2f} host<->GPU copies" if offload else ""),
    ]
    if found.get("dpo_derived"):
        lines.append("  DPO              derived from the next-token measurement, not measured: the same memory, + the "
                     "reference's forward (a third more model FLOPs) and its all-gathers; a preference example is two "
                     "sequences, so a step holds about half the examples of an SFT step at this seq_len and batch")
    if offload:
        accum = p["grad_accum_steps"]
        lines += [
            f"  cpu offload      on the GPU {offload['gpu_peak_bytes'] / gib:.2f} GiB of tensors + "
            f"{offload['gpu_staging_bytes'] / gib:.2f} copies in flight; in host memory {found['host_bytes_per_gpu'] / gib:.2f} "
            "GiB per GPU with a checkpoint's staged copy (bench/bench_offload_transfer.py)",
            f"  copies           {offload_copy_bytes(found, accum) / 1e9:.1f} GB per step in the busier direction at "
            f"{PCIE_GBYTES_PER_S:g} GB/s (ASSUMED), none hidden; the host AdamW step is in the plan search's range (below)",
        ]
    return lines
