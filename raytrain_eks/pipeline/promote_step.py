"""Promote, after Apply: the record checks again and the compare-and-swap on the promoted digest
this run's Synth saw (infra/lambdas/image_watcher/promote.py). Any failure here leaves the
long-lived cluster on an unpromoted digest, so the caller rolls it back in the same build."""
from __future__ import annotations

from infra.lambdas.image_watcher.promote import promote

from .context import StepContext
from .kube import KubeError, live_manifest_hash, log
from .rollback import CLUSTER_FILE, own_applied_hash


def promote_step(ctx: StepContext, *, digest: str, record_uri: str, required_transport: str) -> dict[str, str]:
    run = ctx.run_file()
    cluster = ctx.manifest(CLUSTER_FILE)
    live, own = live_manifest_hash(ctx.kube, cluster["metadata"]["name"]) if cluster else "", own_applied_hash(ctx)
    if not own or live != own:
        # QUEUED mode overlaps executions across stages: promote only what this run's Apply left on
        # the cluster, never a digest whose manifest another Apply has replaced since.
        raise KubeError(f"the long-lived RayCluster is not on this run's Apply ({live or 'unmarked'}, "
                        f"applied {own or 'nothing'}): nothing promoted")
    item = promote(ssm=ctx.ssm, s3=ctx.s3, parameter_name=ctx.parameter_name, history=ctx.history,
                   digest=digest, smoke_record=record_uri, execution_id=ctx.execution_id,
                   expected=run.get("promoted_at_synth", ""), required_transport=required_transport)
    log(f"promote: {digest} promoted (was {run.get('promoted_at_synth') or 'none'})")
    return item
