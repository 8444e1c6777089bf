"""A job's step time on an environment, by two models.

The hand model (:func:`estimate_time`, :func:`strategy_options`: preflight's time and cost at a
stated MFU, and every strategy ranked): compute at a stated MFU from the model's FLOPs, plus the
network time of FSDP's collectives through each node's link that the compute cannot hide.
Calibration: for the AWS sample (full shard, 8 L4, seq 128) it gives ~2 s/step; the sample
measured 1.93 s over EFA.

The range (:func:`predict`, :func:`for_job`): the GPU step's time, every term from a published or
measured figure.

Inputs, all measured on CPU by the job's own code or published:

- the TRACE of one micro batch (``bench/bench_step_model.py --trace`` runs the model's forward
  and backward under fake tensors and records every GEMM's shape, the attention kernels'
  FLOPs at the data's document lengths, and the bytes every other kernel reads and writes;
  published in :data:`TRACES`);
- the COLLECTIVES of a step, per micro batch, from ``bench/bench_full_size_plan.py``
  (:mod:`raytrain_eks.planning.measured_plan`);
- the RATES of :mod:`raytrain_eks.planning.gpu_figures` (a GEMM-efficiency table by shape, memory
  bandwidth, PCIe and EFA bandwidth), each a range with its source.

Per micro batch: GEMMs at their shape's rate; attention at the GEMM table's rates with the
causal half skipped (FlashAttention-2 skips masked blocks); element-wise kernels at memory
bandwidth (the high end adds a launch floor per kernel); FSDP2's own copies and the optimizer
from the parameter count. Communication is exposed by phase: forward all-gathers hide behind
the forward (1/3 of the compute) but the root's gather runs before anything; reduce-scatters
hide behind the backward (2/3) except the root's, which runs from the final callback: with
``is_last_backward`` True the compute stream waits for it at every micro batch (torch 2.13
``_fsdp_state.py``:421-431), with the lever only at the last; the step's all-reduce runs in the
last backward and the root's part of it is exposed.
"""
from __future__ import annotations

import json
from pathlib import Path

from environment import Environment
from environment.addons import SCALE_DOWN_UNNEEDED, SCALE_UP_MINUTES
from raytrain_eks.planning import memory_estimate
from raytrain_eks.planning.gpu_figures import Figures
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS, Cluster, ring_links
from raytrain_eks.planning.memory_estimate import usable_bytes
from training import flops
from training.config import JobConfig
from training.config_checks import STRATEGIES
from training.flops import ModelShapes

TRACES = Path(__file__).resolve().parent / "step_trace.json"

FSDP_SOURCE = ("torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (foreach_all_gather, "
               "foreach_all_gather_copy_out, foreach_reduce) and torch/optim/adamw.py (fused)")


def load_traces(path: Path | None = None) -> list[dict]:
    """The published traces (:data:`TRACES` unless ``path``; empty when none are)."""
    path = path or TRACES
    return json.loads(path.read_text(encoding="utf-8"))["traces"] if path.is_file() else []


def find_trace(traces: list[dict], *, model: str, kind: str, seq_len: int, micro_batch_size: int,
               activation_checkpointing: bool = False, lora: dict | None = None,
               checkpoint_every: int = 1) -> dict | None:
    """The trace of exactly this micro batch, or None. Checkpointing is part of the key: it runs
    every block's forward again in backward (about a third more GEMMs and element-wise bytes),
    so a trace without it would predict a checkpointed job too fast. A trace without the key
    was made without checkpointing. ``lora`` (:func:`raytrain_eks.planning.measured_plan.lora_key`):
    a LoRA step computes no weight gradient of the frozen base (a third fewer GEMM FLOPs) and its
    MFU counts the FLOPs LoRA executes (training/flops.py ``lora_training_flops_per_token``).
    ``checkpoint_every`` k > 1 (every k-th block checkpointed): :func:`partial_checkpointing`
    of the two traces of this key without and with checkpointing."""
    if activation_checkpointing and checkpoint_every > 1:
        key = dict(model=model, kind=kind, seq_len=seq_len, micro_batch_size=micro_batch_size, lora=lora)
        off, on = find_trace(traces, **key), find_trace(traces, **key, activation_checkpointing=True)
        return partial_checkpointing(off, on, checkpoint_every) if off and on else None
    for trace in traces:
        if (trace["model"], trace["kind"], trace["seq_len"], trace["micro_batch_size"],
                trace.get("activation_checkpointing", False), trace.get("lora")) == (
                model, kind, seq_len, micro_batch_size, activation_checkpointing, lora):
            return trace
    return None


