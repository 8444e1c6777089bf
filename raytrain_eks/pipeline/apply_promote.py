"""Apply, then Promote: the long-lived RayCluster moved onto the candidate digest, then that
digest promoted.

Apply: the long-lived RayCluster on the candidate digest, unless another execution promoted
since this run's Synth (CodePipeline's QUEUED mode runs one execution per stage at a time, so a
push's Synth can pick the promoted digest while the watcher's execution is still in Smoke).

It never kills a running job: before a change, it waits (bounded) until no RayJob runs on the
cluster, or defers, and applies only inside ``pipeline.maintenance_window`` when one is declared
(:func:`clear_to_recreate`); it says which. The manifest goes on with
:data:`.kube.APPLIED_ANNOTATION` and is recorded as an ``applied`` history item first, so a later rollback returns to exactly what a promotion applied.

Promote, after Apply: the record checks again and the compare-and-swap on the promoted digest
this run's Synth saw (infra/lambdas/image_watcher/promote.py). Any failure here leaves the
long-lived cluster on an unpromoted digest, so the caller rolls it back in the same build.

The record is the exact object version the smoke step wrote and the gate judged (the Smoke
action exports ``s3://...run.json?versionId=V``), and it must be one of THIS execution's smoke
runs: its folder and its own ``run_dir`` both name ``smoke-<execution id>-<build>``.

Waiting for the jobs: which RayJobs run on the cluster is KubeRay v1.7.0's own reading
(``ray-project/kuberay`` tag ``ray-operator/v1.7.0``): a RayJob targets an existing cluster through
``spec.clusterSelector["ray.io/cluster"]`` (``utils/constant.go`` RayJobClusterSelectorKey;
``rayjob_controller.go`` initRayJobStatusIfNeed sets ``status.rayClusterName`` from it), and it
is over once ``status.jobDeploymentStatus`` is terminal (``apis/ray/v1/rayjob_types.go``
IsJobDeploymentTerminal: ``Complete`` or ``Failed``). A RayJob parked in ``ValidationFailed`` or
``Suspended`` has no Ray job on the cluster. Every other state (``""`` New, ``Initializing``,
``Running``, ``Retrying``, ``Waiting``, ``Suspending``) counts as running: it is about to submit,
or has submitted, a driver to the head.

Ray jobs submitted to the head directly (``ray job submit``, not a RayJob) are not seen here.
"""
from __future__ import annotations

import datetime
import json
import math
import time
from typing import Any, Callable

from environment.contract import RAY_CLUSTER_LABEL
from environment.rules import parse_window
from infra.lambdas.image_watcher.history import APPLIED, FAILURE_DEFERRED, Superseded
from infra.lambdas.image_watcher.promote import PromotionError, promote, promoted_digest, split_record_uri

from . import StepContext
from .kube import KubeError, annotated, head_uid, live_manifest_hash, log, manifest_hash, wait_ready
from .rollback import CLUSTER_FILE, StepFailed, own_applied_hash
from .smoke import run_prefix


TERMINAL_DEPLOYMENTS = ("Complete", "Failed")
"""rayjob_types.go IsJobDeploymentTerminal at ray-operator/v1.7.0."""
PARKED_DEPLOYMENTS = ("ValidationFailed", "Suspended")
"""States in which no Ray job of the RayJob is on the cluster."""


