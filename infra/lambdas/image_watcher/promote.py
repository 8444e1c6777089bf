"""The pipeline's last step: promote the digest the smoke run proved (``python -m
raytrain_eks.pipeline promote``, a CodeBuild action in the kubectl role, so that a failure
after Apply is rolled back in the same build and recorded).

It promotes only what the smoke run PROVED: it reads the run's record (run.json, written by
training/run_record.py, with ``image_ran`` added by the pipeline's smoke step from the image IDs
the pods reported) and requires ``status == "succeeded"``, EVERY pod to have run this very
digest (what ran, not what the manifest asked for), and the run's inter-node transport
(training/transport.py's aggregate, where the worst rank wins) to be the required one (``efa``
on a multi-node EFA group). Then a compare-and-swap on the digest the run's Synth saw
(:meth:`PromotionHistory.promote`: the promoted item and the history item in one transaction),
and only then the SSM parameter the watcher compares against.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from environment.contract import DIGEST_PATTERN, RECORD_IMAGE_RAN

from .history import FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, PromotionHistory, Superseded
from .watcher import read_promoted


class PromotionError(ValueError):
    """The smoke record does not prove the digest; one line (the rollback reason). The image's
    failure (``failure``), except where a subclass says otherwise."""

    failure = FAILURE_IMAGE


class RecordMissing(PromotionError):
    """The record does not exist (404: NoSuchKey, NoSuchVersion): lost, not the image's verdict."""

    failure = FAILURE_INFRASTRUCTURE


class RecordUnreadable(PromotionError):
    """The record exists but cannot be read (403, or not a JSON object): never read as missing."""

    failure = FAILURE_INFRASTRUCTURE


VERSION_QUERY = "?versionId="
"""``s3://bucket/key?versionId=V``: one exact version of an object (what the smoke step wrote)."""


def split_record_uri(uri: str) -> tuple[str, str, str]:
    """``(bucket, key, version)`` of ``s3://bucket/key[?versionId=V]`` (version "" for the latest)."""
    plain, _, version = uri.partition(VERSION_QUERY)
    bucket, _, key = plain.removeprefix("s3://").partition("/")
    return bucket, key, version


def _status(err: Exception) -> tuple[str, int | None]:
    response = getattr(err, "response", {}) or {}
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def is_missing(err: Exception) -> bool:
    """A missing key or version (404). A 403 is not: the roles that read records may list the
    runs prefix (s3:ListBucket), so S3 answers 404 for a missing key, and 403 means unreadable."""
    code, status = _status(err)
    return code in ("NoSuchKey", "NoSuchVersion", "404") or status == 404


def read_record(s3: Any, uri: str) -> dict[str, Any]:
    """run.json at ``s3://bucket/key[?versionId=V]`` as a dict: RecordMissing when absent,
    RecordUnreadable when S3 refuses it or it is not a JSON object."""
    bucket, key, version = split_record_uri(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key, **({"VersionId": version} if version else {}))["Body"].read()
    except s3.exceptions.ClientError as err:
        if is_missing(err):
            raise RecordMissing(f"smoke record {uri} does not exist: nothing promoted") from None
        code, status = _status(err)
        raise RecordUnreadable(f"smoke record {uri} cannot be read ({code or status}): nothing promoted") from None
    try:
        record = json.loads(body)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise RecordUnreadable(f"smoke record {uri} is not a JSON object: nothing promoted")
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


def promoted_digest(ssm: Any, parameter_name: str, history: PromotionHistory, *, repair: bool = False) -> str:
    """The promoted digest: the ``~promoted`` item's (what the compare-and-swap acts on), or the
    SSM parameter's while that item does not exist yet (a stack deployed before it). With
    ``repair``, an SSM parameter that disagrees with the item (its write after the transaction
    failed) is set to the item's digest."""
    pointer = history.promoted()
    if not pointer:
        return read_promoted(ssm, parameter_name)
    if repair and read_promoted(ssm, parameter_name) != pointer:
        ssm.put_parameter(Name=parameter_name, Value=pointer, Type="String", Overwrite=True)
    return pointer


def promote(*, ssm: Any, s3: Any, parameter_name: str, history: PromotionHistory, digest: str,
            smoke_record: str, execution_id: str, expected: str, required_transport: str) -> dict[str, str]:
    """Promote ``digest`` if its smoke record proves it and the promoted digest is still
    ``expected`` (what Synth saw). PromotionError or Superseded otherwise; nothing promoted."""
    if not DIGEST_PATTERN.fullmatch(digest):
        raise PromotionError(f"digest {digest!r} is not sha256:<64 hex>: nothing promoted")
    if not smoke_record.startswith("s3://"):
        raise PromotionError(f"smoke_record {smoke_record!r} is not an s3:// URI: nothing promoted")
    # The promoted item, else the parameter (a stack deployed before the item existed has only
    # SSM); first, so that even a refused run repairs an SSM write that failed after a promotion.
    current = promoted_digest(ssm, parameter_name, history, repair=True)
    check_smoke_record(read_record(s3, smoke_record), digest=digest, required_transport=required_transport,
                       uri=smoke_record)
    if current != expected:
        raise Superseded(f"the promoted digest is {current or 'none'}, not {expected or 'none'} as at Synth: "
                         f"another execution promoted meanwhile; {digest} is not promoted")
    item = history.promote(expected=expected, digest=digest, execution_id=execution_id, smoke_record=smoke_record)
    ssm.put_parameter(Name=parameter_name, Value=digest, Type="String", Overwrite=True)
    return item