def partial_checkpointing(off: dict, on: dict, every: int) -> dict:
    """The micro batch with every ``every``-th of its L blocks checkpointed, from the traces of the
    same micro batch without checkpointing (``off``) and with every block checkpointed (``on``):
    what ``on`` adds over ``off`` is the recompute of all L blocks' forward (only the blocks are
    checkpointed: training/parallel.py), so this plan adds ``(L // every) / L`` of it to ``off``:
    every GEMM shape's count, the attention FLOPs, the element-wise bytes and kernels. Derived
    from two traces, not traced (``derived`` says so)."""
    layers = MODEL_CONFIGS[off["model"]]["num_hidden_layers"]
    share = (layers // every) / layers

    def blend(a: float, b: float) -> float:
        return a + share * (b - a)

    counts = {tuple(g[:3]): [g[3], 0] for g in off["gemms"]}
    for g in on["gemms"]:
        counts.setdefault(tuple(g[:3]), [0, 0])[1] = g[3]
    return {**off, "activation_checkpointing": True, "checkpoint_every": every,
            "gemms": sorted([*shape, blend(a, b)] for shape, (a, b) in counts.items()),
            "attention_flops": blend(off["attention_flops"], on["attention_flops"]),
            "elementwise_bytes": blend(off["elementwise_bytes"], on["elementwise_bytes"]),
            "kernels": round(blend(off["kernels"], on["kernels"])),
            "derived": f"{layers // every} of {layers} blocks' recompute from the traces without and with checkpointing"}


def _fsdp_bytes(params: int, shard: int, *, gathers: bool, trained: int | None = None) -> float:
    """Bytes FSDP2 moves through memory in one micro batch besides the model's kernels: the
    bf16 gradients cast into the fp32 reduce-scatter input (2 + 4 bytes per trained parameter;
    local accumulation's add to the unsharded fp32 sum moves as much), the output added to the
    held-back sum (3 x 4 per local trained parameter); with a gather, the fp32 shard cast to
    bf16 (4 + 2 per local parameter) and the gathered buffer copied out to the parameters
    (2 x 2 per parameter). ``trained``: LoRA's adapters (None: every parameter)."""
    trained = params if trained is None else trained
    local = params / shard
    moved = 6 * trained + 12 * trained / shard
    return moved + (6 * local + 4 * params if gathers else 0)


def _optimizer_bytes(params: int, shard: int) -> float:
    """Fused AdamW reads parameter, gradient and both moments and writes three (7 x 4 bytes per
    local fp32 parameter); the gradient-norm clip reads the gradient once more (4)."""
    return 32 * params / shard


def _root_params(shapes: ModelShapes) -> int:
    """Parameters of the root FSDP unit: embeddings (+ output layer when untied) and final norm."""
    return shapes.vocab_size * shapes.hidden_size * (1 if shapes.tie_word_embeddings else 2) + shapes.hidden_size


def _comm_s(entries: list[dict], which: str, kind: str, strategy: str, cluster: Cluster, pcie: float, efa: float) -> float:
    """Seconds of one micro batch's collectives of ``kind`` (PCIe and EFA run in parallel)."""
    pcie_b = efa_b = 0.0
    for entry in entries:
        if entry["kind"] == kind:
            # a plan measured over 2 micro batches has no middle one: it repeats the first
            # (the same reading as raytrain_eks/planning/measured_plan.py's predict)
            p, e = ring_links({**entry, "bytes": entry.get(f"{which}_bytes", entry.get("first_bytes", 0))},
                              strategy, cluster)
            pcie_b, efa_b = pcie_b + p, efa_b + e
    return max(pcie_b / (pcie * 1e9), efa_b / (efa * 1e9))


def _bound(trace: dict, measured: dict, cluster: Cluster, shapes: ModelShapes, f: Figures, end: str,
           last_backward_lever: bool, objective_factor: float = 1.0) -> dict:
    """Every term at one end of the range (``end`` = "low": fast rates, "high": slow rates).
    ``objective_factor``: the model's own work per micro batch against the traced (next-token)
    one: DPO's reference forward makes it 4/3 (training/flops.py ``objective_factor``)."""
    fast = end == "low"
    pick = (lambda lo, hi: hi) if fast else (lambda lo, hi: lo)  # the faster rate is the higher one
    gemm_s = objective_factor * sum(count * 2 * m * n * k / (pick(*f.gemm_rate(m, n, k)) * 1e12)
                                    for m, n, k, count in trace["gemms"])
    attention_s = objective_factor * trace["attention_flops"] / 2 / (pick(f.gemm.low, f.gemm.high) * 1e12)
    memory = pick(f.memory.low, f.memory.high) * 1e9
    floor = 0.0 if fast else trace["kernels"] * f.kernel_floor_us.high * 1e-6
    elementwise_s = objective_factor * (trace["elementwise_bytes"] / memory + floor)
    strategy, accum = measured["strategy"], measured["grad_accum_steps"]
    shard = cluster.gpus_per_node if strategy == "hybrid_shard" else cluster.world_size
    params = shapes.num_params()
    pcie, efa = pick(f.pcie.low, f.pcie.high), pick(f.efa.low, f.efa.high)
    entries = measured["collectives"]
    root = _root_params(shapes)
    root_gather_s = 2 * root * (shard - 1) / shard / (pcie * 1e9)
    root_reduce_s = 4 * root * (shard - 1) / shard / (pcie * 1e9)
    nodes = cluster.nodes if strategy == "hybrid_shard" else 1
    root_all_reduce_s = (2 * 4 * root / shard * (nodes - 1) / nodes * cluster.gpus_per_node / (efa * 1e9)
                         if nodes > 1 else 0.0)
    terms = {"gemm_s": 0.0, "attention_s": 0.0, "elementwise_s": 0.0, "fsdp_copies_s": 0.0,
             "forward_gathers_s": 0.0, "backward_reduce_scatters_s": 0.0, "step_all_reduce_s": 0.0}
    for which in ("first", "middle", "last"):
        weight = max(0, accum - 2) if which == "middle" else 1
        gather_s = _comm_s(entries, which, "all_gather", strategy, cluster, pcie, efa)
        fsdp_s = _fsdp_bytes(params, shard, gathers=gather_s > 0, trained=measured.get("trainable_params")) / memory
        compute = gemm_s + attention_s + elementwise_s + fsdp_s
        forward, backward = compute / 3, 2 * compute / 3
        reduce_s = _comm_s(entries, which, "reduce_scatter", strategy, cluster, pcie, efa)
        all_reduce_s = _comm_s(entries, which, "all_reduce", strategy, cluster, pcie, efa)
        exposed_gather = max(gather_s - forward, min(gather_s, root_gather_s)) if gather_s else 0.0
        root_rs = min(reduce_s, root_reduce_s)
        waited = which == "last" or not last_backward_lever
        # the lever: the root's reduce-scatter overlaps the next micro batch's forward
        exposed_reduce = max(0.0, reduce_s - root_rs - backward) + (root_rs if waited else max(0.0, root_rs - forward))
        exposed_all_reduce = 0.0
        if all_reduce_s:
            root_ar = min(all_reduce_s, root_all_reduce_s)
            exposed_all_reduce = max(0.0, all_reduce_s - root_ar - max(0.0, backward - (reduce_s - root_rs))) + root_ar
        for name, value in (("gemm_s", gemm_s), ("attention_s", attention_s), ("elementwise_s", elementwise_s),
                            ("fsdp_copies_s", fsdp_s), ("forward_gathers_s", exposed_gather),
                            ("backward_reduce_scatters_s", exposed_reduce), ("step_all_reduce_s", exposed_all_reduce)):
            terms[name] += weight * value
    # the GPU's AdamW over the trained parameters; under cpu_offload it runs on the host (a term
    # of its own: raytrain_eks/planning/plan_search.py host_terms)
    trained = measured.get("trainable_params") or params
    terms["optimizer_s"] = 0.0 if measured.get("cpu_offload") else _optimizer_bytes(trained, shard) / memory
    step_s = sum(terms.values())
    model_flops = accum * trace["model_flops"] * objective_factor
    return {**terms, "step_s": step_s, "mfu": model_flops / (step_s * f.peak_tflops * 1e12)}


def predict(trace: dict, measured: dict, cluster: Cluster, shapes: ModelShapes, figures: Figures, *,
            last_backward_lever: bool = True, objective_factor: float = 1.0) -> dict:
    """The step's time and MFU as ranges, every term at both ends, and which figures are assumed.

    ``measured`` is a row of :mod:`raytrain_eks.planning.measured_plan` with ``grad_accum_steps``;
    ``last_backward_lever``: the job sets ``is_last_backward`` False on non-last micro batches
    (training/parallel.py does)."""
    low = _bound(trace, measured, cluster, shapes, figures, "low", last_backward_lever, objective_factor)
    high = _bound(trace, measured, cluster, shapes, figures, "high", last_backward_lever, objective_factor)
    return {"step_s": (round(low["step_s"], 3), round(high["step_s"], 3)),
            "mfu": (round(high["mfu"], 4), round(low["mfu"], 4)),  # (slow end's, fast end's)
            "terms": {k: (round(low[k], 3), round(high[k], 3)) for k in low if k not in ("step_s", "mfu")},
            "sources": {**figures.sources(), "fsdp_copies": FSDP_SOURCE,
                        "trace": f"bench/bench_step_model.py --trace ({trace['kind']}, micro batch {trace['micro_batch_size']}, "
                                 f"checkpointing {_checkpointing_text(trace)}, documents {trace['doc_lengths']})"
                                 + (f"; {trace['derived']}" if trace.get("derived") else ""),
                        "collectives": "bench/bench_full_size_plan.py (raytrain_eks/planning/measured_plan.json)"},
            "assumed": figures.assumed(), "measured_step": figures.measured_step, "calibrated": figures.calibrated}


def _checkpointing_text(trace: dict) -> str:
    if not trace.get("activation_checkpointing"):
        return "off"
    every = trace.get("checkpoint_every", 1)
    return "on" if every == 1 else f"every {every}th block"


COMM_TERMS = ("forward_gathers_s", "backward_reduce_scatters_s", "step_all_reduce_s")
"""The terms of :func:`predict` that are exposed communication (collectives no compute hides)."""


def exposed_comm(prediction: dict) -> dict:
    """run.json's ``exposed_comm`` for a :func:`predict` result (label ``predicted``): the exposed
    collectives' seconds per step and their share of the step, each a range over both ends."""
    (step_lo, step_hi), terms = prediction["step_s"], prediction["terms"]
    seconds = [sum(terms[name][end] for name in COMM_TERMS) for end in (0, 1)]
    shares = sorted(round(sec / step, 4) for sec, step in zip(seconds, (step_lo, step_hi)) if step > 0)
    return {"label": "predicted", "share": shares, "seconds": [round(v, 3) for v in seconds],
            "step_s": [step_lo, step_hi], "mfu": list(prediction["mfu"]), "assumed": list(prediction["assumed"]),
            "calibrated": bool(prediction.get("calibrated")),
            "by_phase": {name: list(terms[name]) for name in COMM_TERMS},
            "source": "raytrain_eks/planning/step_model.py, from submit's preflight of this plan (not timed by the job)"}


def render(prediction: dict) -> list[str]:
    """The preflight's lines for a prediction."""
    (lo, hi), (mfu_lo, mfu_hi) = prediction["step_s"], prediction["mfu"]
    terms = ", ".join(f"{k.removesuffix('_s')} {a:.2f}-{b:.2f}" for k, (a, b) in prediction["terms"].items())
    lines = [f"  step range       {hi:.2f}-{lo:.2f} s (slow-fast), MFU {mfu_lo:.2f}-{mfu_hi:.2f} (raytrain_eks/planning/step_model.py)",
             f"    terms (s)      {terms}"]
    lines += [f"    {name:<14} {text}" for name, text in prediction["sources"].items()]
    if prediction["assumed"]:
        lines.append(f"    assumed        {', '.join(prediction['assumed'])}: `make gpu-check` on a GPU measures "
                     "what it can (raytrain_eks/planning/gpu_calibration.json)")
    if prediction["measured_step"]:
        lines.append(f"    measured step  {prediction['measured_step']}")
    return lines


def trace_key(job, model: str) -> dict | None:
    """The trace key of ``job``'s micro batch (None for data the step model has no trace kind of)."""
    from raytrain_eks.planning.measured_plan import lora_key
    from raytrain_eks.planning.memory_estimate import lora_options

    # preference pairs are packed like conversations (whole documents, best fit): the chat trace
    kind = {"chat": "chat", "preference": "chat", "synthetic": "synthetic"}.get(job.data.kind)
    lora = lora_options(job)
    return kind and {"model": model, "kind": kind, "seq_len": job.train.seq_len,
                     "micro_batch_size": job.train.micro_batch_size,
                     "activation_checkpointing": job.parallel.activation_checkpointing,
                     "checkpoint_every": job.parallel.checkpointed_every,
                     "lora": lora_key(lora) if lora is not None else None}


def with_terms(prediction: dict, extra: dict[str, tuple[float, float]]) -> dict:
    """``prediction`` with more terms (fast, slow seconds) added to the step and the MFU scaled
    to the longer step (the same model FLOPs)."""
    (lo, hi), (mfu_slow, mfu_fast) = prediction["step_s"], prediction["mfu"]
    add_lo, add_hi = sum(v[0] for v in extra.values()), sum(v[1] for v in extra.values())
    new_lo, new_hi = lo + add_lo, hi + add_hi
    return {**prediction, "step_s": (round(new_lo, 3), round(new_hi, 3)),
            "mfu": (round(mfu_slow * hi / new_hi, 4), round(mfu_fast * lo / new_lo, 4)),
            "terms": {**prediction["terms"], **{k: (round(a, 3), round(b, 3)) for k, (a, b) in extra.items()}}}


def for_job(job, shapes: ModelShapes, measured: dict, cluster: Cluster, gpu: str, network_gbps: float,
            traces: list[dict] | None = None) -> dict | None:
    """The range for a job whose plan bench/bench_full_size_plan.py measured (``measured``, a
    :func:`raytrain_eks.planning.measured_plan.for_job` result), when a trace of its micro batch exists:
    chat data (packed conversations) or synthetic; None otherwise (:func:`missing` says why)."""
    from raytrain_eks.planning.gpu_figures import figures_for

    key = trace_key(job, measured["model"])
    trace = key and find_trace(load_traces() if traces is None else traces, **key)
    if not trace:
        return None
    row = {**measured, "grad_accum_steps": measured["prediction"]["grad_accum_steps"]}
    # training/parallel.py pulls the lever only where parameters stay gathered between micro batches
    return predict(trace, row, cluster, shapes, figures_for(gpu, network_gbps),
                   last_backward_lever=job.parallel.keep_params_gathered,
                   objective_factor=flops.objective_factor(job.train.objective))


def missing(job, measured: dict, traces: list[dict] | None = None) -> list[str]:
    """The preflight's one line where a measured plan has no range because no trace of its micro
    batch was recorded (its sequence, micro batch or checkpointing), never a range from another
    key's trace; nothing where the data kind has no trace at all or a trace exists."""
    key = trace_key(job, measured["model"])
    if not key or find_trace(load_traces() if traces is None else traces, **key):
        return []
    return [f"  step range       none: {TRACES.name} has no trace of {key['model']} {key['kind']} seq_len = "
            f"{key['seq_len']}, micro_batch_size = {key['micro_batch_size']}, activation_checkpointing = "
            f"{str(key['activation_checkpointing']).lower()}"
            + (f" (every {key['checkpoint_every']}th block: the traces without and with checkpointing)"
               if key["activation_checkpointing"] and key.get("checkpoint_every", 1) > 1 else "")
            + "; `.venv/bin/python bench/bench_step_model.py --trace` "
            "records the micro batches of its PLANS"]


# The hand model: compute at a stated MFU, plus the network time the compute cannot hide.

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
    # DPO's reference forward: 4/3 the FLOPs of a trained token (training/flops.py objective_factor)
    per_token = flops.training_flops_per_token(shapes, job.train.seq_len) * flops.objective_factor(job.train.objective)
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
