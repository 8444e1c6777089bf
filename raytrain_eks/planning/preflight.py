"""Preflight: check a job against the environment before a GPU hour is paid for.

A job with ``parallel.use_gpu = true`` is planned for the spec's primary GPU node group; one
without runs locally on CPU (the demo) and is checked against this machine. Checks:

* world size: workers vs the group's GPUs, workers per node vs GPUs per node (local: CPUs);
* Ray version: the image's (``image.ray_version``) vs every ``rayVersion`` in the synthesized
  manifests under ``dist/`` (when present), and vs the installed Ray for local jobs;
* transport: ``require_transport = "efa"`` needs an EFA interface per node and >= 2 nodes;
* memory per GPU (:mod:`raytrain_eks.planning.memory_estimate`), breakdown printed;
* time and cost as ranges, and the run against its RayJob's deadline
  (:mod:`raytrain_eks.planning.run_time`), every strategy ranked (:mod:`raytrain_eks.planning.step_model`);
* every pod placed on a node (:mod:`raytrain_eks.planning.fit`).

A refused plan prints its report, then ONE line saying why on stderr; the command exits 2.

The command (``add_arguments`` and ``run``, at the end of this module): `raytrain-eks preflight`: check a job against the environment before any spend.

A job is sized to the environment by the charts' own function (charts/jobs.py: plan_job).
Checks world size vs GPUs, the image's Ray version vs the manifests' rayVersion (and the
installed Ray for local jobs), EFA requested vs available, a per-GPU memory estimate with its
breakdown, and the time per step, tokens per hour and cost of the run at a stated MFU. Prints
the report; a refused plan ends with one line on stderr saying why and exits 2.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from charts.jobs import resource_problems
from raytrain_eks.planning.memory_estimate import GIB, MemoryEstimate, ShapesUnknown, estimate_for_job, shapes_for_job, usable_bytes
from raytrain_eks.planning import measured_plan, run_time
from raytrain_eks.planning import step_model
from raytrain_eks.planning.plan_search import advise, spare_memory
from raytrain_eks.planning.step_model import DEFAULT_MFU, estimate_time, strategy_options
from environment import Environment
from environment.image_source import pull_lines
from training.config import JobConfig

_RAY_VERSION = re.compile(r"""["']?rayVersion["']?\s*:\s*["']?([0-9][\w.\-]*)""")


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    name: str
    ok: bool
    message: str
    note: bool = False
    """Informational: printed, never refuses."""


@dataclass(kw_only=True)
class Plan:
    """Everything preflight found; ``refusal`` is the one line when the plan is refused."""

    env: Environment
    job: JobConfig
    checks: list[Check] = field(default_factory=list)
    memory: MemoryEstimate | None = None
    shapes_source: str = ""
    estimate: dict = field(default_factory=dict)
    placements: list = field(default_factory=list)
    """The scheduling-fit cases (raytrain_eks.planning.fit.Placement), when cdk.out and dist/ exist."""
    strategies: list[dict] = field(default_factory=list)
    """:func:`strategy_options`: every strategy's estimate, fastest first."""
    measured: dict | None = None
    """This exact plan as bench/bench_full_size_plan.py measured it (raytrain_eks/planning/measured_plan.py)."""
    search: object | None = None
    """The plan search's result (raytrain_eks/planning/plan_search.py ``Search``) for a GPU job."""

    @property
    def refusal(self) -> str | None:
        bad = [c for c in self.checks if not c.ok]
        return f"preflight refused {self.job.source}: {bad[0].message}" if bad else None


def installed_ray_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return ""


def manifest_ray_versions(dist_dir: str | Path) -> dict[str, set[str]]:
    """``{file: {rayVersion, ...}}`` for every synthesized manifest under ``dist_dir``."""
    found: dict[str, set[str]] = {}
    root = Path(dist_dir)
    if not root.is_dir():
        return found
    for path in sorted(root.rglob("*")):
        if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
            versions = set(_RAY_VERSION.findall(path.read_text(encoding="utf-8", errors="replace")))
            if versions:
                found[str(path)] = versions
    return found


