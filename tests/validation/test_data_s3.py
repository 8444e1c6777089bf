"""The data check on S3 (moto): objects listed, the head of each read, a bad record named by its
s3:// URI and line; a prefix holding no file of the kind is refused; a large object is checked
by its head and the summary says so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cases import LOCAL_JOB
from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (one server per session)
from training.config import load_job_config
from training.data.check import check_data
from training.data.records import DataError

ROOT = Path(__file__).resolve().parents[2]
GOOD = json.dumps({"text": "a sentence of training text that is long enough to matter"}) + "\n"


def _put(uri: str, body: bytes) -> None:
    from training.storage.files import s3_filesystem, split_s3

    bucket, key = split_s3(uri)
    with s3_filesystem().open_output_stream(f"{bucket}/{key}") as out:
        out.write(body)


def _job(path: str):
    return load_job_config(LOCAL_JOB, [f"data.path={path}"])


def test_s3_objects_are_listed_and_read(s3_bucket, tmp_path):  # noqa: F811
    prefix = f"{s3_bucket}/{tmp_path.name}/good/"
    _put(prefix + "a.jsonl", GOOD.encode() * 40)
    _put(prefix + "b.jsonl", GOOD.encode() * 40)
    result = check_data(_job(prefix))
    assert result.checked and result.files == 2 and result.documents == 80 and result.complete


def test_a_bad_record_in_s3_is_named_by_uri_and_line(s3_bucket, tmp_path):  # noqa: F811
    prefix = f"{s3_bucket}/{tmp_path.name}/bad/"
    _put(prefix + "a.jsonl", GOOD.encode() * 40)
    _put(prefix + "b.jsonl", GOOD.encode() * 3 + b'{"content": "x"}\n')
    with pytest.raises(DataError) as err:
        check_data(_job(prefix))
    assert str(err.value).endswith(f"data.path: {prefix}b.jsonl, line 4: missing field 'text' "
                                   "(expected {\"text\": \"...\"}; found: content)")


def test_a_prefix_without_files_of_the_kind_is_refused(s3_bucket, tmp_path):  # noqa: F811
    prefix = f"{s3_bucket}/{tmp_path.name}/other/"
    _put(prefix + "a.parquet", b"PAR1")
    with pytest.raises(DataError) as err:
        check_data(_job(prefix))
    assert "data.path:" in str(err.value) and "(data.kind 'jsonl' reads .jsonl" in str(err.value)


def test_a_large_object_is_checked_by_its_head(s3_bucket, tmp_path):  # noqa: F811
    prefix = f"{s3_bucket}/{tmp_path.name}/large/"
    _put(prefix + "a.jsonl", GOOD.encode() * 400)
    result = check_data(_job(prefix), head_bytes=4096)
    assert result.checked and not result.complete and "first 4 KiB of each file read" in result.summary
    assert 0 < result.documents < 400


def test_a_bucket_not_yet_deployed_is_a_note_not_a_refusal(s3_server):  # noqa: F811
    result = check_data(_job("s3://raytrain-not-deployed-yet/data/"))
    assert not result.checked and "the bucket raytrain-not-deployed-yet does not exist (yet)" in result.summary