class Deferred(StepFailed):
    """Apply left the long-lived cluster alone (a job was running, or outside the window)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, FAILURE_DEFERRED)


def running_on(rayjobs: list[dict[str, Any]], cluster: str) -> list[str]:
    """The names of the RayJobs running (or about to) on the RayCluster ``cluster``, sorted."""
    return sorted(
        job["metadata"]["name"] for job in rayjobs
        if ((job.get("spec") or {}).get("clusterSelector") or {}).get(RAY_CLUSTER_LABEL) == cluster
        and (job.get("status") or {}).get("jobDeploymentStatus", "") not in TERMINAL_DEPLOYMENTS + PARKED_DEPLOYMENTS)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def running_gpu_jobs(rayjobs: list[dict[str, Any]]) -> list[str]:
    """The names of the RayJobs running (or about to) anywhere in the namespace, sorted: a RayJob
    with a RayCluster of its own runs on the GPU nodes as much as one on the long-lived cluster."""
    return sorted(job["metadata"]["name"] for job in rayjobs
                  if (job.get("status") or {}).get("jobDeploymentStatus", "") not in TERMINAL_DEPLOYMENTS + PARKED_DEPLOYMENTS)


def clear_to_disturb(ctx: StepContext, what: str, running: Callable[[], list[str]], *,
                     clock: Callable[[], float] = time.monotonic,
                     now: Callable[[], datetime.datetime] = utc_now) -> str:
    """THE wait before the pipeline disturbs running jobs (Apply recreating the long-lived
    cluster, Deploy rolling or replacing a GPU node group): only inside
    ``pipeline.maintenance_window`` when one is declared, and only once ``running()`` (the
    RayJobs it would disturb) is empty, waiting at most ``pipeline.apply_wait_minutes`` (and
    never past the window's close). Returns, in words, why ``what`` may go ahead now; Deferred
    when it may not."""
    spec = ctx.env.pipeline
    window = parse_window(spec.maintenance_window)
    bound = 60.0 * spec.apply_wait_minutes
    if window is not None:
        closes = window.closes(now())
        if closes is None:
            raise Deferred(f"outside the maintenance window {spec.maintenance_window!r} (next opens "
                           f"{window.next_opening(now()):%a %Y-%m-%d %H:%M} UTC): {what} is left as it is")
        bound = min(bound, (closes - now()).total_seconds())
    within = f" in the maintenance window {spec.maintenance_window!r}" if window else ""
    start, first = clock(), None
    while True:
        jobs = running()
        first = jobs if first is None else first
        if not jobs:
            if not first:
                return f"no RayJob runs on {what}{within}"
            return f"waited {clock() - start:.0f} s for RayJob(s) {', '.join(first)} on {what} to end{within}"
        if clock() - start >= bound:
            raise Deferred(f"RayJob(s) {', '.join(jobs)} still running on {what} after "
                           f"{bound:.0f} s (pipeline.apply_wait_minutes = {spec.apply_wait_minutes}"
                           f"{', the window closes' if window else ''}): applied nothing, the jobs run on")
        log(f"waiting for RayJob(s) {', '.join(jobs)} on {what} to end")
        time.sleep(ctx.poll_s)


def clear_to_recreate(ctx: StepContext, cluster: str, *, clock: Callable[[], float] = time.monotonic,
                      now: Callable[[], datetime.datetime] = utc_now) -> str:
    """Return, in words, why Apply may recreate ``cluster`` now (after waiting for its jobs if
    need be); Deferred when it may not (:func:`clear_to_disturb`)."""
    return clear_to_disturb(ctx, f"RayCluster {cluster}", lambda: running_on(ctx.kube.rayjobs(), cluster),
                            clock=clock, now=now)


def _gpu_groups(template: dict) -> dict[str, tuple[str, dict]]:
    """The template's GPU node groups by their spec name (the :data:`GROUP_TAG` tag): logical id, resource."""
    from infra.verify_gate import GROUP_TAG

    resources = template.get("Resources") or {}
    return {r["Properties"]["Tags"][GROUP_TAG]: (lid, r) for lid, r in resources.items()
            if r.get("Type") == "AWS::EKS::Nodegroup" and GROUP_TAG in ((r.get("Properties") or {}).get("Tags") or {})}


def _launch_data(template: dict, group: dict) -> Any:
    ref = ((group["Properties"].get("LaunchTemplate") or {}).get("Id") or {}).get("Ref")
    return (((template.get("Resources") or {}).get(ref) or {}).get("Properties") or {}).get("LaunchTemplateData")


def _other_groups(template: dict) -> dict[str, dict]:
    """The template's node groups that are no GPU group (the system nodes), by logical id."""
    from infra.verify_gate import GROUP_TAG

    return {lid: r for lid, r in (template.get("Resources") or {}).items()
            if r.get("Type") == "AWS::EKS::Nodegroup" and GROUP_TAG not in ((r.get("Properties") or {}).get("Tags") or {})}


REPLACING = ("InstanceTypes", "CapacityType", "Subnets", "AmiType", "DiskSize", "NodeRole", "RemoteAccess")
"""The createOnlyProperties of ``AWS::EKS::Nodegroup`` (cfn-lint's resource schema) a template of
this app writes: a change replaces the group, and its nodes end."""


def gpu_node_changes(deployed: dict, new: dict) -> list[str]:
    """What deploying the cluster template ``new`` over ``deployed`` does to running GPU nodes,
    one line per group ([]: nothing). A group whose :data:`infra.verify_gate.CREATION_TAG`
    or ``Subnets`` changed is REPLACED (its inputs are the createOnlyProperties of ``AWS::EKS::Nodegroup``:
    CloudFormation creates a new group and deletes the old one with its nodes); a group whose
    launch template's LaunchTemplateData, Kubernetes ``Version`` or ``ReleaseVersion`` changed is
    ROLLED (a new launch-template version or AMI is a rolling node update: EKS User Guide, "Update
    a managed node group"); a group gone from the template is DELETED with its nodes. A scaling
    change touches no node here (the deploy never resets a running size: infra/verify_gate.py).
    The system node group (every Ray head runs there) counts the same way: replaced when one of
    :data:`REPLACING` changed, rolled when its launch template or AMI did."""
    from infra.verify_gate import CREATION_TAG

    before, after = _gpu_groups(deployed), _gpu_groups(new)
    out = []
    for name, (_, old) in sorted(before.items()):
        if name not in after:
            out.append(f"GPU group {name} is deleted with its nodes")
            continue
        _, now_ = after[name]
        o, n = old["Properties"], now_["Properties"]
        if o["Tags"].get(CREATION_TAG) != n["Tags"].get(CREATION_TAG):
            out.append(f"GPU group {name} is replaced ({o['Tags'].get(CREATION_TAG)} -> {n['Tags'].get(CREATION_TAG)}): "
                       "its nodes end")
        elif o.get("Subnets") != n.get("Subnets"):  # create-only; on an existing cluster literal subnet ids
            out.append(f"GPU group {name} is replaced (subnets {o.get('Subnets')} -> {n.get('Subnets')}): its nodes end")
        elif (_launch_data(deployed, old) != _launch_data(new, now_)
              or any(o.get(k) != n.get(k) for k in ("Version", "ReleaseVersion"))):
            out.append(f"GPU group {name} rolls every node (a new launch template version or AMI)")
    # Every Ray head runs on the system nodes (charts/ray_charts.py): replacing or rolling them
    # evicts the head of every running job, which ends it, as surely as a GPU node's loss.
    after_other = _other_groups(new)
    for lid, old in sorted(_other_groups(deployed).items()):
        if lid not in after_other:
            out.append(f"the system node group ({lid}) is deleted with its nodes: every Ray head on it ends")
            continue
        o, n = old["Properties"], after_other[lid]["Properties"]
        if any(o.get(k) != n.get(k) for k in REPLACING):
            out.append(f"the system node group ({lid}) is replaced: every Ray head on it ends")
        elif (_launch_data(deployed, old) != _launch_data(new, after_other[lid])
              or any(o.get(k) != n.get(k) for k in ("Version", "ReleaseVersion"))):
            out.append(f"the system node group ({lid}) rolls every node (a new launch template version or AMI): "
                       "every Ray head on it is evicted")
    return out


def hold_deploy(ctx: StepContext, deployed: dict, new: dict, **wait: Any) -> str:
    """Before Deploy: when the cluster stack's update rolls, replaces or deletes a GPU node group,
    wait for the running GPU jobs and the maintenance window exactly as Apply does
    (:func:`clear_to_disturb`); Deferred when they do not end in time. Returns, in words, why the
    deploy may go ahead."""
    changes = gpu_node_changes(deployed, new)
    if not changes:
        return "the deploy rolls, replaces or deletes no GPU node group"
    why = clear_to_disturb(ctx, "the GPU node groups" if all(line.startswith("GPU group") for line in changes)
                           else "the node groups", lambda: running_gpu_jobs(ctx.kube.rayjobs()), **wait)
    return f"{'; '.join(changes)}: {why}"


HOLD_MAX_AGE_MINUTES = 15
"""How old HoldDeploy's pass may be when DeployStacks starts. A normal run's gap is CodeBuild's
queue, provisioning and Deploy's install phase (pip and npm), assumed under 15 minutes; a
"Retry failed actions" reruns DeployStacks alone, not the HoldDeploy that passed (CodePipeline
RetryStageExecution, retryMode FAILED_ACTIONS), often hours later: that pass must not count."""


HOLD_CLOCK_SKEW_S = 60
"""How far HoldDeploy's clock may run ahead of DeployStacks' (two CodeBuild hosts, NTP-synchronized,
and the pass rounded to whole seconds)."""


class HoldExpired(RuntimeError):
    """DeployStacks without a fresh HoldDeploy pass of its own execution: nothing deployed."""


def check_hold_fresh(passed_at: str, now: float) -> str:
    """Before ``cdk deploy``: the HoldDeploy pass this Deploy runs on (its exported
    ``HOLD_PASSED_AT``, epoch seconds) is at most :data:`HOLD_MAX_AGE_MINUTES` old. The hold's
    verdict (no GPU job running, inside the window) is a fact of the moment it passed; a Deploy
    retried alone would roll nodes on a stale one. HoldExpired (one line, what to do) otherwise."""
    fix = ("use 'Retry stage' (retryMode ALL_ACTIONS), not 'Retry failed actions', so that HoldDeploy "
           "checks the running GPU jobs and the maintenance window again")
    try:
        age = now - float(passed_at)
    except ValueError:
        raise HoldExpired(f"HOLD_PASSED_AT = {passed_at!r}: no HoldDeploy pass of this execution; {fix}") from None
    if not math.isfinite(age):  # float() reads nan and inf as numbers
        raise HoldExpired(f"HOLD_PASSED_AT = {passed_at!r}: not epoch seconds (HoldDeploy prints a whole "
                          f"number); {fix}")
    # -60 s: the two builds' clocks (CodeBuild hosts, NTP-synchronized) and the rounding to seconds
    if age < -HOLD_CLOCK_SKEW_S:
        raise HoldExpired(f"HOLD_PASSED_AT = {passed_at!r}: {-age:.0f} s after this build's clock (at most "
                          f"{HOLD_CLOCK_SKEW_S} s of skew): a clock or the variable is wrong; {fix}")
    if age > 60 * HOLD_MAX_AGE_MINUTES:
        raise HoldExpired(f"HoldDeploy passed {age / 60:.0f} min before this DeployStacks (at most "
                          f"{HOLD_MAX_AGE_MINUTES} min): a GPU job may run or the window may have closed since; {fix}")
    return f"HoldDeploy passed {max(age, 0):.0f} s ago"


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
    log(f"promote: {keep_in_cache(ctx, digest)}")
    item = promote(ssm=ctx.ssm, s3=ctx.s3, parameter_name=ctx.parameter_name, history=ctx.history,
                   digest=digest, smoke_record=record_uri, execution_id=ctx.execution_id,
                   expected=run.get("promoted_at_synth", ""), required_transport=required_transport)
    log(f"promote: {digest} promoted (was {run.get('promoted_at_synth') or 'none'})")
    return item


def keep_in_cache(ctx: StepContext, digest: str) -> str:
    """Before the compare-and-swap: tag ``digest`` in the pull-through cache's repository
    (:func:`environment.image_source.promoted_tag`), so the cache's lifecycle policy keeps it
    (infra/stacks/cluster.py ``PullThroughCache``): the nodes pull by digest, the cache fills only
    by tag, and ``image.tag`` moves on to the next candidate, leaving the promoted digest untagged
    and expirable. Re-tagging is BatchGetImage of the manifest, then PutImage of the same bytes
    under the new tag (Amazon ECR API Reference, PutImage; an image that already has the tag
    answers ``ImageAlreadyExistsException``). Returns, in words, what was done; PromotionError
    (nothing promoted) when the cache would not keep it."""
    if not ctx.env.image.pull_through_cache:
        return "no pull-through cache: the nodes pull from the registry"
    from environment.image_source import cache_repository, promoted_tag
    from infra.lambdas.image_watcher.registry import MANIFEST_MEDIA_TYPES

    repository, tag = cache_repository(ctx.env), promoted_tag(digest)
    ecr = ctx.ecr
    try:
        if ecr is None:
            import boto3

            ecr = boto3.client("ecr", region_name=ctx.env.cluster.region)
        found = ecr.batch_get_image(repositoryName=repository, imageIds=[{"imageDigest": digest}],
                                    acceptedMediaTypes=list(MANIFEST_MEDIA_TYPES))["images"]
        if not found:
            raise PromotionError(f"{repository}@{digest} is not in the pull-through cache: nothing promoted")
        image = found[0]
        extra = {"imageManifestMediaType": image["imageManifestMediaType"]} if image.get("imageManifestMediaType") else {}
        try:
            ecr.put_image(repositoryName=repository, imageManifest=image["imageManifest"], imageTag=tag,
                          imageDigest=digest, **extra)
        except ecr.exceptions.ImageAlreadyExistsException:
            return f"{repository}@{digest} is tagged {tag} already"
    except PromotionError:
        raise
    except Exception as err:  # noqa: BLE001 - botocore's errors: the cache would not keep the digest
        raise PromotionError(f"could not tag {repository}@{digest} as {tag} in the pull-through cache, so its "
                             f"lifecycle policy could expire it: {err}: nothing promoted") from err
    return f"{repository}@{digest} tagged {tag}: the cache's lifecycle policy keeps it"
