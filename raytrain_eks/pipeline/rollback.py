"""Automatic rollback: the long-lived RayCluster back on what the last promotion applied, and
one ``rolled-back`` history item with the reason and the outcome.

The target is the manifest the newest promotion's own Apply put on the cluster (its ``applied``
history item), byte for byte: not this commit's configuration with the old image. The cluster
is re-applied only when its :data:`.kube.APPLIED_ANNOTATION` (set by every Apply) differs from
that manifest's hash AND equals the hash THIS execution's Apply recorded: QUEUED mode runs one
execution per stage at a time, so run A can be in Apply or Promote while run B fails Smoke; B
never touched the cluster and must not put the old promotion over A's rollout. After a failed
smoke or gate, or an Apply refused because another execution promoted, no apply is issued. A promotion recorded before the
``applied`` items existed falls back to ``dist/promoted/`` (this commit at the promoted digest).

Which failures are the image's: a step's exception carries its class of failure in ``failure``
(history.py FAILURE_*): the image's (the smoke run trained and failed, failed its gates, or the
image never started) shelves the digest; anything else (no GPUs before
``preRunningDeadlineSeconds``, kubectl or AWS API errors, another execution's promotion) is
infrastructure, and the watcher retries the digest on a later tick, up to
``pipeline.max_attempts``; an Apply that left a running job alone is deferred. An exception that
does not say is infrastructure: only a verdict on the image shelves it. Every failure is
published to the pipeline's topic (``NOTIFY_TOPIC_ARN``) with its reason and what follows from it.
"""
from __future__ import annotations

import json
from typing import Any

from infra.lambdas.image_watcher.history import FAILURE_DEFERRED, FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, ROLLED_BACK
from infra.lambdas.image_watcher.watcher import read_promoted

from . import StepContext
from .kube import KubeError, annotated, live_manifest_hash, log, manifest_hash, wait_ready

CLUSTER_FILE = "raycluster.k8s.yaml"


class StepFailed(RuntimeError):
    """A failure whose class the step knows; one line (the rollback reason)."""

    def __init__(self, message: str, failure: str = FAILURE_INFRASTRUCTURE) -> None:
        super().__init__(message)
        self.failure = failure


def classify(err: BaseException) -> str:
    """The failure class of an exception (infrastructure unless it says otherwise)."""
    failure = getattr(err, "failure", FAILURE_INFRASTRUCTURE)
    return failure if failure in (FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, FAILURE_DEFERRED) else FAILURE_INFRASTRUCTURE


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


def promoted_manifest(ctx: StepContext) -> tuple[str, dict[str, Any] | None, str]:
    """``(digest, manifest, where from)`` of the newest promotion; manifest None before any."""
    promotions = ctx.history.promotions()
    promoted = promotions[0]["digest"] if promotions else read_promoted(ctx.ssm, ctx.parameter_name)
    if not promoted:
        return "", None, "nothing promoted yet"
    applied = ctx.history.applied(promotions[0]["execution_id"]) if promotions else None
    if applied is not None:
        return promoted, json.loads(applied["manifest"]), f"the manifest execution {applied['execution_id']} applied"
    fallback = ctx.manifest(CLUSTER_FILE, promoted=True)
    return promoted, annotated(fallback) if fallback else None, "dist/promoted (this commit at the promoted digest)"


def own_applied_hash(ctx: StepContext) -> str:
    """The manifest hash this execution's own Apply put on the cluster ("" if it applied nothing)."""
    applied = ctx.history.applied(ctx.execution_id)
    return applied.get("manifest_hash", "") if applied else ""


def rollback(ctx: StepContext, *, failed_digest: str, reason: str,
             failure: str = FAILURE_INFRASTRUCTURE) -> dict[str, str]:
    """Put the long-lived cluster back where needed, record the ``rolled-back`` item with the
    reason and the failure class (:func:`classify`), and tell the pipeline's topic."""
    promoted, target, source = promoted_manifest(ctx)
    if target is None:
        outcome = f"{source}: nothing to roll back to; long-lived cluster untouched"
    else:
        name = target["metadata"]["name"]
        live = live_manifest_hash(ctx.kube, name)
        if live == manifest_hash(target):
            outcome = f"long-lived cluster untouched: still on {source} (@{promoted})"
        elif not live:
            # Every Apply of this pipeline marks what it applied: an unmarked (or absent)
            # cluster was not changed by this run, and re-applying would restart it.
            outcome = "long-lived cluster untouched: no manifest of this pipeline's Apply on it"
        elif live != own_applied_hash(ctx):
            # QUEUED mode overlaps executions across stages: another execution's Apply is on
            # the cluster (it may be promoting it now); this run never touched it.
            outcome = f"long-lived cluster untouched: another execution's Apply is on it ({live})"
        else:
            try:
                ctx.kube.apply(target)
                wait_ready(ctx.kube, target, repository=ctx.repository, digest=promoted,
                           timeout_s=ctx.rollback_timeout_s, poll_s=ctx.poll_s)
                outcome = f"long-lived cluster re-applied: {source} (@{promoted})"
            except KubeError as err:
                outcome = f"re-apply of {source} failed too: {err}"
    log(f"rollback: {failed_digest} -> {promoted or 'none'}: {failure} failure: {reason} ({outcome})")
    item = ctx.history.record(event=ROLLED_BACK, digest=failed_digest, execution_id=ctx.execution_id,
                              rolled_back_to=promoted or "none", reason=reason[:1000], outcome=outcome[:500],
                              failure=failure)
    notify(ctx.sns, ctx.topic_arn, subject=f"{ctx.env.cluster.name} image pipeline: {failure} failure",
           message=f"Execution {ctx.execution_id} (build {ctx.attempt}) failed for {ctx.repository}@{failed_digest}.\n"
                   f"Failure: {failure}: {consequence(failure, ctx.max_attempts)}.\nReason: {reason}\n"
                   f"Long-lived cluster: {outcome}")
    return item