def _check_world(env: Environment, job: JobConfig, host_model_bytes: int = 0) -> list[Check]:
    p = job.parallel
    fit = [Check(name="pod resources", ok=False, message=m.removeprefix(f"{job.source}: "))
           for m in resource_problems(env, job, host_model_bytes=host_model_bytes)]
    if not p.use_gpu:
        # Judged against the worker pod the charts give it, never this machine: a plan must not
        # pass or fail by where preflight happens to run. This machine is only a note.
        need = p.num_workers * p.cpus_per_worker
        g = env.gpu_group(job.parallel.node_group)
        return fit or [
            Check(name="pod resources", ok=True,
                  message=f"parallel.num_workers x cpus_per_worker = {need:g} CPUs of one worker pod "
                          f"({g.pod_cpu} CPUs on {g.instance_type})"),
            Check(name="this machine", ok=True, note=True,
                  message=f"{os.cpu_count() or 1} CPUs here; `python -m training` locally needs {need:g}")]
    g = env.gpu_group(job.parallel.node_group)
    shape = f"{g.job_nodes} x {g.instance_type} ({g.world_size} {g.instance.gpu_model} GPUs)"
    checks = [Check(name="world size", ok=p.num_workers <= g.world_size,
                    message=f"parallel.num_workers = {p.num_workers} needs {p.num_workers} GPUs; "
                            f"gpu group {g.name!r} has {g.world_size}: {shape}")]
    checks += fit or [Check(name="pod resources", ok=True,
                            message=f"parallel.workers_per_node = {p.workers_per_node}; a {g.instance_type} has "
                                    f"{g.gpus_per_node} GPUs; {p.workers_per_node} x {p.cpus_per_worker:g} CPUs of "
                                    f"its {g.pod_cpu}-CPU worker pod")]
    if p.workers_per_node < g.gpus_per_node or p.num_workers < g.world_size:
        checks.append(Check(name="idle GPUs", ok=True, note=True,
                            message=f"the job uses {p.num_workers} of {g.world_size} GPUs you pay for"))
    return checks


def _check_ray(env: Environment, job: JobConfig, dist_dir: str | Path, installed: str) -> list[Check]:
    want = env.image.ray_version
    checks = []
    manifests = manifest_ray_versions(dist_dir)
    wrong = {f: v for f, v in manifests.items() if v != {want}}
    if manifests:
        first = next(iter(wrong.items()), None)
        checks.append(Check(name="ray version", ok=not wrong,
                            message=f"image.ray_version {want} but rayVersion {', '.join(sorted(first[1]))} in {first[0]}"
                            if first else f"image Ray {want} = rayVersion in {len(manifests)} manifest(s) under {dist_dir}"))
    elif job.parallel.use_gpu:
        checks.append(Check(name="ray version", ok=True, note=True,
                            message=f"no synthesized manifests under {dist_dir}/ to compare with image Ray {want}"))
    if not job.parallel.use_gpu:
        checks.append(Check(name="ray version", ok=installed == want,
                            message=f"installed Ray {installed or '(none)'} vs the image's Ray {want} (image.ray_version): "
                                    "local runs must use the image's Ray"))
    return checks


def _check_transport(env: Environment, job: JobConfig) -> list[Check]:
    """``evidence.require_transport`` (fail fast) and ``accept.transport`` (the verdict) against
    the job's own shape: a transport the job can never use is refused before the run."""
    checks = []
    for field, want in (("evidence.require_transport", job.evidence.require_transport),
                        ("accept.transport", job.accept.transport)):
        checks += _transport_rule(env, job, field, want)
    return checks


def _transport_rule(env: Environment, job: JobConfig, field: str, want: str) -> list[Check]:
    g = env.gpu_group(job.parallel.node_group)
    if not job.parallel.use_gpu:
        ok = want in ("any", "single-node")
        return [Check(name="transport", ok=ok, message=f"{field} = {want!r}"
                      + (": a local CPU job uses gloo on one machine" if ok else
                         " but a local CPU job uses gloo on one machine (require 'single-node' or 'any')"))]
    if want == "single-node" and job.num_nodes > 1:
        return [Check(name="transport", ok=False,
                      message=f"{field} = 'single-node' but the job spans {job.num_nodes} nodes "
                              f"({job.parallel.num_workers} workers, {job.parallel.workers_per_node} per node): "
                              "require 'efa', 'socket' or 'any'")]
    if want == "efa":
        if g.efa_per_node < 1:
            return []  # refused by the pod-resources check (charts/jobs.py resource_problems)
        if job.num_nodes < 2:
            return [Check(name="transport", ok=False,
                          message=f"{field} = 'efa' but the job spans {job.num_nodes} node "
                                  "(NCCL never touches the network on one node: require 'single-node' or 'any')")]
        return [Check(name="transport", ok=True,
                      message=f"{field}: EFA; {g.instance_type} has {g.efa_per_node} EFA per node, job spans {job.num_nodes} nodes")]
    if field == "evidence.require_transport" and job.num_nodes > 1 and g.efa_per_node:
        return [Check(name="transport", ok=True, note=True,
                      message=f"{field} = {want!r}: a silent fall-back to TCP sockets would not stop this run (set 'efa')")]
    return []


