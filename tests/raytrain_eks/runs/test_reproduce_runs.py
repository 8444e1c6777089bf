"""`raytrain-eks reproduce` and `raytrain-eks runs` on a record written the way the job writes it.

The record is the job's own (RunRecord with the environment the `local` RayJob's runtimeEnvYAML
gives the job, as `make demo` submits it); no training is needed to re-create manifests.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from raytrain_eks.cli import main
from training.config import load_job_config
from training.run_record import RunRecord
from training.storage.files import read_json

ROOT = Path(__file__).resolve().parents[3]


def _demo_like_run(tmp_path: Path, name: str = "local") -> Path:
    """Synthesize as `make demo` does, then start + finish the record with the job's environment."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "charts.main", "--outdir", str(dist)], cwd=ROOT, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    manifest = next(d for d in yaml.safe_load_all((dist / "rayjob-local.k8s.yaml").read_text()) if d)
    env_vars = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]
    argv = shlex.split(manifest["spec"]["entrypoint"])
    config_path, overrides = argv[4], [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    job = load_job_config(ROOT / config_path, overrides)
    run_dir = tmp_path / "runs" / name
    record = RunRecord(str(run_dir), environ=env_vars)
    record.start(job_config=job.to_dict(), is_infrastructure_check=False, cluster={"world_size": 2},
                 command=[sys.executable, *argv[1:]])
    record.finish(status="succeeded")
    return run_dir


def test_reproduce_re_creates_the_manifest_byte_identical_and_runs_lists_it(tmp_path, capsys):
    run_dir = _demo_like_run(tmp_path)
    record = read_json(str(run_dir / "run.json"))
    assert record["manifest_hash"].startswith("sha256:") and record["manifest_name"] == "rayjob-local"
    assert "[cluster]" in record["environment_spec"]["text"] and len(record["source"]["git_commit"]) == 40

    code = main(["reproduce", str(run_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"identical    yes: byte-identical to what ran ({record['manifest_hash']})" in out
    # environment.toml ships with a tag, not a digest: identical manifests, infrastructure unverified
    expected = "infrastructure" if record["image_digest"] else "none"
    assert f"verified     {expected}" in out

    assert main(["runs", str(tmp_path / "runs")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "started", "image"]
    # no training ran, so no transport was seen: local.toml's accept.transport fails the run
    assert record["verdict"]["verdict"] == "execution-failed" and record["verdict"]["stage"] == "transport"
    assert table[1].split()[0] == "local" and " execution-failed " in table[1]
    assert record["source"]["git_commit"][:12] in table[1]
    for flags, shown in ((["--verdict", "accepted"], 0), (["--verdict", "execution-failed", "--job", "local"], 1),
                         (["--job", "smoke"], 0)):
        assert main(["runs", str(tmp_path / "runs"), *flags]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == f"{shown} of 1 run(s) under {tmp_path / 'runs'}"


def test_reproduce_names_each_difference_and_refuses_a_record_without_identity(tmp_path, capsys):
    from raytrain_eks.runs.reproduce import _differences

    run_dir = _demo_like_run(tmp_path)
    record = read_json(str(run_dir / "run.json"))
    manifest = next(d for d in yaml.safe_load_all((tmp_path / "dist" / "rayjob-local.k8s.yaml").read_text()) if d)
    assert _differences(record, manifest) == []
    changed = {**record, "image": "other/ray:latest", "job_config_hash": {"manifest": "0" * 16},
               "command": record["command"] + ["--set", "train.lr=1e-3"]}
    named = {what for what, _, _ in _differences(changed, manifest)}
    assert named == {"image", "job config hash", "entrypoint arguments"}

    plain = RunRecord(str(tmp_path / "plain"), environ={})
    plain.start(job_config={"name": "x"}, is_infrastructure_check=False, versions={})
    assert main(["reproduce", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert "source.git_commit, environment_spec.text, manifest_name, manifest_hash missing" in err


def test_runs_shows_the_digest_the_pods_reported_and_filters_on_it():
    from raytrain_eks.runs.listing import filter_rows, row

    asked, ran = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    record = {"image_digest": asked, "job_config": {"name": "smoke"}, "status": "succeeded",
              "image_ran": {"pods": {"head/ray-head": f"repo@{ran}", "worker/ray-worker": f"repo@{ran}"}}}
    listed = row("s3://b/runs/smoke-1", record)
    assert listed["image digest"] == ran and listed["run"] == "smoke-1" and listed["verdict"] == "accepted"
    assert filter_rows([listed], digest="sha256:bbbb") == [listed] and filter_rows([listed], digest=asked) == []


def test_runs_lists_the_runs_under_an_s3_prefix_and_fingerprints_read_etags(moto_s3, capsys):
    from training.run_facts import fingerprint

    prefix = "s3://runs-111122223333/listing"  # a prefix of its own: the moto server is per session
    for name, accept in (("good", {}), ("bad", {"eval_loss_after_max": 0.1})):
        record = RunRecord(f"{prefix}/{name}", environ={})
        record.start(job_config={"name": "smoke", "accept": accept}, is_infrastructure_check=True, versions={})
        record.update(eval={"before": {"eval_loss": 3.0}, "after": {"eval_loss": 2.0}})
        record.finish(status="succeeded")
    assert main(["runs", prefix, "--verdict", "rejected"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[0] == "bad" and "3.000 -> 2.000" in out[1] and out[-1] == f"1 of 2 run(s) under {prefix}"
    # an S3 input is fingerprinted by its objects' ETags (pyarrow uploads multipart: "<md5>-<parts>")
    found = fingerprint(f"{prefix}/good")
    assert [o["key"] for o in found["objects"]] == ["listing/good/run.json"] and found["objects"][0]["etag"]


def test_reproduce_of_a_pipeline_smoke_run_says_what_was_applied_beyond_the_manifest(tmp_path, capsys):
    """The pipeline's smoke step applies dist/rayjob-smoke.k8s.yaml with its run name appended
    (raytrain_eks/pipeline/smoke.py smoke_job): the manifest re-synthesizes byte-identical, and
    reproduce says the applied RayJob carried the override as well (it is in run.json's command)."""
    from types import SimpleNamespace

    from environment.contract import IMAGE_DIGEST_ANNOTATION
    from raytrain_eks.pipeline.smoke import smoke_job

    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "charts.main", "--outdir", str(dist)], cwd=ROOT, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    load = lambda name: next(d for d in yaml.safe_load_all((dist / name).read_text()) if d)  # noqa: E731
    asked = (load("rayjob-smoke.k8s.yaml")["metadata"].get("annotations") or {}).get(IMAGE_DIGEST_ANNOTATION)
    from environment import load_environment

    env = load_environment(ROOT / "environment.toml")  # the step's spec: where the smoke run's record goes
    applied = smoke_job(SimpleNamespace(manifest=load, dist=dist, execution_id="exec-1", attempt="7", env=env), asked)
    env_vars = yaml.safe_load(applied["spec"]["runtimeEnvYAML"])["env_vars"]
    argv = shlex.split(applied["spec"]["entrypoint"])
    job = load_job_config(ROOT / argv[4], [argv[i + 1] for i, a in enumerate(argv) if a == "--set"])
    run_dir = tmp_path / "runs" / "smoke-exec-1-7"
    record = RunRecord(str(run_dir), environ=env_vars)
    record.start(job_config=job.to_dict(), is_infrastructure_check=True, cluster={"world_size": 2},
                 command=[sys.executable, *argv[1:]])
    record.finish(status="succeeded")

    assert main(["reproduce", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "byte-identical to what ran" not in out
    assert ("byte-identical to the synthesized manifest" in out and
            "applied with --set checkpoint.run_name=smoke-exec-1-7 appended to its entrypoint" in out), out
