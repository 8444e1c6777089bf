"""The pipeline's smoke run keeps its record in the bucket when the spec's runs are on a shared
file system (``storage.shared_path``): CodeBuild mounts no file system, and Promote re-reads the
record by its S3 version. The job's own entry-point parser reads the appended override."""
from __future__ import annotations

import shlex

import yaml
from spec_template import template_raw

from environment import environment_from_dict
from environment.contract import IMAGE_DIGEST_ANNOTATION, SMOKE_SERVICE_ACCOUNT
from raytrain_eks.pipeline import StepContext
from raytrain_eks.pipeline.smoke import smoke_job
from training.__main__ import parse_args
from training.config import load_job_config

DIGEST = "sha256:" + "ab" * 32  # a test value


def _smoke(tmp_path, **storage):
    raw = template_raw()
    raw["cluster"]["account"] = "111122223333"
    raw["storage"].update(storage)
    env = environment_from_dict(raw)
    (tmp_path / "rayjob-smoke.k8s.yaml").write_text(yaml.safe_dump({
        "metadata": {"name": "smoke", "annotations": {IMAGE_DIGEST_ANNOTATION: DIGEST}},
        "spec": {"entrypoint": shlex.join(["python", "-m", "training", "--config", "jobs/smoke.toml", "--set",
                                           f"checkpoint.storage_path={env.storage_uri}", "--workers", "8",
                                           "--workers-per-node", "4"]),
                 "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"serviceAccountName": "smoke"}}},
                                    "workerGroupSpecs": [{"template": {"spec": {"serviceAccountName": "smoke"}}}]}}}))
    ctx = StepContext(env=env, dist=tmp_path, kube=None, s3=None, ssm=None, history=None, parameter_name="",
                      execution_id="e1")
    job = smoke_job(ctx, DIGEST)
    # the smoke runs' own identity: the only pods that may write smoke-* (and the pipeline)
    cluster = job["spec"]["rayClusterSpec"]
    assert {t["template"]["spec"]["serviceAccountName"] for t in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"])} \
        == {SMOKE_SERVICE_ACCOUNT}
    args = parse_args(shlex.split(job["spec"]["entrypoint"])[3:])
    return env, load_job_config(args.config, args.overrides, args.world)


def test_the_smoke_run_writes_to_the_bucket_when_the_runs_are_on_a_shared_file_system(tmp_path, monkeypatch):
    from raytrain_eks.runs.manifest import ROOT

    monkeypatch.chdir(ROOT)
    env, job = _smoke(tmp_path, shared_path="/fsx/runs", shared_claim="fsx-runs")
    assert env.storage_uri == "file:///fsx/runs"
    assert job.checkpoint.storage_path == env.bucket_uri and job.run_name == "smoke-e1-1"


def test_without_one_the_smoke_entrypoint_gains_only_its_run_name(tmp_path, monkeypatch):
    from raytrain_eks.runs.manifest import ROOT

    monkeypatch.chdir(ROOT)
    env, job = _smoke(tmp_path)
    assert job.checkpoint.storage_path == env.storage_uri == env.bucket_uri