def _check_inputs(job: JobConfig) -> list[Check]:
    """The model's config and the data, read as the job's own driver will (S3 included)."""
    from training.data.check import check_data
    from training.data.records import DataError
    from training.model_config import ModelConfigError, check_model

    checks = []
    try:
        checks.append(Check(name="model", ok=True, note=True, message=check_model(job)))
    except ModelConfigError as err:
        checks.append(Check(name="model", ok=False, message=str(err).removeprefix(f"{job.source}: ")))
    try:
        data = check_data(job)
        checks.append(Check(name="data", ok=True, note=not data.checked, message=data.summary))
    except DataError as err:
        checks.append(Check(name="data", ok=False, message=str(err).removeprefix(f"{job.source}: ")))
    return checks


def _check_fit(env: Environment, plan: Plan, dist_dir: str | Path, cdk_out: str | Path) -> list[Check]:
    """Every pod the project creates, placed on the node groups the CDK app creates."""
    from raytrain_eks.planning.fit_inputs import cluster_template, fit_cases

    try:
        template = cluster_template(env, Path(cdk_out))
        plan.placements = fit_cases(env, template, Path(dist_dir))
    except FileNotFoundError as err:
        return [Check(name="scheduling fit", ok=True, note=True, message=f"not checked: {err}")]
    pending = [line for p in plan.placements for line in p.pending]
    return [Check(name="scheduling fit", ok=not pending, message=pending[0] if pending else
                  f"every pod gets a node in {len(plan.placements)} cases ({cdk_out}/ and {dist_dir}/)")]


