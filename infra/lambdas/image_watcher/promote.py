"""The pipeline's last action: promote the digest the smoke run proved.

Invoked by CodePipeline (Lambda invoke action) with UserParameters
``{"digest": ..., "smoke_record": ..., "execution_id": ...}`` resolved from the earlier stages'
variables. It promotes only what the smoke run PROVED: it reads the run's record (run.json,
written by training/run_record.py, with ``image_ran`` added by the pipeline's smoke step from
the image IDs the pods reported) and requires ``status == "succeeded"``, EVERY pod to have run
this very digest (what ran, not what the manifest asked for), and the run's inter-node
transport (training/transport.py's aggregate, where the worst rank wins) to be the required
one (``efa`` on a multi-node EFA group). Then it writes the SSM parameter the watcher compares against, records the promotion,
and reports the job's result to CodePipeline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from environment.contract import DIGEST_PATTERN, RECORD_IMAGE_RAN

from .history import PROMOTED, PromotionHistory


class JobResults(Protocol):
    """The two CodePipeline job calls (moto has no job API: tests pass a recorder)."""

    def success(self, job_id: str) -> None: ...

    def failure(self, job_id: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class CodePipelineJobResults:
    client: Any

    def success(self, job_id: str) -> None:
        self.client.put_job_success_result(jobId=job_id)

    def failure(self, job_id: str, message: str) -> None:
        self.client.put_job_failure_result(
            jobId=job_id, failureDetails={"type": "JobFailed", "message": message[:5000]})


class PromotionError(ValueError):
    """The action's input is unusable; the message becomes the pipeline's failure line."""


def parse_job(event: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """``(job_id, {"digest", "smoke_record", "execution_id"})`` from a CodePipeline job event."""
    job = event["CodePipeline.job"]
    raw = job["data"]["actionConfiguration"]["configuration"].get("UserParameters", "")
    try:
        params = json.loads(raw)
    except ValueError:
        raise PromotionError(f"UserParameters is not JSON: {raw[:80]!r}") from None
    if not isinstance(params, dict):
        raise PromotionError(f"UserParameters is not a JSON object: {raw[:80]!r}")
    if not DIGEST_PATTERN.fullmatch(str(params.get("digest", ""))):
        raise PromotionError(f"digest {params.get('digest')!r} is not sha256:<64 hex>: nothing promoted")
    if not str(params.get("smoke_record", "")).startswith("s3://"):
        raise PromotionError(f"smoke_record {params.get('smoke_record')!r} is not an s3:// URI: nothing promoted")
    return job["id"], {k: str(params.get(k, "")) for k in ("digest", "smoke_record", "execution_id")}


def is_missing(err: Exception) -> bool:
    """A missing key: 404/NoSuchKey, or 403/AccessDenied, which S3 answers instead of 404 to a
    caller without s3:ListBucket (the promoter may read run.json files, nothing else)."""
    response = getattr(err, "response", {}) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("NoSuchKey", "404", "AccessDenied", "403") or status in (403, 404)


def read_record(s3: Any, uri: str) -> dict[str, Any]:
    """run.json at ``s3://bucket/key`` as a dict (PromotionError when absent or not JSON)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.ClientError as err:
        if not is_missing(err):
            raise
        raise PromotionError(f"smoke record {uri} does not exist: nothing promoted") from None
    try:
        record = json.loads(body)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise PromotionError(f"smoke record {uri} is not a JSON object: nothing promoted")
    return record


def check_smoke_record(record: Mapping[str, Any], *, digest: str, required_transport: str, uri: str) -> None:
    """Raise PromotionError unless the smoke run succeeded, on this digest, over the transport."""
    if record.get("status") != "succeeded":
        raise PromotionError(f"smoke run {uri} status is {record.get('status')!r}, not 'succeeded': "
                             f"{str(record.get('error') or '')[:200]}")
    ran = (record.get(RECORD_IMAGE_RAN) or {}).get("pods") or {}
    if not ran:
        raise PromotionError(f"smoke run {uri} has no {RECORD_IMAGE_RAN} (the image IDs its pods reported): "
                             "nothing promoted")
    other = sorted({image for image in ran.values() if not str(image).endswith("@" + digest)})
    if other:
        raise PromotionError(f"smoke run {uri} ran {', '.join(other)}, not @{digest} (asked for "
                             f"{record.get('image')!r}): nothing promoted")
    transport = (record.get("transport") or {}).get("transport", "unknown")
    if required_transport != "any" and transport != required_transport:
        raise PromotionError(f"smoke run {uri} transport is {transport!r}, required {required_transport!r} "
                             "(transport gate): nothing promoted")


def promote(event: Mapping[str, Any], *, ssm: Any, s3: Any, parameter_name: str, history: PromotionHistory,
            results: JobResults, required_transport: str) -> dict[str, str] | None:
    """Promote and report success; on any bad input or failed gate report failure (and
    promote nothing)."""
    job_id = event["CodePipeline.job"]["id"]
    try:
        _, params = parse_job(event)
        record = read_record(s3, params["smoke_record"])
        check_smoke_record(record, digest=params["digest"], required_transport=required_transport,
                           uri=params["smoke_record"])
    except PromotionError as err:
        results.failure(job_id, str(err))
        return None
    ssm.put_parameter(Name=parameter_name, Value=params["digest"], Type="String", Overwrite=True)
    item = history.record(event=PROMOTED, digest=params["digest"], execution_id=params["execution_id"],
                          smoke_record=params["smoke_record"])
    results.success(job_id)
    return item
