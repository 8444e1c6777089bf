"""The Apply step against the fake kubectl (fake_kubectl.py: KubeRay v1.7.0's Recreate hash rule
and RayCluster status): Apply must not pass on the manifest's word. It waits for KubeRay's
``ready`` state and every pod Ready on the image ID it reports; a crash-looping head or pods
that keep the old image fail it, and the cluster goes back to the manifest the last promotion
applied; an Apply that another execution's promotion superseded touches nothing. moto for SSM
and DynamoDB."""
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
import yaml

from charts.main import synth
from environment import load_environment
from fixture_paths import FIXTURE_JOBS
from infra.lambdas.image_watcher.history import APPLIED, ROLLED_BACK, PromotionHistory
from raytrain_eks.verify.lock import lock

REPO = Path(__file__).resolve().parents[3]
PROMOTED = "sha256:" + "1" * 64
CANDIDATE = "sha256:" + "2" * 64


@pytest.fixture
def workspace(tmp_path, aws):
    env_file = tmp_path / "environment.toml"
    shutil.copy(REPO / "environment.toml", env_file)
    # dist/ at the candidate digest, dist/promoted/ at the promoted one (what Synth writes)
    lock(str(env_file), digest=PROMOTED)
    synth(load_environment(env_file), tmp_path / "dist" / "promoted", jobs=FIXTURE_JOBS)
    lock(str(env_file), digest=CANDIDATE)
    env = load_environment(env_file)
    synth(env, tmp_path / "dist", jobs=FIXTURE_JOBS)
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
               # A wait that succeeds ends on its event (the fake advances one reconcile per
               # poll): its bound is generous. NEVER_READY is for the applies that cannot succeed.
               "POLL_SECONDS": "0.05", "TIMEOUT_SECONDS": "300", "EXECUTION_ID": "exec-apply"}
    history = PromotionHistory(client=ddb, table_name=table, image=f"{env.image.repository}:{env.image.tag}")
    # what Synth writes next to the manifests: the digest and the promoted digest it saw
    for dist, digest in ((tmp_path / "dist", CANDIDATE), (tmp_path / "dist" / "promoted", PROMOTED)):
        (dist / "pipeline-run.json").write_text(json.dumps({"digest": digest, "promoted_at_synth": PROMOTED}))
    return tmp_path, kube, environ, history, ssm, parameter


NEVER_READY = {"TIMEOUT_SECONDS": "6", "ROLLBACK_TIMEOUT_SECONDS": "300"}
"""An apply that never gets ready fails at its timeout, so that one is short: long enough for the
few polls (one reconcile each) that bring the fake to its steady state even on a loaded machine.
Its rollback succeeds, and ends on its event."""


def apply_step(workdir, environ, digest, execution="exec-apply", **env):
    return subprocess.run([sys.executable, "-m", "raytrain_eks.pipeline", "apply", "--digest", digest],
                          cwd=workdir, env={**environ, "EXECUTION_ID": execution, **env}, capture_output=True, text=True)


def applied(kube: Path) -> list[dict]:
    path = kube / "applied.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def applied_images(kube: Path) -> list[str]:
    return [row["image"].rsplit("@", 1)[1] for row in applied(kube)]


def promoted_cluster(tmp_path, kube, environ, history):
    """The long-lived cluster as the promotion of PROMOTED left it (its own Apply + promote)."""
    (kube / "scenario.json").write_text(json.dumps({}))
    workdir = tmp_path / "promoted-only"
    shutil.copytree(tmp_path / "dist" / "promoted", workdir / "dist")
    shutil.copy(tmp_path / "environment.toml", workdir / "environment.toml")
    done = apply_step(workdir, environ, PROMOTED, execution="exec-promoted")
    assert done.returncode == 0, done.stderr
    history.promote(expected="", digest=PROMOTED, execution_id="exec-promoted", smoke_record="s3://b/run.json")


def test_apply_waits_for_every_pod_ready_and_rolls_back_a_crash_looping_head(workspace):
    tmp_path, kube, environ, history, _, _ = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    # when the candidate's pods come up on the new image but the head never becomes Ready
    (kube / "scenario.json").write_text(json.dumps({"crashloop_image": CANDIDATE}))
    done = apply_step(tmp_path, environ, CANDIDATE, **NEVER_READY)
    # then Apply fails on readiness, not on the image ID alone, and the promoted manifest is back
    assert done.returncode == 1
    assert f"not ready on @{CANDIDATE}" in done.stderr and "pods not Ready: raytrain-head-x1" in done.stderr
    assert applied_images(kube) == [PROMOTED, CANDIDATE, PROMOTED]
    assert [row["recreated"] for row in applied(kube)] == [True, True, True]
    [event] = [e for e in history.events() if e["event"] == ROLLED_BACK]
    assert event["digest"] == CANDIDATE and event["rolled_back_to"] == PROMOTED
    assert event["reason"].startswith("apply: RayCluster")
    assert event["outcome"].startswith("long-lived cluster re-applied: the manifest execution exec-promoted applied")


