"""Promote, after Apply: the record checks again and the compare-and-swap on the promoted digest
this run's Synth saw (infra/lambdas/image_watcher/promote.py). Any failure here leaves the
long-lived cluster on an unpromoted digest, so the caller rolls it back in the same build.

The record is the exact object version the smoke step wrote and the gate judged (the Smoke
action exports ``s3://...run.json?versionId=V``), and it must be one of THIS execution's smoke
runs: its folder and its own ``run_dir`` both name ``smoke-<execution id>-<build>``."""
from __future__ import annotations

from infra.lambdas.image_watcher.promote import promote, split_record_uri

from .context import StepContext
from .failures import StepFailed
from .kube import KubeError, live_manifest_hash, log
from .rollback import CLUSTER_FILE, own_applied_hash
from .smoke import run_prefix


def check_own_record(ctx: StepContext, record_uri: str) -> None:
    """StepFailed (not the image's failure) unless ``record_uri`` is pinned to a version and
    names this execution's run."""
    _, key, version = split_record_uri(record_uri)
    if not version:
        raise StepFailed(f"smoke record {record_uri} names no object version: Promote reads the one the "
                         "gate judged (s3://...?versionId=V); nothing promoted")
    folder = key.rsplit("/", 2)[-2] if key.count("/") else ""
    if not folder.startswith(run_prefix(ctx.execution_id)):
        raise StepFailed(f"smoke record {record_uri} is not a run of execution {ctx.execution_id} "
                         f"({run_prefix(ctx.execution_id)}<build>): nothing promoted")
    run_dir = str(ctx.read_json(record_uri).get("run_dir", ""))
    if run_dir.rstrip("/").rsplit("/", 1)[-1] != folder:
        raise StepFailed(f"smoke record {record_uri} says it is run {run_dir!r}, not {folder}: nothing promoted")


def promote_step(ctx: StepContext, *, digest: str, record_uri: str, required_transport: str) -> dict[str, str]:
    run = ctx.run_file()
    check_own_record(ctx, record_uri)
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
