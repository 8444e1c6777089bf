"""Runs on a shared file system (``storage.shared_path`` + ``shared_claim``): one spec value reaches
the job's storage (``file://<path>``, training/storage/__init__.py) and every Ray pod mounts the claim
there, head included (the driver writes the run record); the pods still validate and pass Pod
Security. Without it nothing changes (the bucket)."""
from __future__ import annotations

from pathlib import Path

import pytest
from charts_oracles.kuberay_pods import effective_pods
from charts_oracles.pod_security import violations
from charts_testspec import ROOT, make_env, spec_raw
from fixture_paths import FIXTURE_JOBS

from charts.code_bundle import CodeBundle
from charts.jobs import plan_job
from charts.ray_charts import RayClusterChart, rayjob_spec
from charts.validate import crd_errors, pod_template_errors
from training.storage import RunStorage

CODE = CodeBundle(path=Path("training-0000000000000000.zip"), content_hash="0" * 16, files=1)
MOUNT = {"name": "runs", "mountPath": "/fsx/runs"}
VOLUME = {"name": "runs", "persistentVolumeClaim": {"claimName": "fsx-runs"}}


def shared_env():
    raw = spec_raw()
    raw.setdefault("storage", {}).update(shared_path="/fsx/runs", shared_claim="fsx-runs")
    return make_env(raw)


def rayjob(env, plan) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": plan.name, "namespace": "ray"},
            "spec": rayjob_spec(env, plan, CODE, None)}


def pods(obj):
    cluster = obj["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


@pytest.mark.parametrize("job", ["smoke.toml", "local.toml"])  # a GPU job over 2 nodes; a CPU job
def test_the_spec_value_is_the_jobs_storage_and_every_ray_pod_mounts_it(monkeypatch, job):
    monkeypatch.chdir(ROOT)
    env = shared_env()
    assert env.storage_uri == "file:///fsx/runs" and RunStorage(env.storage_uri).kind == "shared"
    assert env.bucket_uri.startswith("s3://")  # the uploaded inputs stay in the bucket
    plan = plan_job(env, FIXTURE_JOBS / job, ROOT)
    assert plan.config.checkpoint.storage_path == "file:///fsx/runs"  # accepted over 2 nodes: shared
    assert "checkpoint.storage_path=file:///fsx/runs" in plan.overrides
    obj = rayjob(env, plan)
    for pod in pods(obj):
        assert VOLUME in pod["volumes"]
        assert all(MOUNT in c["volumeMounts"] for c in pod["containers"])
    assert crd_errors(obj) == [] and pod_template_errors(obj, env.cluster.kubernetes_version) == []
    for pod in effective_pods(f"rayjob-{plan.name}", obj):
        assert violations(pod.pod, "baseline") == [], pod.where  # the ray namespace enforces baseline
        assert {v.split(":")[0] for v in violations(pod.pod, "restricted")} <= {"runAsNonRoot"}, pod.where  # as without it


def test_the_long_lived_cluster_mounts_it_too():
    import cdk8s

    env = shared_env()
    chart = RayClusterChart(cdk8s.App(), "raycluster", env=env)
    [obj] = [o for o in cdk8s.Testing.synth(chart) if o["kind"] == "RayCluster"]
    spec = obj["spec"]
    for template in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
        assert VOLUME in template["spec"]["volumes"]


def test_without_it_the_runs_stay_in_the_bucket(monkeypatch):
    monkeypatch.chdir(ROOT)
    env = make_env()
    assert env.storage_uri == env.bucket_uri and RunStorage(env.storage_uri).kind == "s3"
    obj = rayjob(env, plan_job(env, FIXTURE_JOBS / "smoke.toml", ROOT))
    assert not [v for pod in pods(obj) for v in pod["volumes"] if v["name"] == "runs"]
