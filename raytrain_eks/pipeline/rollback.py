"""Automatic rollback: put the long-lived RayCluster back on the promoted digest and record why.

The candidate never reaches the long-lived cluster before smoke and gate pass (the smoke run
has a cluster of its own), so after a smoke or gate failure this re-applies what is already
there and returns at once; after a failed Apply it recreates the pods on the promoted image.
Either way the history gets one ``rolled-back`` item naming the failed digest and the reason.
"""
from __future__ import annotations

from infra.lambdas.image_watcher.history import ROLLED_BACK
from infra.lambdas.image_watcher.watcher import read_promoted

from .context import StepContext
from .kube import KubeError, log, wait_for_image

CLUSTER_FILE = "raycluster.k8s.yaml"


def rollback(ctx: StepContext, *, failed_digest: str, reason: str) -> dict[str, str]:
    promoted = read_promoted(ctx.ssm, ctx.parameter_name)
    cluster = ctx.manifest(CLUSTER_FILE, promoted=True) if promoted and promoted != failed_digest else None
    if not promoted:
        outcome = "nothing promoted yet: nothing to roll back to"
    elif promoted == failed_digest:
        outcome = "the failed digest is the promoted one: an older one needs an explicit IMAGE_DIGEST run"
    else:
        outcome = "cluster on the promoted digest"
    if cluster is not None:
        try:
            ctx.kube.apply(cluster)
            wait_for_image(ctx.kube, cluster, repository=ctx.repository, digest=promoted,
                           timeout_s=ctx.timeout_s, poll_s=ctx.poll_s)
        except KubeError as err:
            outcome = f"re-apply of the promoted digest failed too: {err}"
    log(f"rollback: {failed_digest} -> {promoted or 'none'}: {reason} ({outcome})")
    return ctx.history.record(event=ROLLED_BACK, digest=failed_digest, execution_id=ctx.execution_id,
                              rolled_back_to=promoted or "none", reason=reason[:1000], outcome=outcome[:500])
