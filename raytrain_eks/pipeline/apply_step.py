"""Apply: the long-lived RayCluster on the candidate digest, unless another execution promoted
since this run's Synth (CodePipeline's QUEUED mode runs one execution per stage at a time, so a
push's Synth can pick the promoted digest while the watcher's execution is still in Smoke).

It never kills a running job: before a change, it waits (bounded) until no RayJob runs on the
cluster, or defers, and applies only inside ``pipeline.maintenance_window`` when one is declared
(cluster_jobs.py); it says which. The manifest goes on with :data:`.kube.APPLIED_ANNOTATION` and is recorded as an ``applied``
history item first, so a later rollback returns to exactly what a promotion applied.
"""
from __future__ import annotations

import json

from infra.lambdas.image_watcher.history import APPLIED, Superseded
from infra.lambdas.image_watcher.promote import promoted_digest

from .cluster_jobs import clear_to_recreate
from .context import StepContext
from .kube import KubeError, annotated, head_uid, live_manifest_hash, log, manifest_hash, wait_ready
from .rollback import CLUSTER_FILE


def check_not_superseded(ctx: StepContext, digest: str) -> str:
    """The promoted digest Synth saw; Superseded when it changed since."""
    run = ctx.run_file()
    if run.get("digest") != digest:
        raise KubeError(f"dist/ was synthesized for {run.get('digest')}, not {digest}")
    seen, now = run.get("promoted_at_synth", ""), promoted_digest(ctx.ssm, ctx.parameter_name, ctx.history)
    if now != seen:
        raise Superseded(f"the promoted digest changed since Synth ({seen or 'none'} -> {now}): this run is "
                         f"superseded and applies nothing")
    return seen


def _head_template(manifest: dict) -> dict:
    """The head's pod template less what KubeRay's Recreate hash leaves out of it (tolerations,
    scheduling gates: ``ray-operator/v1.7.0`` utils/util.go GenerateHashWithoutReplicasAndWorkersToDelete)."""
    template = json.loads(json.dumps(manifest["spec"]["headGroupSpec"]["template"]))
    for field in ("tolerations", "schedulingGates"):
        template.get("spec", {}).pop(field, None)
    return template


def replaced_head(ctx: StepContext, manifest: dict) -> str:
    """The uid of the live head pod this apply must replace ("" when none must be): with
    upgradeStrategy Recreate, a change of the head's pod template changes KubeRay's hash, so
    every pod is deleted and a new head (a new uid) created; until then the old one may still
    look ready. The previous manifest is the one the live annotation names (its ``applied`` item)."""
    if (manifest["spec"].get("upgradeStrategy") or {}).get("type") != "Recreate":
        return ""
    name = manifest["metadata"]["name"]
    live = live_manifest_hash(ctx.kube, name)
    previous = next((e for e in ctx.history.events() if e["event"] == APPLIED and e.get("manifest_hash") == live),
                    None) if live else None
    if previous is None or _head_template(json.loads(previous["manifest"])) == _head_template(manifest):
        return ""
    return head_uid(ctx.kube.cluster_pods(name))


def apply(ctx: StepContext, digest: str) -> None:
    check_not_superseded(ctx, digest)
    cluster = ctx.manifest(CLUSTER_FILE)
    if cluster is None:
        raise KubeError(f"{ctx.dist}/{CLUSTER_FILE} is missing: was Synth run?")
    manifest = annotated(cluster)
    name = manifest["metadata"]["name"]
    if live_manifest_hash(ctx.kube, name) == manifest_hash(manifest):
        # KubeRay's Recreate hash is of the spec: the same manifest recreates no pod
        log(f"apply: RayCluster {name} already carries this manifest: no pod is recreated")
    else:
        log(f"apply: {clear_to_recreate(ctx, name)}")
    old_head = replaced_head(ctx, manifest)
    ctx.history.record(event=APPLIED, digest=digest, execution_id=ctx.execution_id,
                       manifest=json.dumps(manifest, sort_keys=True, separators=(",", ":")),
                       manifest_hash=manifest_hash(manifest))
    ctx.apply_network_policies()
    ctx.kube.apply(manifest)
    log(f"apply: RayCluster {manifest['metadata']['name']} applied at @{digest}")
    wait_ready(ctx.kube, manifest, repository=ctx.repository, digest=digest,
               timeout_s=ctx.timeout_s, poll_s=ctx.poll_s, replaced_head=old_head)