def run_preflight(env: Environment, job: JobConfig, *, dist_dir: str | Path = "dist", mfu: float = DEFAULT_MFU,
                  installed_ray: str | None = None, cdk_out: str | Path = "cdk.out") -> Plan:
    """Run every check; never raises for a bad plan (see :attr:`Plan.refusal`)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu: {mfu!r} must be between 0 and 1")
    plan = Plan(env=env, job=job)
    try:
        shapes, plan.shapes_source = shapes_for_job(job)
    except ShapesUnknown as err:
        shapes, unknown = None, err
    host_bytes = shapes.num_params() * (2 if job.model.dtype == "bfloat16" else 4) if shapes else 0
    plan.checks += _check_world(env, job, host_bytes)
    plan.checks += _check_ray(env, job, dist_dir, installed_ray_version() if installed_ray is None else installed_ray)
    plan.checks += _check_transport(env, job)
    plan.checks += _check_inputs(job)
    plan.checks += _check_fit(env, plan, dist_dir, cdk_out)
    if shapes is None:
        plan.checks.append(Check(name="memory", ok=unknown.unreachable, note=unknown.unreachable,
                                 message=f"not checked: {unknown}" if unknown.unreachable else str(unknown)))
        return plan
    if not job.parallel.use_gpu:
        plan.checks.append(Check(name="memory", ok=True, note=True, message="local CPU job: no GPU memory to check"))
        return plan
    g = env.gpu_group(job.parallel.node_group)
    plan.memory = estimate_for_job(job, shapes)
    usable = usable_bytes(g.instance.gpu_memory_gib)
    m = plan.memory
    measured = measured_plan.load()

    def required(candidate: JobConfig) -> int:  # the measured figure where that exact plan was measured
        found = measured_plan.for_job(candidate, shapes, g.instance_type, measured)
        return found["required_bytes"] if found else estimate_for_job(candidate, shapes).required

    def host(candidate: JobConfig) -> int:  # host memory per node under parallel.cpu_offload
        found = measured_plan.for_job(candidate, shapes, g.instance_type, measured)
        per_gpu = found["host_bytes_per_gpu"] if found else estimate_for_job(candidate, shapes).host
        return per_gpu * candidate.parallel.workers_per_node

    plan.measured = measured_plan.for_job(job, shapes, g.instance_type, measured)
    if plan.measured and not job.parallel.cpu_offload:  # the step model knows no host<->GPU copies
        plan.measured["range"] = step_model.for_job(job, shapes, plan.measured, measured_plan.Cluster(
            g.instance_type, job.num_nodes), g.instance.gpu_model, g.instance.network_gbps)
    need = required(job)
    fits = need <= usable
    hint = "" if fits else "; " + advise(job, shapes, usable, g.instance.gpus, required, host, g.pod_memory_gib * GIB)
    source = "measured" if plan.measured else "incl. 10% fragmentation"
    plan.checks.append(Check(name="memory", ok=fits, message=(
        f"{job.model.path or 'model'} {job.parallel.strategy} at train.seq_len = {job.train.seq_len} x "
        f"micro_batch_size = {job.train.micro_batch_size} needs ~{need / GIB:.1f} GiB per GPU "
        f"({source}); each {g.instance.gpu_model} has {usable / GIB:.1f} GiB usable{hint}")))
    if job.parallel.cpu_offload:
        plan.checks.append(_offload_check(job, g, required, host(job)))
    faster = spare_memory(job, usable, required) if fits else []
    if faster:
        plan.checks.append(Check(name="memory to spare", ok=True, note=True, message=(
            "the plan also fits with " + " and ".join(faster) + ": set " +
            ", ".join(f.split(" (")[0] for f in faster))))
    plan.checks += _check_plan_search(plan, shapes, g)
    plan.checks += elastic_sizes(env, job, shapes, required, usable, mfu)
    plan.checks += spot_notice(env, job, shapes)
    hand = estimate_time(env, job, shapes, mfu)
    plan.estimate = run_time.measured_time(hand, plan.measured, job) if plan.measured else hand
    plan.estimate.update(run_time.prediction_range(job, hand, measured=plan.measured, written=getattr(
        plan.search, "written", None), measured_bound=plan.estimate.get("bound", "")))
    ok, message = run_time.deadline(job, run_time.slow_step_s(plan.estimate, plan.measured), shapes.num_params())
    plan.checks.append(Check(name="deadline", ok=ok, message=message))
    plan.strategies = strategy_options(env, job, shapes, mfu)
    best = plan.strategies[0]
    if job.parallel.cpu_offload and best["fits"]:  # the GPU fits; the state in host memory must too
        from dataclasses import replace

        other = replace(job, parallel=replace(job.parallel, strategy=best["strategy"]))
        best = {**best, "fits": host(other) <= g.pod_memory_gib * GIB}
    searched = plan.search is not None and plan.search.chosen is not None  # the search's pick supersedes it
    if best["strategy"] != job.parallel.strategy and best["fits"] and not searched:  # both from the hand model
        plan.checks.append(Check(name="strategy", ok=True, note=True, message=(
            f"parallel.strategy = {job.parallel.strategy!r} takes {hand['step_s']:.2f} s/step at the hand model's fast end; "
            f"{best['strategy']!r} would take {best['step_s']:.2f} s/step (network {best['network_s']:.2f} s): "
            f"set parallel.strategy = {best['strategy']!r}")))
    return plan


def elastic_sizes(env: Environment, job: JobConfig, shapes, required, usable: int, mfu: float) -> list[Check]:
    """An elastic job (``parallel.min_nodes``): the plan at every size it may run at, fewest
    nodes first: memory per GPU (the same estimate or measured figure as the job's own) and the
    hand model's step at the stated MFU, with the micro batches per worker that keep the global
    batch. A size whose memory does not fit refuses the job: after a lost node it would fail."""
    from dataclasses import replace

    if not job.elastic:
        return []
    out = []
    for world in job.world_sizes:
        at = replace(job, parallel=replace(job.parallel, num_workers=world))
        need = required(at)
        step = estimate_time(env, at, shapes, mfu)["step_s"]
        nodes = world // job.parallel.workers_per_node
        text = (f"{nodes} node(s), {world} GPUs, {at.grad_accum_steps} micro batches per GPU: ~{need / GIB:.1f} GiB "
                f"per GPU of {usable / GIB:.1f}, ~{step:.2f} s/step (hand model at MFU {mfu:g}, assumed)")
        fits = need <= usable
        out.append(Check(name="elastic size", ok=fits, note=fits, message=text if fits else (
            f"parallel.min_nodes = {job.parallel.min_nodes} allows {text}: it does not fit; raise parallel.min_nodes "
            f"above {nodes}")))
    return out


NOTICE_UPLOAD_GBPS = (0.2, 1.0)
"""ASSUMED GB/s one node writes a checkpoint to S3 at (slow end, fast end): Ray Train uploads each
worker's folder with pyarrow's S3 client; no measured figure on this project's nodes yet."""


def spot_notice(env: Environment, job: JobConfig, shapes) -> list[Check]:
    """A job on a spot group: its checkpoint must be written and uploaded inside EC2's two-minute
    notice (less the stop margin, ``training/contract.py``). The bytes are the trained fp32
    parameters and AdamW's two moments (measured plans carry no checkpoint time); per node all
    of them under hybrid_shard (each node holds a replica; DCP may still spread the writes), a
    share under full_shard; the rate is :data:`NOTICE_UPLOAD_GBPS` (assumed). A checkpoint that
    may not fit is a note, not a refusal: the run then loses the steps since its last one."""
    from training import contract as tc

    from raytrain_eks.planning.memory_estimate import lora_adapter_params, lora_options

    g = env.gpu_group(job.parallel.node_group)
    if not g.spot:
        return []
    lora = lora_options(job)  # a LoRA checkpoint holds the adapters only (the frozen base is not stored)
    total = (lora_adapter_params(shapes, lora) if lora is not None else shapes.num_params()) * 12
    per_node = total if job.parallel.strategy == "hybrid_shard" else total / max(1, job.num_nodes)
    slow, fast = (per_node / 1e9 / rate for rate in NOTICE_UPLOAD_GBPS)
    budget = tc.NOTICE_CHECKPOINT_SECONDS
    fits = slow <= budget
    return [Check(name="spot notice", ok=True, note=True, message=(
        f"a checkpoint of ~{per_node / 1e9:.1f} GB per node takes ~{slow:.0f}-{fast:.0f} s to S3 (assumed "
        f"{NOTICE_UPLOAD_GBPS[0]:g}-{NOTICE_UPLOAD_GBPS[1]:g} GB/s per node); the notice leaves {budget} s: "
        + ("it fits, a reclaim loses no step" if fits else
           "it may not fit: a reclaim then loses the steps since the last periodic checkpoint "
           f"(checkpoint.every_n_steps = {job.checkpoint.every_n_steps})")))]


def _check_plan_search(plan: Plan, shapes, group) -> list[Check]:
    """The plan search (raytrain_eks/planning/plan_search.py) for this job on its node group: a
    note naming the fastest plan that fits when it is not the job's own; with ``parallel.plan =
    "auto"`` the job runs the search's pick (submit hands its settings over as overrides)."""
    from raytrain_eks.planning import plan_search

    job = plan.job
    plan.search = found = plan_search.search(job, shapes, group)
    chosen, written = found.chosen, found.written
    if chosen is None:
        return [Check(name="plan search", ok=True, note=True,
                      message="no plan whose memory was measured fits: bench/bench_plan_search.py --measure measures them")]
    if written is not None and chosen.candidate == written.candidate:
        return [Check(name="plan search", ok=True, note=True,
                      message=f"the job's plan is the fastest that fits: {chosen.range_text()}")]
    sets = plan_search.overrides(job, chosen.job)
    was = written.range_text() if written else "not priced"
    if job.parallel.plan == "auto":
        return [Check(name="plan search", ok=True, note=True,
                      message=f"parallel.plan = 'auto': runs {chosen.candidate.label()} ({chosen.range_text()}) instead "
                              f"of the file's plan ({was}): {' '.join(sets)}")]
    return [Check(name="plan search", ok=True, note=True,
                  message=f"{chosen.candidate.label()} is faster at the slow end ({chosen.range_text()}; the file's: "
                          f"{was}): set {', '.join(sets)} or parallel.plan = \"auto\"")]


def auto_plan_overrides(env: Environment, job: JobConfig) -> list[str]:
    """For a GPU job with ``parallel.plan = "auto"``: the ``section.key=value`` overrides that
    turn it into the plan search's pick ([] when it is already the pick, when no measured plan
    fits, or when the model's shapes cannot be read here). Submit applies them before sizing."""
    from raytrain_eks.planning import plan_search

    if not (job.parallel.use_gpu and job.parallel.plan == "auto"):
        return []
    try:
        shapes, _ = shapes_for_job(job)
    except ShapesUnknown:
        return []
    found = plan_search.search(job, shapes, env.gpu_group(job.parallel.node_group))
    return plan_search.overrides(job, found.chosen.job) if found.chosen else []


def _offload_check(job: JobConfig, group, required, host_per_node: int) -> Check:
    """``parallel.cpu_offload``: the host memory it needs per node against one worker pod's, and
    the GPU memory it saves against the same plan without it."""
    from dataclasses import replace

    limit = group.pod_memory_gib * GIB
    saved = required(replace(job, parallel=replace(job.parallel, cpu_offload=False))) - required(job)
    return Check(name="host memory", ok=host_per_node <= limit, message=(
        f"parallel.cpu_offload keeps parameters, gradients and AdamW state in host memory: ~{host_per_node / GIB:.0f} GiB "
        f"per node ({job.parallel.workers_per_node} workers) of the {group.pod_memory_gib} GiB one worker pod may use "
        f"({group.instance_type}); it saves ~{saved / GIB:.1f} GiB per GPU"))


def render(plan: Plan) -> str:
    """The human report: checks, memory breakdown, time and cost."""
    job, env = plan.job, plan.env
    lines = [f"preflight  {job.source} on {env.source} (spec hash {env.spec_hash})"]
    for c in plan.checks:
        lines.append(f"  {'NOTE' if c.note else 'PASS' if c.ok else 'FAIL'}  {c.name:<17} {c.message}")
    if plan.memory:
        m, t = plan.memory, job.train
        lines.append(f"memory per GPU  shapes from {plan.shapes_source}; {job.parallel.strategy} over "
                     f"{m.shard_group} GPU(s); seq {t.seq_len} x micro batch {t.micro_batch_size}")
        for name, value in m.rows():
            lines.append(f"  {name:<30} {value / GIB:7.2f} GiB")
        lines.append(f"  {'total':<30} {m.total / GIB:7.2f} GiB  (+10% fragmentation: {m.required / GIB:.2f} GiB; "
                     f"usable {usable_bytes(env.gpu_group(job.parallel.node_group).instance.gpu_memory_gib) / GIB:.2f} GiB)")
        lines.append(f"  activations without / with checkpointing: {m.activations_without_checkpointing / GIB:.2f} / "
                     f"{m.activations_with_checkpointing / GIB:.2f} GiB")
    if plan.measured:
        lines += measured_plan.render(plan.measured, hand_required=plan.memory.required)
        if plan.measured.get("range"):
            lines += step_model.render(plan.measured["range"])
            if plan.estimate:  # the same run overheads and prices as the time and cost below
                e, hours = plan.estimate, [job.train.max_steps * s / 3600 for s in plan.measured["range"]["step_s"]]
                usd = [(h + e["overhead_h"]) * e["hourly_usd"] for h in hours]
                lines.append(f"    run            {hours[1] * 60:.1f}-{hours[0] * 60:.1f} min of steps, {usd[1]:.2f}-{usd[0]:.2f} USD "
                             f"over this range (slow-fast)")
        elif not job.parallel.cpu_offload:  # measured, but no trace of its micro batch
            lines += step_model.missing(plan.job, plan.measured)
    if plan.estimate:
        e = plan.estimate
        if e.get("source") == "measured":
            p = plan.measured["prediction"]
            lines += [
                f"time and cost from the measured plan (above); the hand model at MFU "
                f"{e['mfu']:.2f} would say {e['hand_step_s']:.2f} s/step (its fast end)",
                f"  collectives      {e['exposed_network_s']:.2f} s/step not hidden by compute at the published rates' fast end (PCIe "
                f"{p['pcie_bytes_per_gpu'] / 1e9:.1f} GB per GPU at {p['pcie_gbytes_per_s']:g} GB/s, EFA "
                f"{p['efa_bytes_per_node'] / 1e9:.1f} GB per node over {e['network_gbps']} Gbit/s, per step)",
                f"  strategies       the hand model at MFU {e['mfu']:.2f}:",
            ]
        else:
            lines += [
                f"time and cost at MFU {e['mfu']:.2f} (peak {e['peak_tflops']:g} TFLOP/s bf16 per GPU)",
                f"  FLOPs            {e['flops_per_token'] / 1e9:.2f} GFLOP/token (training = 3x forward), "
                f"{e['flops_per_step'] / 1e12:.1f} TFLOP/step ({job.tokens_per_step} tokens)",
                f"  compute          {e['compute_s']:.2f} s/step",
                f"  network          {e['network_s']:.2f} s/step, {e['exposed_network_s']:.2f} s not hidden by compute "
                f"({e['network_bytes_per_node'] / 1e9:.1f} GB per node per step "
                f"over {e['network_gbps']} Gbit/s, at line rate)",
            ]
        for o in plan.strategies:
            mark = "*" if o["strategy"] == job.parallel.strategy else " "
            slow = o["compute_s"] / run_time.SLOW_MFU_FRACTION + o["exposed_network_s"]
            lines.append(f"  {mark} {o['strategy']:<14} network {o['network_s']:5.2f} s ({o['exposed_network_s']:.2f} exposed), "
                         f"step {slow:5.2f}-{o['step_s']:.2f} s, "
                         f"memory {o['required_bytes'] / GIB:5.1f} GiB{'' if o['fits'] else ' (does not fit)'}")
        (slow, fast), (mfu_slow, mfu_fast) = e["step_range"], e["mfu_range"]
        (h_slow, h_fast), (usd_slow, usd_fast) = e["run_hours_range"], e["run_usd_range"]
        lines += [
            f"  step             {slow:.2f}-{fast:.2f} s (slow-fast; limited by {e['range_bound']} at the slow end; "
            f"MFU {mfu_slow:.2f}-{mfu_fast:.2f}); {e['tokens_per_hour_range'][0] / 1e6:.2f}-"
            f"{e['tokens_per_hour_range'][1] / 1e6:.2f} M tokens/hour; from {e['range_source']}",
            f"  run              {job.train.max_steps} steps = {h_slow:.2f}-{h_fast:.2f} h + {e['overhead_h'] * 60:.0f} min of "
            f"GPU nodes scaling up from zero and idling before removal; ~{usd_slow:.2f}-{usd_fast:.2f} USD at "
            f"{e['hourly_usd']:.2f} USD/h for all nodes (evaluation and checkpoint uploads extra)",
            f"  idle             {e['idle_hourly_usd']:.2f} USD/h with no job (GPU groups at min_nodes)",
        ]
    if plan.search is not None:
        from raytrain_eks.planning import plan_search

        lines += plan_search.render(plan.search, job)
    lines += pull_lines(env)  # the image each GPU node pulls as it scales up for this job
    if plan.placements:
        from raytrain_eks.planning.fit import render as render_fit

        lines.append("scheduling fit  (node groups at their maximum size; requests / allocatable)")
        lines += ["  " + line for p in plan.placements for line in render_fit(p).splitlines()]
    lines.append(f"verdict    {'REFUSED' if plan.refusal else 'OK'}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")
    parser.add_argument("job", nargs="?", metavar="JOB", help="job config, e.g. jobs/finetune-qwen2.5-1.5b.toml "
                        "(as submit takes it)")
    parser.add_argument("--job", dest="job_flag", metavar="JOB", help="the same, as a flag")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a job config field, e.g. --set train.seq_len=4096 (repeatable)")
    parser.add_argument("--dist", default="dist",
                        help="synthesized manifests to compare rayVersion with (default: %(default)s; skipped if absent)")
    parser.add_argument("--cdk-out", default="cdk.out",
                        help="synthesized CDK app whose node groups the scheduling-fit check uses "
                             "(default: %(default)s; skipped if absent)")
    parser.add_argument("--mfu", type=float, default=None,
                        help="model FLOPs utilisation assumed for the time and cost estimate (default: 0.30)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from charts import ChartError
    from charts.jobs import plan_job
    from environment import load_environment

    if bool(args.job) == bool(args.job_flag):
        print("error: preflight: name one job config: raytrain-eks preflight JOB (or --job JOB)", file=sys.stderr)
        return 2
    args.job = args.job or args.job_flag
    env = load_environment(args.env)
    try:  # the charts' own sizing: preflight checks exactly the shape they synthesize
        job = plan_job(env, Path(args.job), Path.cwd(), user_overrides=args.overrides).config
    except ChartError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        plan = run_preflight(env, job, dist_dir=args.dist, cdk_out=args.cdk_out,
                             mfu=DEFAULT_MFU if args.mfu is None else args.mfu)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(plan))
    if plan.refusal:
        print(plan.refusal, file=sys.stderr)
        return 2
    return 0
