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


@pytest.fixture
def small_parts(monkeypatch):
    """Multipart from 6 MiB in 5 MiB parts (S3's smallest part, which moto 5.2.5 enforces too:
    ``moto/s3/models.py`` ``S3_UPLOAD_PART_MIN_SIZE``), so a 12 MiB file goes up in 3 parts
    instead of the shipped 256 MiB / 64 MiB (a file over 5 GB would fail as a single put)."""
    from raytrain_eks.runs import results

    monkeypatch.setattr(results, "MULTIPART_FROM", 6 << 20, raising=False)  # raising: shown failing before them
    monkeypatch.setattr(results, "PART_BYTES", 5 << 20, raising=False)


def _big(tmp_path, fill: bytes = b"x"):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(fill * (12 << 20))
    return path


def test_a_large_file_goes_up_in_parts_with_their_checksums(s3_bucket, tmp_path, small_parts):  # noqa: F811
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    data = _big(tmp_path)
    key = f"{tmp_path.name}/_inputs/big/chats.jsonl"
    assert upload_if_missing(client, data, f"s3://{bucket}/{key}") is True
    stored = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    # S3's composite checksum of 3 parts: the SHA-256 of their SHA-256s, "-3"
    blocks = [data.read_bytes()[i:i + (5 << 20)] for i in range(0, 12 << 20, 5 << 20)]
    composite = hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).digest()
    assert stored["ChecksumSHA256"] == f"{base64.b64encode(composite).decode()}-3"
    assert stored["Body"].read() == data.read_bytes()
    # the second submit recognises its own multipart upload, and refuses other bytes of that size
    assert upload_if_missing(client, data, f"s3://{bucket}/{key}") is False
    with pytest.raises(ChartError, match=key):
        upload_if_missing(client, _big(tmp_path / ".." / tmp_path.name, b"y"), f"s3://{bucket}/{key}")
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads")


def test_a_large_write_once_key_made_meanwhile_is_not_overwritten(s3_bucket, tmp_path, small_parts):  # noqa: F811
    """The condition on CompleteMultipartUpload: an object that appeared after the upload began
    wins (412), and the parts are aborted. moto 5.2.5 honours it (``moto/s3/responses.py``,
    ``_key_response_post``: If-None-Match "*" with an existing key raises PreconditionFailed)."""
    from botocore.exceptions import ClientError

    from raytrain_eks.runs.results import put_once

    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    key = f"{tmp_path.name}/_inputs/big/chats.jsonl"
    real_upload_part = client.upload_part

    def plant_then_upload(**kwargs):  # another writer's put lands while our parts travel
        if kwargs["PartNumber"] == 2:
            client.put_object(Bucket=bucket, Key=key, Body=b"first")
        return real_upload_part(**kwargs)

    client.upload_part = plant_then_upload
    with pytest.raises(ClientError, match="PreconditionFailed"):
        put_once(client, _big(tmp_path), bucket, key)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads")
