"""Stop a run's Ray job through its own head, and wait until it is terminal, BEFORE its RayJob
is deleted (``raytrain-eks stop``, a deadline's release).

Deleting the RayJob alone is not enough on a run's OWN cluster: KubeRay v1.7.0's finalizer
calls the dashboard's StopJob, which returns at once, and removes the finalizer in the same
reconcile (``ray-operator/controllers/ray/rayjob_controller.go:112-138``); the RayCluster the
RayJob owns is then deleted, and each Ray container's PID 1 (``ray start --block``) drains for
at most ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` = 30 s on SIGTERM (ray 2.58
``_private/ray_constants.py:40``, ``_private/node.py:629-664``) before the driver dies: the final
checkpoint would get ~30 s, not the job's stop wait. ``ray job stop`` in the head container
asks the job supervisor to stop the job and polls until it is STOPPED/SUCCEEDED/FAILED (ray 2.58
``dashboard/modules/job/cli.py:448-466``), so the job's own stop wait
(``RAY_JOB_STOP_WAIT_TIME_S``, charts/ray_charts.py) runs in full. A ``clusterSelector`` cluster
outlives the RayJob: KubeRay's StopJob suffices there.
"""
from __future__ import annotations

import subprocess
from typing import Any, Callable

import yaml

from raytrain_eks.eks_backend import DEADLINE_REASONS, TERMINAL_JOB_STATUSES, kubectl

HEAD_CONTAINER = "ray-head"
"""The head pod's Ray container (charts/cluster_spec.py ``RAY_CONTAINER_HEAD``)."""
DASHBOARD = "http://127.0.0.1:8265"
"""The job API, from inside the head container."""
MARGIN_S = 60
"""Beyond the job's stop wait: kubectl exec's start and Ray's 1 s polls."""
DEFAULT_STOP_WAIT_S = 600
"""A RayJob whose runtime env names no stop wait (made by hand): a generous bound."""


def stop_wait_s(rayjob: dict[str, Any]) -> int:
    """The job's ``RAY_JOB_STOP_WAIT_TIME_S`` from its runtime env (charts/ray_charts.py sets it)."""
    env = (yaml.safe_load((rayjob.get("spec") or {}).get("runtimeEnvYAML") or "") or {}).get("env_vars") or {}
    try:
        return int(env["RAY_JOB_STOP_WAIT_TIME_S"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_STOP_WAIT_S


def stop_ray_job_first(rayjob: dict[str, Any], namespace: str, say: Callable[[str], None]) -> None:
    """On a run's own cluster, once ready, with its Ray job not terminal: ``ray job stop`` in the head
    container (through KubeRay's head service, ``<cluster>-head-svc``), returning when the job
    is terminal or its stop wait and :data:`MARGIN_S` have passed. Failing here only says so:
    the RayJob's deletion (KubeRay's StopJob) still follows."""
    status, spec = rayjob.get("status") or {}, rayjob.get("spec") or {}
    # dashboardURL: KubeRay sets it once the cluster is ready (before it, no head to ask); an
    # empty jobStatus is a job KubeRay has not read yet, which may run all the same
    if spec.get("clusterSelector") or not status.get("dashboardURL") or status.get("jobStatus") in TERMINAL_JOB_STATUSES:
        return
    cluster, job_id = status.get("rayClusterName"), status.get("jobId")
    if not cluster or not job_id:
        return
    bound = stop_wait_s(rayjob) + MARGIN_S
    say(f"    stopping Ray job {job_id} through its head (final checkpoint; at most {bound} s)")
    try:
        proc = kubectl("exec", f"svc/{cluster}-head-svc", "-n", namespace, "-c", HEAD_CONTAINER, "--",
                       "ray", "job", "stop", "--address", DASHBOARD, job_id, check=False, timeout=bound)
    except subprocess.TimeoutExpired:
        say(f"    Ray job {job_id} not stopped within {bound} s: deleting its RayJob anyway")
        return
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        say(f"    ray job stop failed ({lines[-1] if lines else f'exit {proc.returncode}'}): deleting its RayJob anyway")


def release_after_deadline(name: str, namespace: str, rayjob: dict[str, Any], say: Callable[[str], None]) -> bool:
    """Delete a RayJob that failed on a deadline (:data:`DEADLINE_REASONS`); True if it did."""
    status = rayjob.get("status") or {}
    if status.get("jobDeploymentStatus") != "Failed" or status.get("reason") not in DEADLINE_REASONS:
        return False
    stop_ray_job_first(rayjob, namespace, say)  # its own cluster: a full stop wait, not ~30 s
    kubectl("delete", "rayjob", name, "-n", namespace, "--wait=false", "--ignore-not-found")
    say(f"    {status['reason']}: RayJob {name} deleted, so KubeRay stops its Ray job (final checkpoint) "
        "and its GPUs are freed; its checkpoints stay")
    return True
