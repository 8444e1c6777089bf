"""How KubeRay's RayJob controller times out and retries a RayJob (no clock: elapsed seconds in).

Port of ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``,
``ray-operator/controllers/ray/rayjob_controller.go``:

- ``initRayJobStatusIfNeed``: ``status.startTime`` is set when the RayJob enters
  ``Initializing``, BEFORE its RayCluster is created; both deadlines count from it.
- ``Reconcile``, case ``JobDeploymentStatusInitializing`` (waiting for the RayCluster to be
  Ready): ``checkActiveDeadlineAndUpdateStatusIfNeeded`` first, then
  ``checkPreRunningDeadlineAndUpdateStatusIfNeeded``; a deadline is passed when
  ``now >= startTime + seconds`` (``!time.Now().Before(...)``). Case ``Running``: only the active
  deadline.
- ``checkBackoffLimitAndUpdateStatusIfNeeded``: a Failed RayJob with ``backoffLimit`` set and
  ``failed < backoffLimit + 1`` goes to ``Retrying`` (a new cluster, a new ``startTime``) unless
  its reason is ``DeadlineExceeded`` or ``JobStatusCheckTimeoutExceeded``.
"""
from __future__ import annotations

DEADLINE_EXCEEDED = "DeadlineExceeded"
PRE_RUNNING_DEADLINE_EXCEEDED = "PreRunningDeadlineExceeded"
JOB_STATUS_CHECK_TIMEOUT_EXCEEDED = "JobStatusCheckTimeoutExceeded"
NOT_RETRIED = (DEADLINE_EXCEEDED, JOB_STATUS_CHECK_TIMEOUT_EXCEEDED)


def _passed(spec: dict, key: str, elapsed: float) -> bool:
    return spec.get(key) is not None and elapsed >= spec[key]


def initializing_verdict(spec: dict, elapsed: float) -> str | None:
    """The failure reason of a RayJob whose cluster is not Ready ``elapsed`` s after its start."""
    if _passed(spec, "activeDeadlineSeconds", elapsed):
        return DEADLINE_EXCEEDED
    if _passed(spec, "preRunningDeadlineSeconds", elapsed):
        return PRE_RUNNING_DEADLINE_EXCEEDED
    return None


def running_verdict(spec: dict, elapsed: float) -> str | None:
    return DEADLINE_EXCEEDED if _passed(spec, "activeDeadlineSeconds", elapsed) else None


def retried(spec: dict, reason: str, failed: int) -> bool:
    """Whether the ``failed``-th failure (1 = the first) of this RayJob is retried."""
    backoff = spec.get("backoffLimit")
    return backoff is not None and failed < backoff + 1 and reason not in NOT_RETRIED


def attempts_without_capacity(spec: dict) -> int:
    """How many fresh clusters a RayJob that never gets capacity waits for (each attempt fails
    at the first deadline it passes)."""
    first = min((spec[k] for k in ("activeDeadlineSeconds", "preRunningDeadlineSeconds") if spec.get(k) is not None),
                default=None)
    if first is None:
        return 1  # no deadline: it waits forever, once
    failed = 1
    while retried(spec, initializing_verdict(spec, first) or "", failed):
        failed += 1
    return failed


DEFAULT_SUBMITTER_BACKOFF_LIMIT = 2
"""rayjob_controller.go ``createNewK8sJob``: the submitter Job's ``backoffLimit`` unless
``submitterConfig.backoffLimit`` is set."""


def submitter_fails_the_rayjob(spec: dict, failed_submitter_pods: int) -> bool:
    """K8sJobMode, ``checkSubmitterAndUpdateStatusIfNeeded``: the RayJob turns Failed when its
    submitter Job has failed, i.e. after backoffLimit + 1 failed pods (batch/v1 Job), whatever
    the Ray job itself is doing."""
    if spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
        return False
    limit = (spec.get("submitterConfig") or {}).get("backoffLimit", DEFAULT_SUBMITTER_BACKOFF_LIMIT)
    return failed_submitter_pods > limit
