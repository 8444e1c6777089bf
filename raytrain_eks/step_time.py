"""Time and cost of a job's step on an environment: compute at a stated MFU from the model's
FLOPs, plus the network time of FSDP's collectives through each node's link that the compute
cannot hide; and the strategy ranking built on it. Calibration: for the AWS sample (full shard,
8 L4, seq 128) this model gives ~2 s/step; the sample measured 1.93 s over EFA.
"""
from __future__ import annotations

from environment import Environment
from environment.addons import SCALE_DOWN_UNNEEDED, SCALE_UP_MINUTES
from raytrain_eks import memory_estimate
from raytrain_eks.memory_estimate import usable_bytes
from training import flops
from training.config import JobConfig
from training.config_checks import STRATEGIES

DEFAULT_MFU = 0.30


def _network_bytes_per_node(job: JobConfig, num_params: int, param_bytes: int, strategy: str = "") -> tuple[float, float]:
    """``(gather, reduce)`` bytes through ONE node's network link per optimizer step (ring
    collectives, line rate).

    Gradients are reduced in ``parallel.grad_reduce_dtype``. full_shard reduce-scatters every
    micro batch (training/parallel.py) and gathers the parameters in each micro batch's forward
    and backward, or once per step with ``parallel.keep_params_gathered``; hybrid_shard gathers
    and reduce-scatters inside the node only (PCIe, not counted here) and all-reduces the
    gradients across nodes once per step; no_shard all-reduces them over every rank once."""
    strategy = strategy or job.parallel.strategy
    nodes, w, accum = job.num_nodes, job.parallel.num_workers, job.grad_accum_steps
    reduce_bytes = 2 if job.parallel.grad_reduce_dtype == "bfloat16" and job.parallel.use_gpu else 4
    if nodes < 2:
        return 0.0, 0.0
    if strategy == "full_shard":
        gathers = 1 if accum > 1 and job.parallel.keep_params_gathered else 2 * accum
        return gathers * param_bytes * num_params * (w - 1) / w, accum * reduce_bytes * num_params * (w - 1) / w
    ring = nodes if strategy == "hybrid_shard" else w
    return 0.0, 2 * reduce_bytes * num_params * (ring - 1) / ring


def _exposed_network_s(job: JobConfig, compute_s: float, gather_s: float, reduce_s: float, strategy: str) -> float:
    """Network time the compute cannot hide. Collectives that run in every micro batch overlap
    the whole step (per-block prefetch); those that run once per step are bunched: a gather
    kept for the step hides only behind the first micro batch's forward (1/3 of its compute),
    a once-per-step gradient all-reduce behind the last one's backward (2/3)."""
    accum = job.grad_accum_steps
    if accum <= 1:
        return max(0.0, gather_s + reduce_s - compute_s)
    micro = compute_s / accum
    once_gathered = job.parallel.keep_params_gathered
    per_micro = (0.0 if once_gathered else gather_s) + (reduce_s if strategy == "full_shard" else 0.0)
    bunched = max(0.0, gather_s - micro / 3) if once_gathered else 0.0
    if strategy != "full_shard":
        bunched += max(0.0, reduce_s - 2 * micro / 3)
    return max(0.0, per_micro - compute_s) + bunched


def estimate_time(env: Environment, job: JobConfig, shapes: flops.ModelShapes, mfu: float, strategy: str = "") -> dict:
    g = env.gpu_group(job.parallel.node_group)
    strategy = strategy or job.parallel.strategy
    peak = g.instance.gpu_bf16_tflops
    per_token = flops.training_flops_per_token(shapes, job.train.seq_len)
    per_step = per_token * job.tokens_per_step
    compute_s = per_step / (job.parallel.num_workers * peak * 1e12 * mfu)
    # FSDP gathers parameters in the compute dtype (bf16 on GPU); gradients are reduced in fp32
    param_bytes = memory_estimate.compute_bytes(job)
    gather, reduce = _network_bytes_per_node(job, shapes.num_params(), param_bytes, strategy)
    link = g.instance.network_gbps * 1e9 / 8
    net_bytes, network_s = gather + reduce, (gather + reduce) / link
    exposed_s = _exposed_network_s(job, compute_s, gather / link, reduce / link, strategy)
    step_s = compute_s + exposed_s
    hours = job.train.max_steps * step_s / 3600
    # Paid GPU time beyond the steps: nodes booting for the job, and idle before removal.
    overhead_h = (SCALE_UP_MINUTES + int(SCALE_DOWN_UNNEEDED.rstrip("m"))) / 60
    return {
        "mfu": mfu, "peak_tflops": peak, "flops_per_token": per_token, "flops_per_step": per_step,
        "compute_s": compute_s, "network_bytes_per_node": net_bytes, "network_gbps": g.instance.network_gbps,
        "network_s": network_s, "step_s": step_s, "exposed_network_s": exposed_s,
        "bound": "network" if network_s > compute_s else "compute",
        "tokens_per_hour": job.tokens_per_step / step_s * 3600, "run_hours": hours,
        "hourly_usd": env.hourly_cost_usd, "run_usd": (hours + overhead_h) * env.hourly_cost_usd,
        "overhead_h": overhead_h, "idle_hourly_usd": env.idle_hourly_cost_usd,
        "effective_mfu": mfu * compute_s / step_s, "strategy": strategy,
    }


def strategy_options(env: Environment, job: JobConfig, shapes: flops.ModelShapes, mfu: float) -> list[dict]:
    """Every strategy's step time and memory for this job on this spec, fastest first.

    Fastest = the shortest step (compute plus the network time it cannot hide); among equal
    steps the one with less network time. A strategy whose memory does not fit comes last.
    """
    usable = usable_bytes(env.gpu_group(job.parallel.node_group).instance.gpu_memory_gib)
    options = []
    for strategy in STRATEGIES:
        option = estimate_time(env, job, shapes, mfu, strategy)
        memory = memory_estimate.estimate_for_job(job, shapes, strategy)
        option.update(required_bytes=memory.required, fits=memory.required <= usable)
        options.append(option)
    return sorted(options, key=lambda o: (not o["fits"], round(o["step_s"], 3), o["network_s"]))