def test_apply_fails_while_pods_keep_the_old_image(workspace):
    """KubeRay recreates pods only with upgradeStrategy Recreate (raycluster_controller.go
    shouldRecreatePodsForUpgrade): without it the running pods keep reporting the old image."""
    tmp_path, kube, environ, history, _, _ = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    manifest = tmp_path / "dist" / "raycluster.k8s.yaml"
    cluster = yaml.safe_load(manifest.read_text())
    del cluster["spec"]["upgradeStrategy"]
    manifest.write_text(yaml.safe_dump(cluster))
    done = apply_step(tmp_path, environ, CANDIDATE, **NEVER_READY)
    assert done.returncode == 1 and f"pods report {REPO_NAME(tmp_path)}@{PROMOTED}" in done.stderr
    # the rollback re-applies the promoted manifest; its spec hash is the one the (never
    # recreated) pods carry, so KubeRay leaves them running
    assert applied_images(kube) == [PROMOTED, CANDIDATE, PROMOTED]
    assert [row["recreated"] for row in applied(kube)] == [True, False, False]


def REPO_NAME(tmp_path) -> str:  # noqa: N802 - the image repository of the workspace's spec
    return load_environment(tmp_path / "environment.toml").image.repository


def test_apply_passes_once_the_cluster_is_ready_on_the_new_image(workspace):
    tmp_path, kube, environ, history, _, _ = workspace
    (kube / "scenario.json").write_text(json.dumps({}))
    done = apply_step(tmp_path, environ, CANDIDATE)
    assert done.returncode == 0, done.stderr
    assert f"pods Ready on @{CANDIDATE}" in done.stderr
    [event] = list(history.events())
    assert event["event"] == APPLIED and event["digest"] == CANDIDATE
    assert json.loads(event["manifest"])["metadata"]["annotations"]["raytrain.io/applied-manifest"] == \
        event["manifest_hash"]
    # every Ray cluster's network policy first: the namespace denies ingress by default
    kinds = [line.split()[0] for line in (kube / "applied-kinds.txt").read_text().splitlines()]
    assert kinds.index("RayCluster") > 0 and set(kinds[:kinds.index("RayCluster")]) == {"NetworkPolicy"}


def test_an_apply_superseded_by_another_promotion_touches_nothing(workspace):
    tmp_path, kube, environ, history, ssm, parameter = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    # another execution promoted a third digest after this run's Synth (the swap, then SSM)
    newer = "sha256:" + "3" * 64
    history.promote(expected=PROMOTED, digest=newer, execution_id="exec-other", smoke_record="s3://b/run.json")
    ssm.put_parameter(Name=parameter, Value=newer, Type="String", Overwrite=True)
    done = apply_step(tmp_path, environ, CANDIDATE)
    assert done.returncode == 1 and "superseded" in done.stderr
    assert applied_images(kube) == [PROMOTED]  # no apply issued
    [event] = [e for e in history.events() if e["event"] == ROLLED_BACK]
    assert event["outcome"].startswith("long-lived cluster untouched")


def step(workdir, environ, execution, *args):
    return subprocess.run([sys.executable, "-m", "raytrain_eks.pipeline", *args], cwd=workdir,
                          env={**environ, "EXECUTION_ID": execution}, capture_output=True, text=True)


def smoke_record(aws, digest: str, repository: str, execution: str) -> str:
    """A run.json that proves ``digest``, as the smoke step leaves it: in a versioned bucket under
    the execution's run name, its URI pinned to the version written (smoke.py, apply_promote.py)."""
    from environment.contract import RECORD_IMAGE_RAN
    from raytrain_eks.pipeline.smoke import run_name

    s3 = boto3.client("s3", **aws)
    bucket = f"records-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    key = f"runs/{run_name(execution, '1')}/run.json"
    put = s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(
        {"status": "succeeded", "run_dir": f"s3://{bucket}/{key.rsplit('/', 1)[0]}",
         RECORD_IMAGE_RAN: {"pods": {"raytrain-head-x": f"{repository}@{digest}"}}}))
    return f"s3://{bucket}/{key}?versionId={put['VersionId']}"


