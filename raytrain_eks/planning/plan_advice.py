"""When a plan does not fit the GPU's memory: the change that would make it fit; when it fits
with room to spare: the faster settings that still fit (:func:`spare_memory`).

Changes are tried cumulatively, cheapest in throughput first: activation checkpointing, no
parameters kept gathered across micro batches, full shard (parameters, gradients and AdamW over
every GPU instead of one node's), micro batch 1, then shorter sequences down to 512. A plan that
still does not fit is told what keeps it on its nodes (its optimizer state and master weights in
host memory, ``parallel.cpu_offload``, when the node's worker pod holds them; LoRA adapters
instead of the whole model) and how many nodes of its GPU type full shard would need. Each candidate is
sized by the memory model (:mod:`raytrain_eks.planning.memory_estimate`), or by the measured figure where
bench/bench_full_size_plan.py measured that exact plan (:mod:`raytrain_eks.planning.measured_plan`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from raytrain_eks.planning.memory_estimate import estimate_for_job, lora_options
from training.config import JobConfig
from training.config_sections import TransformConfig
from training.flops import ModelShapes

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
