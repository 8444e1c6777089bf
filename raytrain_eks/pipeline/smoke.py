"""The smoke run: the ``smoke`` RayJob on a RayCluster of its own, built from the new digest
(``dist/rayjob-smoke.k8s.yaml``), so it cannot run on pods left over from an older image.

While it runs, the image IDs its pods REPORT are collected (a container cannot read its own;
KubeRay deletes the job's cluster after it ends). Once the RayJob is ``SUCCEEDED``/``Complete``
(KubeRay's own success condition), they are written into the run's run.json as ``image_ran``,
beside ``image`` (what the manifest asked for).

With Kueue the RayJob is created suspended and waits in the queue until its Workload is
admitted, which Kueue marks by unsuspending it (``kubernetes-sigs/kueue`` tag ``v0.19.2``,
``pkg/controller/jobframework/reconciler.go:621-651`` ``startJob``); KubeRay's own deadlines then
count from that moment (``ray-project/kuberay`` ``ray-operator/v1.7.0`` ``rayjob_controller.go:887-917``).
So does Smoke's: ``TIMEOUT_SECONDS`` from the admission, the queue bounded apart by
``QUEUE_TIMEOUT_SECONDS`` (the smoke job is ``short``: only the jobs already admitted are ahead).
"""
from __future__ import annotations

import time
from typing import Any

from raytrain_eks.backends.kueue_queue import WORKLOADS, places, suspended_line, workload_items

from environment.contract import IMAGE_DIGEST_ANNOTATION, RECORD_EVIDENCE, RECORD_IMAGE_RAN, SMOKE_SERVICE_ACCOUNT

from infra.lambdas.image_watcher.history import FAILURE_IMAGE, FAILURE_INFRASTRUCTURE

from . import StepContext, split_s3, with_version
from .rollback import StepFailed
from .kube import KubeError, image_ids, log

SMOKE_JOB = "smoke"
"""jobs/smoke.toml's ``name``: its RayJob and file ``dist/rayjob-smoke.k8s.yaml``."""
FAILED_DEPLOYMENT = ("Failed", "ValidationFailed")
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


class SmokeFailed(StepFailed):
    """The smoke run failed, or could not be proven; one line (the rollback reason) and whose
    fault it is (``failure``)."""


def run_prefix(execution_id: str) -> str:
    """What every smoke run name of one execution starts with (Promote checks the record's)."""
    return f"{SMOKE_JOB}-{execution_id}-"


def run_name(execution_id: str, attempt: str) -> str:
    """Unique per build: the training refuses a run name that already finished (a retried stage
    keeps the execution id, so the attempt is part of it)."""
    return f"{run_prefix(execution_id)}{attempt}"


REGISTRY_FAULTS = ("500 Internal Server Error", "502 Bad Gateway", "503 Service Unavailable", "504 Gateway Timeout",
                   "429 Too Many Requests", "toomanyrequests", "i/o timeout", "dial tcp", "connection reset",
                   "connection refused", "context deadline exceeded", "TLS handshake timeout", "unexpected EOF",
                   "403 Forbidden", "401 Unauthorized", "no basic auth credentials")
"""Words of a pull error (the kubelet's ``state.waiting.message``: the container runtime's error,
containerd's ``failed to pull and unpack image ...: <cause>``) that put the fault on the registry,
the cache or the network between (5xx, throttling, time-outs, the node role refused): the same
digest pulls once they pass, so it is not the image's fault."""
CACHE_MISS = ("not found", "manifest unknown")
"""A digest the pull-through cache says it does not have: a first pull BY DIGEST may not fill
the cache (aws/containers-roadmap issue 2837, a user report), so through the cache this is
no proof the image is missing upstream."""


