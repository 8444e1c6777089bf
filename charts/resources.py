"""Does a job's worker fit the pod and the node? ONE function, used by the charts at synth and
by the preflight (the CLI may import charts), so the two can never disagree.

Where the job's Ray workers run:

- a GPU job: one worker pod per node, holding the node's GPUs and EFA interfaces and the pod's
  CPUs and memory (environment/instances.py: what is left after the node's own reserve); each
  pod runs ``parallel.workers_per_node`` Ray workers, one GPU each;
- a CPU job (``use_gpu = false``): all its workers in ONE worker pod of the GPU group.

The group is the job's ``parallel.node_group`` (empty: the first group).

Each problem is one line: ``<file>: <field>: <value> ... (what fits)``.
"""
from __future__ import annotations

from environment import Environment
from training.config import JobConfig

GIB = 1024**3


def resource_problems(env: Environment, job: JobConfig, *, host_model_bytes: int = 0) -> list[str]:
    """Why the job's workers cannot run on ``env``'s worker pods ([] when they fit).

    ``host_model_bytes``: the full model in host memory, built once by EVERY worker before
    FSDP shards it (0 = unknown: the charts do not know the model's size)."""
    group = env.gpu_group(job.parallel.node_group)
    p, s = job.parallel, job.source
    pod = f"one worker pod ({group.pod_cpu} CPUs on {group.instance_type})"
    problems = []
    if not p.use_gpu:
        cpus = p.num_workers * p.cpus_per_worker
        if cpus > group.pod_cpu:
            problems.append(f"{s}: parallel.num_workers: {p.num_workers} x cpus_per_worker {p.cpus_per_worker} = "
                            f"{cpus:g} CPUs do not fit {pod}")
        per_pod = p.num_workers
    else:
        if p.workers_per_node > group.gpus_per_node:
            problems.append(f"{s}: parallel.workers_per_node: {p.workers_per_node} workers of one GPU each do not "
                            f"fit a {group.instance_type} ({group.gpus_per_node} GPUs)")
        cpus = p.workers_per_node * p.cpus_per_worker
        if cpus > group.pod_cpu:
            problems.append(f"{s}: parallel.cpus_per_worker: {p.cpus_per_worker:g} x workers_per_node "
                            f"{p.workers_per_node} = {cpus:g} CPUs do not fit {pod}")
        if job.evidence.require_transport == "efa" and group.efa_per_node < 1:
            problems.append(f"{s}: evidence.require_transport: 'efa' but {group.instance_type} has no EFA interface")
        per_pod = p.workers_per_node
    host = per_pod * host_model_bytes
    if host > group.pod_memory_gib * GIB:
        problems.append(f"{s}: parallel.workers_per_node: {per_pod} workers each build the full model on the host "
                        f"before sharding: {per_pod} x {host_model_bytes / GIB:.1f} GiB = {host / GIB:.1f} GiB > "
                        f"{group.pod_memory_gib} GiB of one worker pod ({group.instance_type})")
    return problems
