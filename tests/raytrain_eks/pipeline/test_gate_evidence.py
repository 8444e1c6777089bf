"""The gate judges evidence no job can touch (raytrain_eks/pipeline/smoke.py ``pin_evidence``,
gate.py ``untouched``): against moto's server with a versioned bucket (the storage stack's), the
smoke step pins run.json's and metrics.jsonl's VersionIds when the run ends; a record or metrics
written afterwards (a forged ``transport: efa``, better tokens/s) fails the gate, and the metrics
are read at the pinned version, never the newest."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from fixtures_s3 import s3_server  # noqa: F401  (session fixture)
from infra.lambdas.image_watcher.promote import read_record
from raytrain_eks.pipeline import with_version
from raytrain_eks.pipeline.gate import GateFailed, download_run, gate
from raytrain_eks.pipeline.smoke import pin_evidence

DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def smoke(s3_server, tmp_path):  # noqa: F811
    """A finished smoke run in a versioned bucket, pinned as the Smoke step pins it."""
    s3 = boto3.client("s3")
    bucket = f"gate-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    prefix = "runs/smoke-exec-1"
    record = {"status": "succeeded", "transport": {"transport": "socket"}, "image": f"x@{DIGEST}"}
    s3.put_object(Bucket=bucket, Key=f"{prefix}/run.json", Body=json.dumps(record).encode())
    s3.put_object(Bucket=bucket, Key=f"{prefix}/metrics.jsonl", Body=b'{"step": 1, "tokens_per_s": 100.0}\n')
    ctx = SimpleNamespace(s3=s3, read_json=lambda uri: read_record(s3, uri),
                          history=SimpleNamespace(promotions=lambda: []))
    uri = f"s3://{bucket}/{prefix}/run.json"
    evidence = pin_evidence(ctx, uri)
    assert set(evidence) == {"run.json", "metrics.jsonl"}
    record.update(image_ran={"pods": {"head": f"x@{DIGEST}"}}, evidence_versions=evidence)
    version = s3.put_object(Bucket=bucket, Key=f"{prefix}/run.json", Body=json.dumps(record).encode())["VersionId"]
    return SimpleNamespace(ctx=ctx, s3=s3, bucket=bucket, prefix=prefix, uri=with_version(uri, version))


def _judge(smoke, transport="any"):
    return gate(smoke.ctx, digest=DIGEST, candidate_uri=smoke.uri, required_transport=transport)


def test_an_untouched_smoke_record_passes(smoke):
    assert [c.name for c in _judge(smoke)] == ["regression"]


def test_a_record_forged_after_the_run_fails_the_gate(smoke):
    forged = {"status": "succeeded", "transport": {"transport": "efa"}, "image_ran": {"pods": {"h": f"x@{DIGEST}"}}}
    smoke.s3.put_object(Bucket=smoke.bucket, Key=f"{smoke.prefix}/run.json", Body=json.dumps(forged).encode())
    with pytest.raises(GateFailed, match="run.json was written after the smoke run ended"):
        _judge(smoke, transport="efa")


def test_metrics_rewritten_after_the_run_fail_the_gate(smoke):
    smoke.s3.put_object(Bucket=smoke.bucket, Key=f"{smoke.prefix}/metrics.jsonl", Body=b'{"tokens_per_s": 1e9}\n')
    with pytest.raises(GateFailed, match="metrics.jsonl was written after the smoke run ended"):
        _judge(smoke)


def test_deleted_evidence_fails_the_gate(smoke):
    smoke.s3.delete_object(Bucket=smoke.bucket, Key=f"{smoke.prefix}/metrics.jsonl")  # a delete marker
    with pytest.raises(GateFailed, match="metrics.jsonl"):
        _judge(smoke)


def test_the_metrics_are_read_at_the_pinned_version(smoke, tmp_path):
    record = smoke.ctx.read_json(smoke.uri)
    smoke.s3.put_object(Bucket=smoke.bucket, Key=f"{smoke.prefix}/metrics.jsonl", Body=b'{"tokens_per_s": 1e9}\n')
    local = download_run(smoke.ctx, smoke.uri, tmp_path / "c", record)
    assert json.loads((local / "metrics.jsonl").read_text())["tokens_per_s"] == 100.0
    assert json.loads((local / "run.json").read_text())["transport"] == {"transport": "socket"}