def warm_cache(ctx: StepContext, digest: str, *, ecr: Any = None, registry_url: str = "") -> str:
    """Before any pod pulls ``digest`` through the pull-through cache: fetch its manifest there BY
    TAG (``image.tag``, what the watcher and ``lock`` resolved it from), as ``docker pull
    <cache>/<name>:<tag>`` does (Amazon ECR User Guide, "Pulling an image with a pull through cache
    rule"), so the cache holds it. A first pull by digest alone, or by tag and digest, is reported
    not to fill the cache (aws/containers-roadmap issue 2837): without this every new digest's pods
    fail with "not found". The tag must still name ``digest``; if it has moved on, the cache holds
    the newer image and this run cannot pull its own: infrastructure (the watcher follows the tag).
    Returns, in words, what was done; SmokeFailed (infrastructure) when the cache did not answer."""
    if not ctx.env.image.pull_through_cache:
        return "no pull-through cache: the nodes pull from the registry"
    from environment.image_source import cache_prefix, registry_host
    from infra.lambdas.image_watcher.registry import MANIFEST_MEDIA_TYPES, ImageLocation, _request

    c, image = ctx.env.cluster, ctx.env.image
    location = ImageLocation(registry_url=registry_url or f"https://{registry_host(c.account, c.region)}",
                             name=f"{cache_prefix(c.name)}/{image.name}", tag=image.tag)
    try:
        if ecr is None:
            import boto3

            ecr = boto3.client("ecr", region_name=c.region)
        token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
        headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES), "Authorization": f"Basic {token}"}
        by_digest = f"{location.registry_url}/v2/{location.name}/manifests/{digest}"
        if _request("HEAD", by_digest, headers, location, 60.0)[0] == 200:
            return f"pull-through cache: {location.name}@{digest} is cached already"
        status, reply, body = _request("GET", location.manifest_url, headers, location, 60.0)
    except Exception as err:  # noqa: BLE001 - botocore's and the registry's errors alike: the cache's fault
        raise SmokeFailed(f"could not warm the pull-through cache with {location.display}: {err}",
                          FAILURE_INFRASTRUCTURE) from err
    if status != 200:
        raise SmokeFailed(f"could not warm the pull-through cache with {location.display}: HTTP {status}",
                          FAILURE_INFRASTRUCTURE)
    import hashlib

    cached = (reply.get("Docker-Content-Digest") or "").strip() or "sha256:" + hashlib.sha256(body).hexdigest()
    if cached != digest:
        raise SmokeFailed(f"the pull-through cache's {location.display} is {cached}, not {digest}: the tag has moved "
                          "on, so the cache cannot fill with this digest (a pull by digest does not fill it)",
                          FAILURE_INFRASTRUCTURE)
    return f"pull-through cache warmed: {location.display} is {digest}"


def pull_errors(pods: list[dict[str, Any]]) -> list[str]:
    """``pod/container: reason: message`` of the containers waiting on an image they cannot pull."""
    out = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason", "") in IMAGE_PULL_REASONS:
                message = str(waiting.get("message", "")).strip()
                # the runtime's cause ends the message (after the references it names): keep the end
                message = message if len(message) <= 300 else "..." + message[-300:]
                out.append(f"{pod['metadata']['name']}/{status['name']}: {waiting['reason']}"
                           + (f": {message}" if message else ""))
    return out


def registry_fault(pull: str, *, cached: bool) -> bool:
    """Whether one :func:`pull_errors` line is the registry's, the cache's or the network's fault."""
    text = pull.lower()
    return any(m.lower() in text for m in REGISTRY_FAULTS) or (cached and any(m in text for m in CACHE_MISS))


def job_failure(status: dict[str, Any], pulls: list[str], started: bool, *, cached: bool = False) -> str:
    """Whose fault a failed smoke RayJob is: the image's when its pods could not pull it (it
    never started) for a reason of the image's own, or KubeRay's reason says the run itself
    failed; infrastructure otherwise, a pull error of the registry or cache (:func:`registry_fault`,
    ``cached``: the pods pull through the pull-through cache) included: the image is not shelved for it."""
    if pulls and not started:
        return FAILURE_INFRASTRUCTURE if all(registry_fault(p, cached=cached) for p in pulls) else FAILURE_IMAGE
    return RAYJOB_REASON_FAILURE.get(status.get("reason", ""), FAILURE_INFRASTRUCTURE)


