"""A job cannot write on the operator's machine through the results copy
(raytrain_eks/runs/results.py: ``download_run``). Every Ray pod may write keys under its run, and
S3 keeps a key's bytes as given: moto's server (the session's, tests/fixtures_s3.py) stores
``..`` segments, empty segments (``//``) and backslashes literally, as real S3 does for ``//``
(an object key is any UTF-8 string, "Creating object key names", Amazon S3 User Guide). Before
the check, the ``..`` key below overwrote a file beside the results folder and the ``//`` key
wrote at an absolute path."""
from __future__ import annotations

import boto3
import pytest

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (session fixtures)
from raytrain_eks.runs.results import download_run


@pytest.mark.parametrize("relative", [
    "../victim.json", "logs/../../victim.json", "/etc/victim.json", "logs//x.log", "hf\\..\\x.json",
    "./run.json", "logs/./x.log", "", "hf/\x00.json",
])
def test_a_key_that_leaves_or_bends_the_run_folder_is_unsafe(relative):
    from raytrain_eks.runs.results import unsafe_relative

    assert unsafe_relative(relative)


@pytest.mark.parametrize("relative", ["run.json", "logs/driver.log", "hf/model.safetensors", "tensorboard/events.out.x"])
def test_a_plain_relative_key_is_safe(relative):
    from raytrain_eks.runs.results import unsafe_relative

    assert unsafe_relative(relative) == ""


def test_planted_keys_never_leave_the_run_folder(s3_bucket, tmp_path, capsys):  # noqa: F811
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    run = f"{tmp_path.name}/r1"
    victim = tmp_path / "victim.json"
    victim.write_text("the operator's file")
    absolute = tmp_path / "absolute.json"
    out = tmp_path / "results" / "r1"
    planted = {
        f"{run}/run.json": b"{}",
        f"{run}/logs/driver.log": b"ok",
        # ``..`` from the results folder up to the victim: results/r1/../../victim.json
        f"{run}/../../victim.json": b"planted",
        f"{run}/logs/../../../victim.json": b"planted",
        # ``//``: the relative name becomes an absolute path
        f"{run}/{absolute}": b"planted",
        f"{run}/logs//{absolute}": b"planted",
    }
    for key, body in planted.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    assert any("/../" in k for k in [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=run)["Contents"]])
    copied = download_run(client, f"{s3_bucket}/{run}", out)
    assert victim.read_text() == "the operator's file"
    assert not absolute.exists()
    assert sorted(copied) == ["logs/driver.log", "run.json"]
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["results/r1/logs/driver.log", "results/r1/run.json", "victim.json"]
    refusal = [line for line in capsys.readouterr().err.splitlines() if "refused" in line]
    assert len(refusal) == 1 and "4 key(s)" in refusal[0], refusal


def test_a_symlink_in_the_results_folder_is_not_followed(s3_bucket, tmp_path):  # noqa: F811
    """A results folder reused across submits (``--out``) may hold a link: a copy through it
    would write wherever the link points."""
    client = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")
    run = f"{tmp_path.name}/r2"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "results" / "r2"
    out.mkdir(parents=True)
    (out / "logs").symlink_to(elsewhere)
    client.put_object(Bucket=bucket, Key=f"{run}/logs/driver.log", Body=b"x")
    client.put_object(Bucket=bucket, Key=f"{run}/run.json", Body=b"{}")
    assert download_run(client, f"{s3_bucket}/{run}", out) == ["run.json"]
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_in_a_shared_run_folder_is_not_copied(tmp_path):
    """A run on a shared file system: a job may leave a link to any file the operator can read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("operator only")
    run = tmp_path / "runs" / "r3"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "leak.txt").symlink_to(secret)
    copied = download_run(None, f"file://{run}", tmp_path / "out")
    assert copied == ["run.json"] and not (tmp_path / "out" / "leak.txt").exists()
