"""The plan search: the fastest plan that fits, for a job on its node group.

A plan is the settings of :data:`training.config_checks.PLAN_SETTINGS`: sharding (full, hybrid,
none), accumulation (sharded per micro batch, or local with one reduce-scatter per step),
activation checkpointing (none, every block, every k-th block for k in :data:`CHECKPOINT_EVERY`),
parameters kept gathered through the step, micro batch size, the gradient reduce dtype, CPU
offload, and per-block torch.compile where ``make gpu-check`` measured a compiled block on this
GPU type (:func:`compile_note`). For each candidate the job's config accepts:

- MEMORY per GPU (and host memory per node under offload): the job's own code measured under
  fake tensors (bench/bench_full_size_plan.py, published in measured_plan.json: the cache, keyed
  by what changes memory, :func:`raytrain_eks.planning.measured_plan.job_plan`), else the
  analytic model (:mod:`raytrain_eks.planning.memory_estimate`). The analytic model prunes first:
  a candidate it puts more than :data:`PRUNE_SLACK` over the usable memory is never measured.
- STEP as a range (:func:`raytrain_eks.planning.step_model.predict`): the traced micro batch of
  its sequence, micro batch, checkpointing and LoRA (every k-th block: the recompute of
  ``L // k`` of the L blocks, :func:`raytrain_eks.planning.step_model.partial_checkpointing`),
  the collectives measured for that plan or
  counted from FSDP2's rule (:func:`collectives`), and under offload the host<->GPU copies and
  the host AdamW at the measured CPU rate (:func:`host_terms`).

The pick is the candidate fastest at the SLOW end of its range among those whose MEASURED memory
fits (the measured peak + the CUDA/NCCL overhead + 10 % for fragmentation <= the GPU's usable
memory; host memory <= the worker pod's): an estimate never decides a plan. Unmeasured
candidates faster than the pick are shown with what measures them
(``bench/bench_plan_search.py --measure``). Settings in ``parallel.pinned`` stay as written.

The last section is the other half of choosing a plan: for a job whose written plan does not fit,
the change that would make it fit (:func:`advise`), and for one that fits with room, the faster
settings that still fit (:func:`spare_memory`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Callable

from raytrain_eks.planning.memory_estimate import estimate_for_job, lora_options
from training.config import JobConfig
from training.config_checks import JobConfigError, PLAN_SETTINGS
from training.config_sections import TransformConfig
from training.flops import ModelShapes

PRUNE_SLACK = 1.15
"""A candidate whose analytic memory is more than this over the usable memory is pruned before
any measurement (the analytic model is within ~10 % of the measured peaks of the shipped plans:
docs/jobs.md)."""
MICRO_BATCH_SIZES = (1, 2, 4)
CHECKPOINT_EVERY = (1, 2, 3, 4)
"""``parallel.checkpoint_every`` values searched with checkpointing on: every block, then every
2nd to 4th (a quarter of the recompute; beyond it the saved activations approach no
checkpointing's)."""
TERM_GROUPS = {
    "GEMM": ("gemm_s", "attention_s"),
    "memory-bound kernels": ("elementwise_s", "fsdp_copies_s", "optimizer_s"),
    "host work": ("host_optimizer_s",),
}
"""The model's terms by what bounds them; exposed collectives are split by link (:func:`dominant`)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan: the values of :data:`PLAN_SETTINGS`."""

    strategy: str
    accumulation: str
    activation_checkpointing: bool
    keep_params_gathered: bool
    grad_reduce_dtype: str
    cpu_offload: bool
    micro_batch_size: int
    checkpoint_every: int = 1
    compile: bool = False

    def label(self) -> str:
        checkpointing = ("no checkpointing" if not self.activation_checkpointing else "checkpointing"
                         if self.checkpoint_every == 1 else f"checkpointing every {self.checkpoint_every} blocks")
        parts = [self.strategy, f"{self.accumulation} accumulation", checkpointing, f"micro batch {self.micro_batch_size}"]
        parts += ["kept gathered"] * self.keep_params_gathered + ["bf16 reduce"] * (self.grad_reduce_dtype == "bfloat16")
        parts += ["cpu offload"] * self.cpu_offload + ["compiled blocks"] * self.compile
        return ", ".join(parts)


def current(job) -> Candidate:
    """The plan the job file writes."""
    p = job.parallel
    return Candidate(strategy=p.strategy, accumulation=p.accumulation, activation_checkpointing=p.activation_checkpointing,
                     keep_params_gathered=p.keep_params_gathered, grad_reduce_dtype=p.grad_reduce_dtype,
                     cpu_offload=p.cpu_offload, micro_batch_size=job.train.micro_batch_size,
                     checkpoint_every=p.checkpointed_every, compile=p.compile)


def apply(job, candidate: Candidate, pod_cpu: int = 0):
    """``job`` with ``candidate``'s settings (a JobConfigError when the config refuses them).
    An offload plan's workers get the CPUs of their pod (``pod_cpu`` / workers per node): its
    AdamW runs on the host, and Ray sets a worker's OMP_NUM_THREADS to its CPUs."""
    values = {k: getattr(candidate, k) for k in PLAN_SETTINGS if k != "micro_batch_size"}
    if candidate.cpu_offload and pod_cpu:
        values["cpus_per_worker"] = float(max(1, pod_cpu // job.parallel.workers_per_node))
    return dataclasses.replace(job, parallel=dataclasses.replace(job.parallel, **values),
                               train=dataclasses.replace(job.train, micro_batch_size=candidate.micro_batch_size))


def overrides(job, chosen) -> list[str]:
    """``section.key=value`` lines that turn ``job`` into ``chosen`` (a JobConfig): what submit
    hands the job (the RayJob's entrypoint carries them as ``--set``)."""
    out = []
    for section, names in (("parallel", [*PLAN_SETTINGS, "cpus_per_worker"]), ("train", ["micro_batch_size"])):
        for name in names:
            if not hasattr(getattr(job, section), name):
                continue
            before, after = getattr(getattr(job, section), name), getattr(getattr(chosen, section), name)
            if name == "checkpoint_every" and not chosen.parallel.activation_checkpointing:
                continue  # no checkpointing: k changes nothing (ParallelConfig.checkpointed_every)
            if before != after:
                text = str(after).lower() if isinstance(after, bool) else (f'"{after}"' if isinstance(after, str) else f"{after:g}")
                out.append(f"{section}.{name}={text}")
    return out


def candidates(job, compile_measured: bool = False) -> list[Candidate]:
    """Every plan the job's config accepts, the pinned settings as written. Compiled blocks only
    where ``compile_measured`` (``make gpu-check`` timed a compiled block on this GPU type)."""
    p, world = job.parallel, job.parallel.num_workers
    strategies = ["full_shard", "no_shard"] + (["hybrid_shard"] if job.num_nodes >= 2 else [])
    choices = {"strategy": strategies, "accumulation": ["sharded", "local"], "activation_checkpointing": [False, True],
               "checkpoint_every": list(CHECKPOINT_EVERY),
               "keep_params_gathered": [False, True], "grad_reduce_dtype": ["float32", "bfloat16"],
               "cpu_offload": [False, True], "compile": [False, True] if compile_measured else [False],
               "micro_batch_size": [m for m in MICRO_BATCH_SIZES if job.train.global_batch_size % (world * m) == 0]}
    written = current(job)
    for name in p.pinned:
        choices[name] = [getattr(written, name)]
    out = []
    for values in _product(choices):
        candidate = Candidate(**values)
        if not candidate.activation_checkpointing and candidate.checkpoint_every != 1:
            continue  # k means nothing without checkpointing: one plan, k = 1 (ParallelConfig.checkpointed_every)
        accum = job.train.global_batch_size // (world * candidate.micro_batch_size)
        if accum < 2 and (candidate.accumulation == "local" or candidate.keep_params_gathered):
            continue  # the same plan as sharded / regathered with one micro batch
        if candidate.strategy == "no_shard" and (candidate.keep_params_gathered or candidate.cpu_offload):
            continue  # nothing sharded: nothing to keep gathered; offload of unsharded state is not a plan
        try:
            apply(job, candidate)
        except (JobConfigError, ValueError):
            continue
        out.append(candidate)
    return out


def _product(choices: dict[str, list]) -> list[dict]:
    rows = [{}]
    for name, values in choices.items():
        rows = [{**row, name: value} for row in rows for value in values]
    return rows


def collectives(shapes: ModelShapes, job, trainable: int | None) -> list[dict]:
    """The collectives of one step of ``job``'s plan per micro batch (first, middle, last), as
    bench/bench_full_size_plan.py records them, counted from FSDP2's rule (torch 2.13
    ``_fsdp_collectives.py``): all-gathers of the bf16 parameters (every unit in forward; in
    backward all but the units not resharded after forward: the root and the last block), once
    per step when kept gathered; reduce-scatters of the gradients in the reduce dtype every
    micro batch (sharded) or in the last (local); hybrid shard's replicate all-reduce of each
    shard in the last micro batch. ``trainable``: LoRA's adapters (None: every parameter).
    Checked against the measured rows of the shipped plans (tests/raytrain_eks/planning/test_plan_search.py)."""
    from raytrain_eks.planning.memory_estimate import compute_bytes, shard_group_size

    p = job.parallel
    world, per_node = p.num_workers, p.workers_per_node
    shard = shard_group_size(p.strategy, world, per_node)
    params = shapes.num_params()
    root = shapes.vocab_size * shapes.hidden_size * (1 if shapes.tie_word_embeddings else 2) + shapes.hidden_size
    layer = (params - root) // shapes.num_layers
    c = compute_bytes(job)
    grads = (params if trainable is None else trainable) * (2 if p.grad_reduce_dtype == "bfloat16" else 4)
    accum = job.grad_accum_steps
    out = []
    if shard > 1:
        regather = c * params + c * (params - root - layer)
        kept = p.keep_params_gathered and accum > 1
        out.append({"kind": "all_gather", "group_size": shard, "first_bytes": c * params if kept else regather,
                    "middle_bytes": 0 if kept else regather, "last_bytes": 0 if kept else regather})
        local = p.accumulation == "local" and accum > 1
        out.append({"kind": "reduce_scatter", "group_size": shard, "first_bytes": 0 if local else grads,
                    "middle_bytes": 0 if local else grads, "last_bytes": grads})
    replicas = world // shard
    if replicas > 1:
        out.append({"kind": "all_reduce", "group_size": replicas, "first_bytes": 0, "middle_bytes": 0,
                    "last_bytes": grads // shard})
    for entry in out:
        entry["bytes"] = entry["first_bytes"] + max(0, accum - 2) * entry["middle_bytes"] + entry["last_bytes"]
    return out


def host_terms(shapes: ModelShapes, job, trainable: int | None, figures) -> dict[str, tuple[float, float]]:
    """Offload's terms (none without ``parallel.cpu_offload``), seconds per step (fast, slow):
    every all-gather copies the fp32 shard to the GPU and every reduce-scatter its gradient shard
    back (bench/bench_offload_transfer.py counted them), at the PCIe rates, not hidden (an upper
    bound: a gradient shard added to one already on the host is copied blocking); AdamW on the
    host at the measured rate per million parameters of the shard (bench/bench_host_adamw.py)."""
    from raytrain_eks.planning.memory_estimate import shard_group_size

    p = job.parallel
    if not p.cpu_offload:
        return {}
    shard = shard_group_size(p.strategy, p.num_workers, p.workers_per_node)
    accum = job.grad_accum_steps
    params = shapes.num_params()
    trained = params if trainable is None else trainable
    kept = p.keep_params_gathered and accum > 1
    gathers = 1 if kept else 2 * accum
    reduces = 1 if p.accumulation == "local" and accum > 1 else accum
    h2d = gathers * 4 * params / shard
    d2h = reduces * 4 * trained / shard
    copies = max(h2d, d2h)
    cpus = max(1, int(p.cpus_per_worker))
    rate = figures.host_adamw_rate(cpus, fused=True)
    adamw = trained / shard / 1e6
    return {"offload_copies_s": (copies / (figures.pcie.high * 1e9), copies / (figures.pcie.low * 1e9)),
            "host_optimizer_s": (adamw * rate[0] / 1e3, adamw * rate[1] / 1e3)}


def dominant(prediction: dict, strategy: str, nodes: int) -> str:
    """What bounds the step at the slow end: the largest of GEMM, memory-bound kernels, exposed
    PCIe, exposed EFA and host work. Exposed collectives by link: hybrid and no_shard all-reduce
    across nodes over EFA and gather/reduce-scatter inside the node over PCIe; full shard's one
    ring crosses the EFA link on more than one node (its slower link); offload copies are PCIe."""
    terms = {name: value[1] for name, value in prediction["terms"].items()}
    groups = {name: sum(terms.get(t, 0.0) for t in parts) for name, parts in TERM_GROUPS.items()}
    in_node = terms.get("forward_gathers_s", 0.0) + terms.get("backward_reduce_scatters_s", 0.0)
    across = terms.get("step_all_reduce_s", 0.0)
    if strategy == "full_shard" and nodes > 1:
        across, in_node = across + in_node, 0.0
    groups["exposed PCIe"] = in_node + terms.get("offload_copies_s", 0.0)
    groups["exposed EFA"] = across
    return max(groups, key=groups.get)


@dataclass(kw_only=True)
class Option:
    """One candidate with its memory and step range."""

    candidate: Candidate
    job: object
    required_bytes: int
    host_bytes_per_node: int
    memory_source: str
    """``measured`` (bench/bench_full_size_plan.py) or ``estimated`` (the analytic model)."""
    fits: bool
    prediction: dict | None
    bound: str = ""
    missing: str = ""

    @property
    def slow_s(self) -> float:
        return self.prediction["step_s"][1] if self.prediction else float("inf")

    def range_text(self) -> str:
        if not self.prediction:
            return f"no range ({self.missing})"
        (lo, hi), (mfu_lo, mfu_hi) = self.prediction["step_s"], self.prediction["mfu"]
        return f"{hi:.2f}-{lo:.2f} s/step (slow-fast), MFU {mfu_lo:.2f}-{mfu_hi:.2f}, limited by {self.bound}"


@dataclass(kw_only=True)
class Search:
    options: list[Option]
    """Every candidate that survived the prune, fastest at the slow end first."""
    chosen: Option | None
    """The fastest measured plan that fits (None: none does)."""
    written: Option | None
    """The plan the job file writes."""
    pruned: int
    unmeasured_faster: list[Option]
    compile_note: str

    def top(self, n: int = 3) -> list[Option]:
        return [o for o in self.options if o.fits and o.memory_source in MEASURED][:n]


def search(job, shapes: ModelShapes, group, *, results: list[dict] | None = None, traces: list[dict] | None = None,
           figures=None, measure=None, max_measure: int = 0) -> Search:
    """The search for ``job`` on ``group`` (an environment GPU node group). ``results``: the
    measured plans (default: measured_plan.json); ``measure``: a callable ``(job) -> row`` of
    bench/bench_full_size_plan.py that measures a plan missing from them (the bench passes it;
    the preflight does not: it never spends minutes), at most ``max_measure`` times, fastest
    candidates first."""
    from raytrain_eks.planning import measured_plan, step_model
    from raytrain_eks.planning.gpu_figures import figures_for
    from raytrain_eks.planning.memory_estimate import GIB, estimate_for_job, lora_adapter_params, lora_options, usable_bytes

    results = measured_plan.load() if results is None else results
    traces = step_model.load_traces() if traces is None else traces
    instance = group.instance
    figures = figures or figures_for(instance.gpu_model, instance.network_gbps)
    cluster = measured_plan.Cluster(group.instance_type, job.num_nodes)
    usable, host_limit = usable_bytes(instance.gpu_memory_gib), group.pod_memory_gib * GIB
    lora = lora_options(job)
    trainable = None if lora is None else lora_adapter_params(shapes, lora)
    model = measured_plan.model_name(shapes)
    options, pruned = [], 0
    ratio = figures.compiled_block_ratio
    for candidate in candidates(job, compile_measured=ratio is not None):
        planned = apply(job, candidate, group.pod_cpu)
        estimate = estimate_for_job(planned, shapes)
        if estimate.required > usable * PRUNE_SLACK or estimate.host * planned.parallel.workers_per_node > host_limit * PRUNE_SLACK:
            pruned += 1
            continue
        options.append(_option(planned, candidate, shapes, cluster, figures, traces, results, model, trainable,
                               estimate, usable, host_limit))
    options.sort(key=lambda o: (o.slow_s, o.prediction["step_s"][0] if o.prediction else 0.0))
    if measure is not None:
        spent = 0
        for index, option in enumerate(options):
            if spent >= max_measure:
                break
            if option.memory_source in MEASURED or not option.prediction:
                continue
            row = measure(option.job)
            if row is not None:  # measured on this search's cluster (measured_plan.for_job matches by it)
                row = {"cluster": cluster.to_dict(), **row}
            spent += 1
            if row is not None:
                results = [*results, row]
                options[index] = _option(option.job, option.candidate, shapes, cluster, figures, traces, results, model,
                                         trainable, estimate_for_job(option.job, shapes), usable, host_limit)
        options.sort(key=lambda o: (o.slow_s, o.prediction["step_s"][0] if o.prediction else 0.0))
    chosen = next((o for o in options if o.fits and o.memory_source in MEASURED and o.prediction), None)
    written_candidate = current(job)
    written = next((o for o in options if o.candidate == written_candidate), None)
    faster = [o for o in options if o.memory_source not in MEASURED and o.fits and o.prediction
              and (chosen is None or o.slow_s < chosen.slow_s)][:3]
    return Search(options=options, chosen=chosen, written=written, pruned=pruned, unmeasured_faster=faster,
                  compile_note=compile_note(figures, chosen))


def _option(planned, candidate, shapes, cluster, figures, traces, results, model, trainable, estimate, usable,
            host_limit) -> Option:
    from raytrain_eks.planning import measured_plan, step_model

    found = measured_plan.for_job(planned, shapes, cluster.instance, results)
    source = "measured"
    if not found and candidate.compile:  # compiled blocks: the eager plan's measurement (compile_memory)
        eager = dataclasses.replace(planned, parallel=dataclasses.replace(planned.parallel, compile=False))
        found, source = measured_plan.for_job(eager, shapes, cluster.instance, results), COMPILED_MEMORY
    if found:
        required, host = found["required_bytes"], found["host_bytes_per_gpu"]
    else:
        required, host, source = estimate.required, estimate.host, "estimated"
    host_node = host * planned.parallel.workers_per_node
    fits = required <= usable and host_node <= host_limit
    option = Option(candidate=candidate, job=planned, required_bytes=required, host_bytes_per_node=host_node,
                    memory_source=source, fits=fits, prediction=None)
    key = step_model.trace_key(planned, model) if model else None
    trace = key and step_model.find_trace(traces, **key)
    if not trace:
        option.missing = (f"no trace of {key['model']} seq {key['seq_len']} x micro batch {key['micro_batch_size']}, "
                          f"checkpointing {'on' if key['activation_checkpointing'] else 'off'}"
                          + (f" (every {key['checkpoint_every']}th block needs the traces with and without)"
                             if key["activation_checkpointing"] and key["checkpoint_every"] > 1 else "")
                          + (", LoRA" if key.get("lora") else "") if key else "no published shapes of this model")
        return option
    row = {"strategy": planned.parallel.strategy, "grad_accum_steps": planned.grad_accum_steps,
           "collectives": found["collectives"] if found else collectives(shapes, planned, trainable),
           "trainable_params": trainable, "cpu_offload": planned.parallel.cpu_offload}
    prediction = step_model.predict(trace, row, cluster, shapes, figures,
                                    last_backward_lever=planned.parallel.keep_params_gathered)
    extra = host_terms(shapes, planned, trainable, figures)
    if extra:
        prediction = step_model.with_terms(prediction, extra)
    if candidate.compile:
        prediction = compiled(prediction, figures.compiled_block_ratio)
    option.prediction = prediction
    option.bound = dominant(prediction, planned.parallel.strategy, cluster.nodes)
    return option


COMPILED_MEMORY = "measured eager"
"""A compiled-blocks plan's memory: the same plan's eager measurement (bench/bench_full_size_plan.py
never compiles; fake tensors cannot run inductor). AOTAutograd's min-cut partitioner chooses what a
compiled block saves for backward to minimise the saved bytes, recomputing cheap element-wise
ops rather than saving them (torch 2.13 ``torch/_functorch/partitioners.py``
``min_cut_rematerialization_partition``): ASSUMED no more than eager's."""
MEASURED = ("measured", COMPILED_MEMORY)
"""Memory sources a pick may rest on."""
COMPILE_TERMS = ("gemm_s", "attention_s", "elementwise_s")
"""The micro batch's kernels a compiled block runs (the rest are FSDP2's copies, collectives and
the optimizer, which compile does not touch)."""


def compiled(prediction: dict, ratio: float) -> dict:
    """``prediction`` with the decoder blocks compiled, from ``make gpu-check``'s compiled/eager
    time of one block (forward + backward) on this GPU type, ``ratio``. Fast end: the ratio
    applied to every kernel term (:data:`COMPILE_TERMS`; the root's embedding and loss head are
    not compiled, so this end is optimistic by their share). Slow end: to the memory-bound
    element-wise kernels only (fusion removes their round trips to memory; GEMMs run the same
    kernels). A ratio above 1 (compiled slower) slows both ends the same way."""
    (lo, hi), (mfu_slow, mfu_fast), terms = prediction["step_s"], prediction["mfu"], dict(prediction["terms"])
    fast_cut = sum(terms[t][0] for t in COMPILE_TERMS) * (1 - ratio)
    slow_cut = terms["elementwise_s"][1] * (1 - ratio)
    for name in COMPILE_TERMS:
        fast = terms[name][0] * ratio
        slow = terms[name][1] * (ratio if name == "elementwise_s" else 1.0)
        terms[name] = (round(fast, 3), round(slow, 3))
    new_lo, new_hi = lo - fast_cut, hi - slow_cut
    return {**prediction, "step_s": (round(new_lo, 3), round(new_hi, 3)),
            "mfu": (round(mfu_slow * hi / new_hi, 4), round(mfu_fast * lo / new_lo, 4)), "terms": terms,
            "sources": {**prediction["sources"], "compile": f"compiled/eager block time {ratio:g} (make gpu-check)"}}


def compile_note(figures, chosen: Option | None = None) -> str:
    """Per-block torch.compile is a plan only where ``make gpu-check`` measured a compiled block
    against an eager one on this GPU type (:func:`compiled`). Without that measurement: what it
    would change in ``chosen``'s range, and that it is unmeasured."""
    ratio = getattr(figures, "compiled_block_ratio", None)
    if ratio is not None:
        return (f"parallel.compile: searched; a compiled block ran at {ratio:.2f} x the eager block's time "
                "(make gpu-check's calibration)")
    where = ""
    if chosen is not None and chosen.prediction:
        terms = chosen.prediction["terms"]
        kernels = [sum(terms[t][end] for t in COMPILE_TERMS) for end in (0, 1)]
        elementwise = terms["elementwise_s"]
        where = (f"; in the pick it would act on the blocks' kernels, {kernels[1]:.2f}-{kernels[0]:.2f} s of its "
                 f"{chosen.prediction['step_s'][1]:.2f}-{chosen.prediction['step_s'][0]:.2f} s (slow-fast), mostly on "
                 f"the memory-bound element-wise part, {elementwise[1]:.2f}-{elementwise[0]:.2f} s, which fusion shortens")
    return ("parallel.compile: unmeasured on this GPU type, so not searched (`make gpu-check` times a compiled block "
            "against an eager one and writes raytrain_eks/planning/gpu_calibration.json)" + where)


def render(result: Search, job) -> list[str]:
    """The preflight's lines: the pick against the written plan and the next two."""
    lines = [f"plan search  {len(result.options)} plans priced ({result.pruned} pruned by the analytic memory model); "
             "fastest at the slow end of its range whose measured memory fits"]

    def row(mark: str, option: Option) -> str:
        gib = option.required_bytes / 1024**3
        host = f", host {option.host_bytes_per_node / 1024**3:.0f} GiB/node" if option.host_bytes_per_node else ""
        return (f"  {mark} {option.candidate.label()}: {option.range_text()}; {gib:.1f} GiB/GPU "
                f"({option.memory_source}){host}{'' if option.fits else ' DOES NOT FIT'}")

    top = result.top(3)
    for index, option in enumerate(top):
        lines.append(row("pick" if index == 0 else f"#{index + 1} ", option))
    if result.written and result.written not in top:
        lines.append(row("file", result.written))
    elif not result.written:
        lines.append(f"  file {current(job).label()}: not among the plans priced (pruned or refused)")
    for option in result.unmeasured_faster:
        lines.append(row("?   ", option) + " (memory not measured: bench/bench_plan_search.py --measure)")
    lines.append(f"  {result.compile_note}")
    return lines


# --- When a plan does not fit: the change that would ------------------------------------------
# When a plan does not fit the GPU's memory: the change that would make it fit; when it fits
# with room to spare: the faster settings that still fit (:func:`spare_memory`).
#
# Changes are tried cumulatively, cheapest in throughput first: activation checkpointing, no
# parameters kept gathered across micro batches, full shard (parameters, gradients and AdamW over
# every GPU instead of one node's), micro batch 1, then shorter sequences down to 512. A plan that
# still does not fit is told what keeps it on its nodes (its optimizer state and master weights in
# host memory, ``parallel.cpu_offload``, when the node's worker pod holds them; LoRA adapters
# instead of the whole model) and how many nodes of its GPU type full shard would need. Each candidate is
# sized by the memory model (:mod:`raytrain_eks.planning.memory_estimate`), or by the measured figure where
# bench/bench_full_size_plan.py measured that exact plan (:mod:`raytrain_eks.planning.measured_plan`).


MIN_SEQ_LEN = 512


def _with(job: JobConfig, section: str, **values) -> JobConfig:
    return replace(job, **{section: replace(getattr(job, section), **values)})


def _steps(job: JobConfig) -> list[tuple[str, Callable[[JobConfig], JobConfig]]]:
    p, t = job.parallel, job.train
    steps: list[tuple[str, Callable[[JobConfig], JobConfig]]] = []
    if not p.activation_checkpointing:
        steps.append(("parallel.activation_checkpointing = true", lambda j: _with(j, "parallel", activation_checkpointing=True)))
    if p.keep_params_gathered:
        steps.append(("parallel.keep_params_gathered = false", lambda j: _with(j, "parallel", keep_params_gathered=False)))
    if p.strategy != "full_shard" and p.num_workers > 1:
        steps.append(("parallel.strategy = 'full_shard'", lambda j: _with(j, "parallel", strategy="full_shard")))
    if t.micro_batch_size > 1:
        steps.append(("train.micro_batch_size = 1", lambda j: _with(j, "train", micro_batch_size=1)))
    seq = t.seq_len // 2
    while seq >= MIN_SEQ_LEN:
        steps.append((f"train.seq_len = {seq}", lambda j, s=seq: _with(j, "train", seq_len=s)))
        seq //= 2
    return steps


def advise(job: JobConfig, shapes: ModelShapes, usable: int, gpus_per_node: int,
           required: Callable[[JobConfig], int] | None = None,
           host: Callable[[JobConfig], int] | None = None, host_usable: int = 0) -> str:
    """One phrase: the changes (cumulative) after which the plan fits, or what keeps it on its
    nodes and the nodes it needs. ``host``: a plan's host memory per node under
    ``parallel.cpu_offload``, to fit ``host_usable`` (one worker pod's memory)."""
    size = required or (lambda j: estimate_for_job(j, shapes).required)
    changes: list[str] = []
    candidate = job
    for label, change in _steps(job):
        candidate = change(candidate)
        if label.startswith("train.seq_len") and changes and changes[-1].startswith("train.seq_len"):
            changes[-1] = label
        else:
            changes.append(label)
        if size(candidate) <= usable:
            return "set " + ", ".join(changes) + f" (then ~{size(candidate) / 1024**3:.1f} GiB per GPU)"
    widest = _with(job, "parallel", strategy="full_shard", activation_checkpointing=True, keep_params_gathered=False)
    instead = _on_these_nodes(job, widest, usable, size, host, host_usable)
    more = _more_nodes(job, widest, usable, size, gpus_per_node)
    if not instead:
        return more
    return (f"no setting fits {job.num_nodes} node(s) as it trains: " + " or ".join(instead)
            + ("; else " + more.split(": ", 1)[1] if more.startswith("no setting fits") else f"; {more}"))


def _on_these_nodes(job: JobConfig, widest: JobConfig, usable: int, size: Callable[[JobConfig], int],
                    host: Callable[[JobConfig], int] | None, host_usable: int) -> list[str]:
    """Full shard with checkpointing plus CPU offload, or plus LoRA, where either fits."""
    found = []
    if not job.parallel.cpu_offload and host is not None:
        offload = _with(widest, "parallel", cpu_offload=True)
        if size(offload) <= usable and host(offload) <= host_usable:
            found.append(f"set parallel.cpu_offload = true (~{size(offload) / 1024**3:.1f} GiB per GPU, "
                         f"~{host(offload) / 1024**3:.0f} of {host_usable / 1024**3:.0f} GiB host memory per node)")
    if lora_options(job) is None:
        lora = _with(widest, "model", transforms=(*job.model.transforms, TransformConfig(name="lora")))
        if size(lora) <= usable:
            found.append(f"add [[model.transforms]] name = \"lora\" (adapters only; ~{size(lora) / 1024**3:.1f} GiB per GPU)")
    return found


def _more_nodes(job: JobConfig, widest: JobConfig, usable: int, size: Callable[[JobConfig], int],
                gpus_per_node: int) -> str:
    for nodes in range(job.num_nodes + 1, 65):
        workers = nodes * gpus_per_node
        # the global batch rounded up to a multiple of the wider world (the config requires it;
        # the memory per GPU does not depend on it)
        per_step = workers * widest.train.micro_batch_size
        batch = -(-widest.train.global_batch_size // per_step) * per_step
        bigger = replace(widest, parallel=replace(widest.parallel, num_workers=workers),
                         train=replace(widest.train, global_batch_size=batch))
        if size(bigger) <= usable:
            return (f"no setting fits {job.num_nodes} node(s): full shard with activation checkpointing needs "
                    f"{nodes} nodes (parallel.num_workers = {workers}, ~{size(bigger) / 1024**3:.1f} GiB per GPU)")
    return "no setting fits: the model's sharded state alone exceeds the GPU memory at 64 nodes"


def spare_memory(job: JobConfig, usable: int, required: Callable[[JobConfig], int]) -> list[str]:
    """For a plan that fits: the faster settings it also fits with (activation checkpointing
    off: no recompute; parameters kept gathered across micro batches: one all-gather per step)."""
    notes = []
    candidate = job
    if job.parallel.activation_checkpointing:
        off = _with(candidate, "parallel", activation_checkpointing=False)
        if required(off) <= usable:
            notes.append(f"parallel.activation_checkpointing = false (no recompute; ~{required(off) / 1024**3:.1f} GiB)")
            candidate = off
    if job.grad_accum_steps > 1 and not job.parallel.keep_params_gathered and job.parallel.strategy != "no_shard":
        kept = _with(candidate, "parallel", keep_params_gathered=True)
        if required(kept) <= usable:
            notes.append(f"parallel.keep_params_gathered = true (one all-gather per step; ~{required(kept) / 1024**3:.1f} GiB)")
    return notes
