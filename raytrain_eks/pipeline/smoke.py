"""The smoke run: the ``smoke`` RayJob on a RayCluster of its own, built from the new digest
(``dist/rayjob-smoke.k8s.yaml``), so it cannot run on pods left over from an older image.

While it runs, the image IDs its pods REPORT are collected (a container cannot read its own;
KubeRay deletes the job's cluster after it ends). Once the RayJob is ``SUCCEEDED``/``Complete``
(KubeRay's own success condition), they are written into the run's run.json as ``image_ran``,
beside ``image`` (what the manifest asked for).
"""
from __future__ import annotations

import time
from typing import Any

from environment.contract import IMAGE_DIGEST_ANNOTATION, RECORD_IMAGE_RAN

from infra.lambdas.image_watcher.history import FAILURE_IMAGE, FAILURE_INFRASTRUCTURE

from .context import StepContext, with_version
from .failures import RAYJOB_REASON_FAILURE, StepFailed, pull_errors
from .kube import image_ids, log

SMOKE_JOB = "smoke"
"""jobs/smoke.toml's ``name``: its RayJob and file ``dist/rayjob-smoke.k8s.yaml``."""
FAILED_DEPLOYMENT = ("Failed", "ValidationFailed")


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


def job_failure(status: dict[str, Any], pulls: list[str], started: bool) -> str:
    """Whose fault a failed smoke RayJob is: the image's when its pods could not pull it (it
    never started) or KubeRay's reason says the run itself failed; infrastructure otherwise."""
    if pulls and not started:
        return FAILURE_IMAGE
    return RAYJOB_REASON_FAILURE.get(status.get("reason", ""), FAILURE_INFRASTRUCTURE)


def smoke_job(ctx: StepContext, digest: str) -> dict[str, Any]:
    job = ctx.manifest(f"rayjob-{SMOKE_JOB}.k8s.yaml")
    if job is None:
        raise SmokeFailed(f"{ctx.dist}/rayjob-{SMOKE_JOB}.k8s.yaml is missing: was Synth run?")
    asked = job["metadata"].get("annotations", {}).get(IMAGE_DIGEST_ANNOTATION)
    if asked != digest:
        raise SmokeFailed(f"rayjob-{SMOKE_JOB}.k8s.yaml was synthesized for {asked}, not {digest}")
    job["spec"]["entrypoint"] += f" --set checkpoint.run_name={run_name(ctx.execution_id, ctx.attempt)}"
    if ctx.env.storage_uri != ctx.env.bucket_uri:
        # The smoke run's record is read, versioned and promoted in the bucket (CodeBuild mounts
        # no shared file system): it stays there whatever storage.shared_path says.
        job["spec"]["entrypoint"] += f" --set checkpoint.storage_path={ctx.env.bucket_uri}"
    return job


def run_smoke(ctx: StepContext, digest: str) -> str:
    """Run it, wait, record ``image_ran``; return the run.json URI. SmokeFailed otherwise."""
    job = smoke_job(ctx, digest)
    name = job["metadata"]["name"]
    ctx.kube.delete("rayjob", name)
    ctx.apply_network_policies()
    ctx.kube.apply(job)
    seen: dict[str, str] = {}
    pulls: list[str] = []
    started = False  # the Ray job RUNNING: the image started
    deadline = time.monotonic() + ctx.timeout_s
    while True:
        current = ctx.kube.get("rayjob", name) or {}
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
            failure = job_failure(status, pulls, started)
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
    record = ctx.read_json(uri)
    record[RECORD_IMAGE_RAN] = {"pods": dict(sorted(seen.items())),
                                "source": "kubectl: pod status.containerStatuses[].imageID"}
    version = ctx.write_json(uri, record)
    log(f"smoke: {uri}: image_ran {sorted(set(seen.values()))}")
    # The exact object the gate judges and Promote re-reads (the bucket is versioned).
    return with_version(uri, version)
