"""Apply never kills a running job: before it changes the long-lived RayCluster (KubeRay's
Recreate upgrade deletes every pod, the head with the jobs' drivers), it waits, bounded by
``pipeline.apply_wait_minutes`` (and the end of the maintenance window), until no RayJob runs on
the cluster; otherwise it defers (a ``deferred`` failure: nothing applied, the watcher starts
the digest again later). With ``pipeline.maintenance_window`` declared it applies only inside it.

Which RayJobs run on the cluster is KubeRay v1.7.0's own reading (``ray-project/kuberay`` tag
``ray-operator/v1.7.0``): a RayJob targets an existing cluster through
``spec.clusterSelector["ray.io/cluster"]`` (``utils/constant.go`` RayJobClusterSelectorKey;
``rayjob_controller.go`` initRayJobStatusIfNeed sets ``status.rayClusterName`` from it), and it
is over once ``status.jobDeploymentStatus`` is terminal (``apis/ray/v1/rayjob_types.go``
IsJobDeploymentTerminal: ``Complete`` or ``Failed``). A RayJob parked in ``ValidationFailed`` or
``Suspended`` has no Ray job on the cluster. Every other state (``""`` New, ``Initializing``,
``Running``, ``Retrying``, ``Waiting``, ``Suspending``) counts as running: it is about to submit,
or has submitted, a driver to the head.

Ray jobs submitted to the head directly (``ray job submit``, not a RayJob) are not seen here.
"""
from __future__ import annotations

import datetime
import time
from typing import Any, Callable

from environment.contract import RAY_CLUSTER_LABEL
from environment.maintenance import parse_window
from infra.lambdas.image_watcher.history import FAILURE_DEFERRED

from .context import StepContext
from .rollback import StepFailed
from .kube import log

TERMINAL_DEPLOYMENTS = ("Complete", "Failed")
"""rayjob_types.go IsJobDeploymentTerminal at ray-operator/v1.7.0."""
PARKED_DEPLOYMENTS = ("ValidationFailed", "Suspended")
"""States in which no Ray job of the RayJob is on the cluster."""


class Deferred(StepFailed):
    """Apply left the long-lived cluster alone (a job was running, or outside the window)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, FAILURE_DEFERRED)


def running_on(rayjobs: list[dict[str, Any]], cluster: str) -> list[str]:
    """The names of the RayJobs running (or about to) on the RayCluster ``cluster``, sorted."""
    return sorted(
        job["metadata"]["name"] for job in rayjobs
        if ((job.get("spec") or {}).get("clusterSelector") or {}).get(RAY_CLUSTER_LABEL) == cluster
        and (job.get("status") or {}).get("jobDeploymentStatus", "") not in TERMINAL_DEPLOYMENTS + PARKED_DEPLOYMENTS)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def clear_to_recreate(ctx: StepContext, cluster: str, *, clock: Callable[[], float] = time.monotonic,
                      now: Callable[[], datetime.datetime] = utc_now) -> str:
    """Return, in words, why Apply may recreate ``cluster`` now (after waiting for its jobs if
    need be); Deferred when it may not."""
    spec = ctx.env.pipeline
    window = parse_window(spec.maintenance_window)
    bound = 60.0 * spec.apply_wait_minutes
    if window is not None:
        closes = window.closes(now())
        if closes is None:
            raise Deferred(f"outside the maintenance window {spec.maintenance_window!r} (next opens "
                           f"{window.next_opening(now()):%a %Y-%m-%d %H:%M} UTC): the long-lived cluster is left as it is")
        bound = min(bound, (closes - now()).total_seconds())
    within = f" in the maintenance window {spec.maintenance_window!r}" if window else ""
    start, first = clock(), None
    while True:
        running = running_on(ctx.kube.rayjobs(), cluster)
        first = running if first is None else first
        if not running:
            if not first:
                return f"no RayJob runs on RayCluster {cluster}{within}"
            return f"waited {clock() - start:.0f} s for RayJob(s) {', '.join(first)} on {cluster} to end{within}"
        if clock() - start >= bound:
            raise Deferred(f"RayJob(s) {', '.join(running)} still running on RayCluster {cluster} after "
                           f"{bound:.0f} s (pipeline.apply_wait_minutes = {spec.apply_wait_minutes}"
                           f"{', the window closes' if window else ''}): applied nothing, the jobs run on")
        log(f"apply: waiting for RayJob(s) {', '.join(running)} on {cluster} to end")
        time.sleep(ctx.poll_s)