def test_an_overlapping_runs_failed_smoke_leaves_the_applying_run_alone(workspace, aws):
    """CodePipeline V2 QUEUED mode (https://docs.aws.amazon.com/codepipeline/latest/userguide/concepts-how-it-works.html):
    one execution per stage at a time, so run A can be between Apply and Promote while run B
    fails Smoke. B never touched the cluster: its rollback must not put the last promotion back
    over A's rollout, and A still promotes what it applied."""
    tmp_path, kube, environ, history, ssm, parameter = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    # given run A applied the candidate (synth -> smoke -> gate -> apply)
    done = apply_step(tmp_path, environ, CANDIDATE, execution="exec-A")
    assert done.returncode == 0, done.stderr
    # when run B's smoke fails: its build rolls back
    other = "sha256:" + "4" * 64
    done = step(tmp_path, environ, "exec-B", "rollback", "--digest", other, "--reason", "smoke: failed")
    assert done.returncode == 0, done.stderr
    [event] = [e for e in history.events() if e["event"] == ROLLED_BACK]
    assert event["digest"] == other and event["outcome"].startswith("long-lived cluster untouched: another execution")
    # then A promotes, and the live cluster is still on A's image: B applied nothing
    done = step(tmp_path, environ, "exec-A", "promote", "--digest", CANDIDATE,
                "--record", smoke_record(aws, CANDIDATE, REPO_NAME(tmp_path), "exec-A"))
    assert done.returncode == 0, done.stderr
    assert applied_images(kube) == [PROMOTED, CANDIDATE]
    assert ssm.get_parameter(Name=parameter)["Parameter"]["Value"] == CANDIDATE


def test_promote_refuses_when_another_apply_replaced_this_runs_manifest(workspace, aws):
    tmp_path, kube, environ, history, ssm, parameter = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    assert apply_step(tmp_path, environ, CANDIDATE, execution="exec-A").returncode == 0
    # another execution's Apply put the promoted manifest back on the cluster since
    done = apply_step(tmp_path / "promoted-only", environ, PROMOTED, execution="exec-C")
    assert done.returncode == 0, done.stderr
    done = step(tmp_path, environ, "exec-A", "promote", "--digest", CANDIDATE,
                "--record", smoke_record(aws, CANDIDATE, REPO_NAME(tmp_path), "exec-A"))
    assert done.returncode == 1 and "is not on this run's Apply" in done.stderr
    assert ssm.get_parameter(Name=parameter)["Parameter"]["Value"] == PROMOTED  # nothing promoted
    assert applied_images(kube) == [PROMOTED, CANDIDATE, PROMOTED]  # and A's rollback applied nothing


def test_apply_waits_out_a_recreates_terminating_pods_for_a_new_head(workspace):
    """KubeRay v1.7.0 (raycluster_controller.go reconcilePods) deletes every pod on a Recreate and
    creates the new head in a later reconcile: the old pods stay Running and Ready while
    Terminating (fake_kubectl.py), and ``state`` stays ``ready``. A configuration change on the
    same digest must not pass on them."""
    tmp_path, kube, environ, history, _, _ = workspace
    promoted_cluster(tmp_path, kube, environ, history)
    state = lambda: json.loads((kube / "state.json").read_text())["clusters"]  # noqa: E731
    [name] = [n for n in state() if not n.startswith("rayjob")]
    before = {p["metadata"]["uid"] for p in state()[name]["pods"]}
    manifest = tmp_path / "promoted-only" / "dist" / "raycluster.k8s.yaml"
    cluster = yaml.safe_load(manifest.read_text())
    cluster["spec"]["headGroupSpec"]["template"].setdefault("metadata", {}).setdefault("labels", {})["team"] = "b"
    manifest.write_text(yaml.safe_dump(cluster))
    done = apply_step(tmp_path / "promoted-only", environ, PROMOTED, execution="exec-config")
    assert done.returncode == 0, done.stderr
    assert applied(kube)[-1]["recreated"] is True
    # Apply returned only once every pod was a new one, none of them Terminating
    pods = state()[name]["pods"]
    assert not any(p["metadata"].get("deletionTimestamp") for p in pods)
    assert not before & {p["metadata"]["uid"] for p in pods}


def test_a_terminating_pod_is_not_ready():
    from raytrain_eks.pipeline.kube import not_ready

    cluster = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "state": "ready"}}
    head = {"metadata": {"name": "h", "uid": "u1", "labels": {"ray.io/node-type": "head"},
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "ray-head", "image": "r@" + PROMOTED, "imageID": "r@" + PROMOTED}]}}
    assert not_ready(cluster, [head], repository="r", digest=PROMOTED) == "pods Terminating: h"
    del head["metadata"]["deletionTimestamp"]
    assert not_ready(cluster, [head], repository="r", digest=PROMOTED) == ""
    assert not_ready(cluster, [head], repository="r", digest=PROMOTED, replaced_head="u1").startswith(
        "the head pod is still the one from before the apply")