def smoke_job(ctx: StepContext, digest: str) -> dict[str, Any]:
    job = ctx.manifest(f"rayjob-{SMOKE_JOB}.k8s.yaml")
    if job is None:
        raise SmokeFailed(f"{ctx.dist}/rayjob-{SMOKE_JOB}.k8s.yaml is missing: was Synth run?")
    asked = job["metadata"].get("annotations", {}).get(IMAGE_DIGEST_ANNOTATION)
    if asked != digest:
        raise SmokeFailed(f"rayjob-{SMOKE_JOB}.k8s.yaml was synthesized for {asked}, not {digest}")
    job["spec"]["entrypoint"] += f" --set checkpoint.run_name={run_name(ctx.execution_id, ctx.attempt)}"
    # The smoke runs' own identity (the cluster stack associates it): it alone writes smoke-*,
    # so the evidence the gate judges is written by this run's pods and the pipeline only.
    cluster = job["spec"]["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])):
        template["spec"]["serviceAccountName"] = SMOKE_SERVICE_ACCOUNT
    if ctx.env.storage_uri != ctx.env.bucket_uri:
        # The smoke run's record is read, versioned and promoted in the bucket (CodeBuild mounts
        # no shared file system): it stays there whatever storage.shared_path says.
        job["spec"]["entrypoint"] += f" --set checkpoint.storage_path={ctx.env.bucket_uri}"
    return job


class QueueWait:
    """The smoke RayJob's wait in Kueue's queue: each new place logged (raytrain_eks/backends/kueue_queue.py,
    as ``submit`` says it), bounded by ``ctx.queue_timeout_s`` per stretch of suspension."""

    def __init__(self, ctx: StepContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.since: float | None = None
        self.last = ""

    def line(self) -> str:
        try:
            listing = self.ctx.kube.run("get", WORKLOADS, "-o", "json")
        except KubeError:  # no Kueue (no such resource type) or not readable: the RayJob's own state says it
            return suspended_line(None)
        return suspended_line(places(workload_items(listing)).get(self.name))

    def check(self) -> None:
        """Log where it waits; SmokeFailed (infrastructure: the watcher retries the digest later)
        once it has waited the bound, after deleting it (admitted later, it would hold the GPUs
        for a build that is gone)."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        line = self.line()
        if line != self.last:
            log(f"smoke: {line}")
            self.last = line
        if now - self.since >= self.ctx.queue_timeout_s:
            self.ctx.kube.delete("rayjob", self.name)
            raise SmokeFailed(f"smoke RayJob {self.name} was not admitted by Kueue within {self.ctx.queue_timeout_s:g} s "
                              f"(QUEUE_TIMEOUT_SECONDS); deleted it. Last: {line}", FAILURE_INFRASTRUCTURE)

    def admitted(self) -> None:
        if self.since is not None:
            log(f"smoke: admitted by Kueue after {time.monotonic() - self.since:.0f} s in the queue; "
                f"its {self.ctx.timeout_s:g} s count from now")
        self.since, self.last = None, ""


EVIDENCE_FILES = ("run.json", "metrics.jsonl")
"""What the gate judges of a smoke run (raytrain_eks/pipeline/gate.py ``RUN_FILES``)."""


def pin_evidence(ctx: StepContext, record_uri: str) -> dict[str, str]:
    """``{file: VersionId}`` of the smoke run's evidence as it stands once the run has ended. Only
    the smoke run's own identity could write there (its service account's prefix; the long-lived
    cluster's role is denied ``smoke-*``), and its pods are done: the gate reads these versions,
    never the newest, and fails when a newer one appears (:func:`raytrain_eks.pipeline.gate.untouched`)."""
    bucket, key = split_s3(record_uri)
    prefix = key.rsplit("/", 1)[0]
    pinned = {}
    for name in EVIDENCE_FILES:
        try:
            version = ctx.s3.head_object(Bucket=bucket, Key=f"{prefix}/{name}").get("VersionId") or ""
        except ctx.s3.exceptions.ClientError:
            continue  # a run without metrics is still judged (and compared on what it has)
        if version and version != "null":
            pinned[name] = version
    return pinned


def run_smoke(ctx: StepContext, digest: str) -> str:
    """Run it, wait, record ``image_ran``; return the run.json URI. SmokeFailed otherwise."""
    job = smoke_job(ctx, digest)
    log(warm_cache(ctx, digest))  # before any pod pulls it through the cache
    name = job["metadata"]["name"]
    ctx.kube.delete("rayjob", name)
    ctx.apply_network_policies()
    ctx.kube.apply(job)
    seen: dict[str, str] = {}
    pulls: list[str] = []
    started = False  # the Ray job RUNNING: the image started
    queue = QueueWait(ctx, name)
    deadline = None  # counts from the admission (at once without Kueue: never suspended)
    while True:
        current = ctx.kube.get("rayjob", name) or {}
        if (current.get("spec") or {}).get("suspend"):
            queue.check()
            deadline = None  # suspended again (evicted): KubeRay's deadlines restart at the next admission too
            time.sleep(ctx.poll_s)
            continue
        if deadline is None:
            deadline = time.monotonic() + ctx.timeout_s
            queue.admitted()
        status = current.get("status") or {}
        cluster = status.get("rayClusterName")
        if cluster:
            pods = ctx.kube.cluster_pods(cluster)
            seen.update({k: v for k, v in image_ids(pods, ctx.repository).items() if v})
            pulls = pull_errors(pods) or pulls
        job_status, deployment = status.get("jobStatus", ""), status.get("jobDeploymentStatus", "")
        started = started or job_status in ("RUNNING", "SUCCEEDED", "FAILED")
        log(f"smoke: {job_status or 'PENDING'} / {deployment or '-'}")
        if job_status == "SUCCEEDED" and deployment == "Complete":
            break
        if job_status in ("FAILED", "STOPPED") or deployment in FAILED_DEPLOYMENT:
            failure = job_failure(status, pulls, started, cached=ctx.env.image.pull_through_cache)
            pulled = f"; image pull: {', '.join(pulls[:3])}" if pulls and not started else ""
            raise SmokeFailed(f"smoke RayJob {name}: {job_status or '-'} / {deployment or '-'} "
                              f"({status.get('reason', '')}: {str(status.get('message', ''))[:200]}){pulled}",
                              failure)
        if time.monotonic() >= deadline:
            # Never RUNNING: it waited for nodes (or a pull); RUNNING past the budget: the image is slow.
            raise SmokeFailed(f"smoke RayJob {name} did not finish within {ctx.timeout_s:g} s "
                              f"({'it ran' if started else 'it never started'})",
                              FAILURE_IMAGE if started else FAILURE_INFRASTRUCTURE)
        time.sleep(ctx.poll_s)
    if not seen:
        raise SmokeFailed(f"smoke RayJob {name}: no pod of its cluster reported an image ID")
    uri = f"{ctx.env.bucket_uri}/{run_name(ctx.execution_id, ctx.attempt)}/run.json"
    evidence = pin_evidence(ctx, uri)
    record = ctx.read_json(with_version(uri, evidence.get("run.json")))
    record[RECORD_IMAGE_RAN] = {"pods": dict(sorted(seen.items())),
                                "source": "kubectl: pod status.containerStatuses[].imageID"}
    record[RECORD_EVIDENCE] = evidence
    version = ctx.write_json(uri, record)
    log(f"smoke: {uri}: image_ran {sorted(set(seen.values()))}")
    # The exact object the gate judges and Promote re-reads (the bucket is versioned).
    return with_version(uri, version)
