"""Apply: the long-lived RayCluster on the candidate digest, unless another execution promoted
since this run's Synth (CodePipeline's QUEUED mode runs one execution per stage at a time, so a
push's Synth can pick the promoted digest while the watcher's execution is still in Smoke).

The manifest goes on with :data:`.kube.APPLIED_ANNOTATION` and is recorded as an ``applied``
history item first, so a later rollback returns to exactly what a promotion applied.
"""
from __future__ import annotations

import json

from infra.lambdas.image_watcher.history import APPLIED, Superseded
from infra.lambdas.image_watcher.watcher import read_promoted

from .context import StepContext
from .kube import KubeError, annotated, log, manifest_hash, wait_ready
from .rollback import CLUSTER_FILE


def check_not_superseded(ctx: StepContext, digest: str) -> str:
    """The promoted digest Synth saw; Superseded when it changed since."""
    run = ctx.run_file()
    if run.get("digest") != digest:
        raise KubeError(f"dist/ was synthesized for {run.get('digest')}, not {digest}")
    seen, now = run.get("promoted_at_synth", ""), read_promoted(ctx.ssm, ctx.parameter_name)
    if now != seen:
        raise Superseded(f"the promoted digest changed since Synth ({seen or 'none'} -> {now}): this run is "
                         f"superseded and applies nothing")
    return seen


def apply(ctx: StepContext, digest: str) -> None:
    check_not_superseded(ctx, digest)
    cluster = ctx.manifest(CLUSTER_FILE)
    if cluster is None:
        raise KubeError(f"{ctx.dist}/{CLUSTER_FILE} is missing: was Synth run?")
    manifest = annotated(cluster)
    ctx.history.record(event=APPLIED, digest=digest, execution_id=ctx.execution_id,
                       manifest=json.dumps(manifest, sort_keys=True, separators=(",", ":")),
                       manifest_hash=manifest_hash(manifest))
    ctx.apply_network_policies()
    ctx.kube.apply(manifest)
    log(f"apply: RayCluster {manifest['metadata']['name']} applied at @{digest}")
    wait_ready(ctx.kube, manifest, repository=ctx.repository, digest=digest,
               timeout_s=ctx.timeout_s, poll_s=ctx.poll_s)
