"""An uploaded code archive or input is trusted only when its bytes are the local file's
(raytrain_eks/runs/results.py: ``upload_if_missing``). The key is a content hash anyone who
submits can compute, so another submitter could plant other bytes there first; before the check
``upload_if_missing`` saw the name, skipped the upload and the run executed the planted bytes.
Against moto's server (tests/fixtures_s3.py), which keeps an object's SHA-256 checksum when the
upload sends ``ChecksumAlgorithm="SHA256"`` and returns it on ``HeadObject`` with
``ChecksumMode=ENABLED`` (moto 5.2.5 ``moto/s3/responses.py``, ``head_object``), and honours
``If-None-Match: *`` on PutObject (same file, ``put_object``: 412 PreconditionFailed)."""
from __future__ import annotations

import base64
import hashlib

import boto3
import pytest

from charts import ChartError
from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (session fixtures)
from raytrain_eks.runs.results import upload_if_missing


def test_planted_bytes_at_the_hash_key_are_refused(s3_bucket, tmp_path):  # noqa: F811
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"the submitter's code")
    key = f"{tmp_path.name}/code/{hashlib.sha256(archive.read_bytes()).hexdigest()}.zip"
    client.put_object(Bucket=bucket, Key=key, Body=b"import os; os.system('planted')")
    with pytest.raises(ChartError, match=key):
        upload_if_missing(client, archive, f"s3://{bucket}/{key}")
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"import os; os.system('planted')"


def test_planted_bytes_with_a_forged_checksum_are_refused(s3_bucket, tmp_path):  # noqa: F811
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"the submitter's code")
    key = f"{tmp_path.name}/code/x.zip"
    client.put_object(Bucket=bucket, Key=key, Body=b"planted", ChecksumAlgorithm="SHA256")
    with pytest.raises(ChartError, match=key):
        upload_if_missing(client, archive, f"s3://{bucket}/{key}")


def test_an_upload_carries_its_checksum_and_a_second_submit_trusts_it(s3_bucket, tmp_path):  # noqa: F811
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"the submitter's code")
    uri = f"s3://{bucket}/{tmp_path.name}/code/y.zip"
    assert upload_if_missing(client, archive, uri) is True
    head = client.head_object(Bucket=bucket, Key=f"{tmp_path.name}/code/y.zip", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(archive.read_bytes()).digest()).decode()
    assert upload_if_missing(client, archive, uri) is False


def test_a_write_once_key_cannot_be_overwritten_by_the_uploader(s3_bucket, tmp_path):  # noqa: F811
    """A key made between our HeadObject and our PutObject is not overwritten: the put carries
    ``If-None-Match: *`` and S3 answers 412."""
    from botocore.exceptions import ClientError

    from raytrain_eks.runs.results import put_once

    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    key = f"{tmp_path.name}/code/z.zip"
    client.put_object(Bucket=bucket, Key=key, Body=b"first")
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"second")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        put_once(client, archive, bucket, key)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"
