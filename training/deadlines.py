"""How long a job may take to stop, and how long it may run: one definition for the charts (pod
grace periods, Ray's job-supervisor stop wait) and for the job itself (its own wall-clock limit,
its exit code), from ``checkpoint.sigterm_grace_seconds`` and ``rayjob.active_deadline_minutes``.
Standard library only (charts/ imports it).

A stop's chain (``raytrain-eks stop``, a deadline, a RayJob deletion): KubeRay calls StopJob,
Ray's job supervisor SIGTERMs the driver and SIGKILLs it after ``RAY_JOB_STOP_WAIT_TIME_S``
(ray 2.58 ``dashboard/modules/job/job_supervisor.py``, default 3 s); the driver passes the stop
to every worker, they write and commit a final checkpoint within the job's
``checkpoint.sigterm_grace_seconds``, the driver writes the record and exits. Each outer wait
is the inner one plus :data:`GRACE_MARGIN_SECONDS`.
"""
from __future__ import annotations

from training import contract

GRACE_MARGIN_SECONDS = contract.STOP_MARGIN_SECONDS
"""Added to a job's ``checkpoint.sigterm_grace_seconds`` at each level: after the final
checkpoint is written a worker still finishes the upload's last request, reports to the
controller and lets ``ray stop`` tear down the raylet; the driver then writes run.json and copies
the logs. Without the margin the SIGKILL could land inside the checkpoint itself."""


def stop_wait_seconds(checkpoint_grace_seconds: int) -> int:
    """How long a stopped job's driver and workers may take after SIGTERM: Ray's job-supervisor
    wait (``RAY_JOB_STOP_WAIT_TIME_S`` in the job's runtime env) and the worker pods'
    terminationGracePeriodSeconds."""
    return checkpoint_grace_seconds + GRACE_MARGIN_SECONDS


def head_grace_seconds(checkpoint_grace_seconds: int) -> int:
    """The head pod's terminationGracePeriodSeconds: the stop wait and one more margin. The driver
    runs on the head; when a RayJob is deleted KubeRay calls StopJob and the RayJob's own cluster
    goes at once (KubeRay v1.7.0 rayjob_controller.go:112-138, the finalizer), so the head must
    outlive the stop wait (Kubernetes' default grace is 30 s)."""
    return stop_wait_seconds(checkpoint_grace_seconds) + GRACE_MARGIN_SECONDS


def run_time_limit_seconds(active_deadline_minutes: int, checkpoint_grace_seconds: int) -> int:
    """The job's own wall-clock limit, counted from its driver's start: the RayJob's
    ``activeDeadlineSeconds`` less the stop wait, so the final checkpoint is committed before
    that deadline would have KubeRay stop the job. KubeRay counts its deadline from the RayJob's
    start, before the cluster exists, so the job's own limit may end later than KubeRay's; it
    is what stops a ``clusterSelector`` job, which KubeRay only marks failed. At least one minute."""
    return max(60, active_deadline_minutes * 60 - stop_wait_seconds(checkpoint_grace_seconds))


def driver_exit_code(status: str, code: int, time_limit_reached: bool) -> int:
    """The driver's exit code once its run has ended (``status``, ``code``: run.json's): a run
    its OWN time limit stopped (after its final checkpoint) ends cleanly with 0, never the
    stop's 143. KubeRay v1.7.0 retries a RayJob whose driver failed while ``backoffLimit``
    allows (rayjob_controller.go:531-555; only a DeadlineExceeded failure is exempt, :543), so a
    non-zero exit would give the job a second full time limit. A stop from outside (SIGTERM:
    ``raytrain-eks stop``) keeps its code."""
    return 0 if time_limit_reached and status == "stopped" else code
