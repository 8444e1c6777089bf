"""The Apply step against a fake kubectl whose pods do NOT pick up the new image (what KubeRay
does to a running cluster without ``upgradeStrategy: Recreate``, or a node that cannot pull):
Apply must not pass on the manifest's word; it times out on the image IDs the pods report, rolls
the cluster back to the promoted digest and records why. moto for SSM and DynamoDB."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from charts.main import synth
from environment import load_environment
from infra.lambdas.image_watcher.history import ROLLED_BACK, PromotionHistory
from raytrain_eks.commands.lock import lock

REPO = Path(__file__).resolve().parents[2]
PROMOTED = "sha256:" + "1" * 64
CANDIDATE = "sha256:" + "2" * 64


@pytest.fixture
def workspace(tmp_path, aws):
    env_file = tmp_path / "environment.toml"
    shutil.copy(REPO / "environment.toml", env_file)
    # dist/ at the candidate digest, dist/promoted/ at the promoted one (what Synth writes)
    lock(str(env_file), digest=PROMOTED)
    synth(load_environment(env_file), tmp_path / "dist" / "promoted")
    lock(str(env_file), digest=CANDIDATE)
    env = load_environment(env_file)
    synth(env, tmp_path / "dist")
    suffix = uuid.uuid4().hex[:8]
    ssm, ddb = boto3.client("ssm", **aws), boto3.client("dynamodb", **aws)
    parameter, table = f"/raytrain/apply-{suffix}/promoted", f"apply-{suffix}"
    ssm.put_parameter(Name=parameter, Value=PROMOTED, Type="String")
    ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "image", "KeyType": "HASH"},
                                {"AttributeName": "at", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": "image", "AttributeType": "S"},
                                           {"AttributeName": "at", "AttributeType": "S"}])
    kube = tmp_path / "kube"
    kube.mkdir()
    (kube / "kubectl").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "fake_kubectl.py"}" "$@"\n')
    (kube / "kubectl").chmod(0o755)
    environ = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{kube}:{os.environ['PATH']}",
               "FAKE_KUBE_DIR": str(kube), "AWS_ENDPOINT_URL": aws["endpoint_url"],
               "AWS_DEFAULT_REGION": aws["region_name"], "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "HISTORY_TABLE": table, "PROMOTED_DIGEST_PARAMETER": parameter,
               "POLL_SECONDS": "0.05", "TIMEOUT_SECONDS": "1", "EXECUTION_ID": "exec-apply"}
    history = PromotionHistory(client=ddb, table_name=table, image=f"{env.image.repository}:{env.image.tag}")
    return tmp_path, kube, environ, history


def apply_step(tmp_path, environ, digest):
    return subprocess.run([sys.executable, "-m", "raytrain_eks.pipeline", "apply", "--digest", digest],
                          cwd=tmp_path, env=environ, capture_output=True, text=True)


def applied_images(kube: Path) -> list[str]:
    return [json.loads(line)["image"].rsplit("@", 1)[1] for line in (kube / "applied.jsonl").read_text().splitlines()]


def test_apply_waits_for_the_reported_image_and_rolls_back_when_pods_keep_the_old_one(workspace):
    tmp_path, kube, environ, history = workspace
    # given the long-lived cluster runs the promoted digest
    (kube / "scenario.json").write_text(json.dumps({}))
    shutil.copytree(tmp_path / "dist" / "promoted", tmp_path / "promoted-only" / "dist")
    shutil.copy(tmp_path / "environment.toml", tmp_path / "promoted-only" / "environment.toml")
    done = apply_step(tmp_path / "promoted-only", environ, PROMOTED)
    assert done.returncode == 0, done.stderr
    # when the candidate is applied but the pods keep reporting the promoted image
    (kube / "scenario.json").write_text(json.dumps({"stuck_pods": True}))
    done = apply_step(tmp_path, environ, CANDIDATE)
    # then Apply fails on what the pods report, and the promoted manifest is applied again
    assert done.returncode == 1
    assert f"not all on @{CANDIDATE}" in done.stderr and f"@{PROMOTED}" in done.stderr
    assert applied_images(kube) == [PROMOTED, CANDIDATE, PROMOTED]
    [event] = [e for e in history.events() if e["event"] == ROLLED_BACK]
    assert event["digest"] == CANDIDATE and event["rolled_back_to"] == PROMOTED
    assert event["reason"].startswith("apply: RayCluster") and event["outcome"] == "cluster on the promoted digest"


def test_apply_passes_once_every_pod_reports_the_new_image(workspace):
    tmp_path, kube, environ, history = workspace
    (kube / "scenario.json").write_text(json.dumps({}))
    done = apply_step(tmp_path, environ, CANDIDATE)
    assert done.returncode == 0, done.stderr
    assert "pods of raytrain run @" + CANDIDATE in done.stderr
    assert list(history.events()) == []
    # every Ray cluster's network policy first: the namespace denies ingress by default
    kinds = [line.split()[0] for line in (kube / "applied-kinds.txt").read_text().splitlines()]
    assert kinds.index("RayCluster") > 0 and set(kinds[:kinds.index("RayCluster")]) == {"NetworkPolicy"}
