"""Which failures are the image's, and telling a person.

A step's exception carries its class of failure in ``failure`` (history.py FAILURE_*): the
image's (the smoke run trained and failed, failed its gates, or the image never started) shelves
the digest; anything else (no GPUs before ``preRunningDeadlineSeconds``, kubectl or AWS API
errors, another execution's promotion) is infrastructure, and the watcher retries the digest on
a later tick, up to ``pipeline.max_attempts``; an Apply that left a running job alone is deferred.
An exception that does not say is infrastructure: only a verdict on the image shelves it.

Every failure is published to the pipeline's topic (``NOTIFY_TOPIC_ARN``) with its reason and
what follows from it.
"""
from __future__ import annotations

from typing import Any

from infra.lambdas.image_watcher.history import FAILURE_DEFERRED, FAILURE_IMAGE, FAILURE_INFRASTRUCTURE

# KubeRay ray-operator/v1.7.0 apis/ray/v1/rayjob_types.go JobFailedReason: the reasons a RayJob's
# deployment becomes Failed, and whose fault each is.
RAYJOB_REASON_FAILURE = {
    "AppFailed": FAILURE_IMAGE,  # the entrypoint ran and exited non-zero (rayjob_controller.go)
    "DeadlineExceeded": FAILURE_IMAGE,  # it started and ran past activeDeadlineSeconds
    # the submitter runs the head's image (common/job.go): a submission that fails is the image's
    "SubmissionFailed": FAILURE_IMAGE,
    # never Running before preRunningDeadlineSeconds: no GPU node (capacity, a user's job on them)
    "PreRunningDeadlineExceeded": FAILURE_INFRASTRUCTURE,
    "JobDeploymentStatusTransitionGracePeriodExceeded": FAILURE_INFRASTRUCTURE,
    "JobStatusCheckTimeoutExceeded": FAILURE_INFRASTRUCTURE,  # the dashboard did not answer
    "ValidationFailed": FAILURE_INFRASTRUCTURE,  # the manifest, not the image
}
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
"""A container's ``state.waiting.reason`` while its image cannot be pulled (kubernetes
``pkg/kubelet/images/types.go``): a pod that only ever showed these never started the image."""


class StepFailed(RuntimeError):
    """A failure whose class the step knows; one line (the rollback reason)."""

    def __init__(self, message: str, failure: str = FAILURE_INFRASTRUCTURE) -> None:
        super().__init__(message)
        self.failure = failure


def classify(err: BaseException) -> str:
    """The failure class of an exception (infrastructure unless it says otherwise)."""
    failure = getattr(err, "failure", FAILURE_INFRASTRUCTURE)
    return failure if failure in (FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, FAILURE_DEFERRED) else FAILURE_INFRASTRUCTURE


def pull_errors(pods: list[dict[str, Any]]) -> list[str]:
    """``pod/container: reason`` of the containers waiting on an image they cannot pull."""
    out = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            reason = ((status.get("state") or {}).get("waiting") or {}).get("reason", "")
            if reason in IMAGE_PULL_REASONS:
                out.append(f"{pod['metadata']['name']}/{status['name']}: {reason}")
    return out


def consequence(failure: str, max_attempts: int) -> str:
    """What follows from a failure of this class, in words for the notification."""
    if failure == FAILURE_IMAGE:
        return "the digest is shelved (the watcher will not start it again; an explicit run can)"
    window = "in the maintenance window, " if failure == FAILURE_DEFERRED else ""
    return f"the watcher starts the digest again on a later tick, {window}up to {max_attempts} executions in all"


def notify(sns: Any, topic_arn: str, *, subject: str, message: str) -> None:
    """Publish to the pipeline's topic (nothing without one: a manual run, a test)."""
    if topic_arn:
        # SNS Publish: Subject is at most 100 characters (the e-mail subject line).
        sns.publish(TopicArn=topic_arn, Subject=subject[:100], Message=message)
