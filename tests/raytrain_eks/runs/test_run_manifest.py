"""One run's manifests (raytrain_eks/runs/manifest.py): unique names, the user's overrides in the
entrypoint, the run's own network policy, and `reproduce` of a submitted run."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml
from fixture_paths import FIXTURE_JOBS

from charts import ChartError
from charts.jobs import MAX_RAYJOB_NAME
from environment import load_environment
from raytrain_eks.runs.manifest import ROOT, check_run_name, synth_run, unique_run_name


def test_unique_names_fit_a_rayjob_name_and_differ_by_the_second():
    assert unique_run_name("local", now=0) == "local-0101-000000"
    assert unique_run_name("local", now=1) != unique_run_name("local", now=0)
    long = unique_run_name("x" * 60, now=0, on_cluster=True)
    assert len(long + "-on-cluster") <= MAX_RAYJOB_NAME and check_run_name(long, "--name") == long


@pytest.mark.parametrize("bad", ["Local", "local_1", "1local", "local-", "x" * 48])
def test_a_bad_run_name_is_one_line(bad):
    with pytest.raises(ChartError) as err:
        check_run_name(bad, "--name")
    assert str(err.value).startswith(f"submit: --name: {bad!r} is not a run name") and "\n" not in str(err.value)


def _synth(tmp_path: Path, **kwargs):
    env = load_environment(ROOT / "environment.toml")
    return synth_run(env, ROOT / "jobs" / "local.toml", run="local-test-1", outdir=tmp_path / "m",
                     spec_text=(ROOT / "environment.toml").read_text(), **kwargs)


def test_the_rayjob_is_the_runs_with_the_users_overrides_first(tmp_path):
    written = _synth(tmp_path, overrides=["train.max_steps=12"])
    job = next(d for d in yaml.safe_load_all(written.rayjob.read_text()) if d)
    assert job["metadata"]["name"] == written.rayjob_name == "local-test-1"
    argv = shlex.split(job["spec"]["entrypoint"])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets[:2] == ["train.max_steps=12", "checkpoint.run_name=local-test-1"]
    assert any(s.startswith("checkpoint.storage_path=") for s in sets[2:])  # the environment's, after (they win)
    [policy] = [d for d in yaml.safe_load_all(written.network_policy.read_text()) if d]
    assert policy["metadata"]["name"] == "ray-rayjob-local-test-1"
    assert written.run_uri.endswith("/local-test-1") and written.code_uri.startswith("s3://")


def test_a_job_outside_jobs_is_refused(tmp_path):
    env = load_environment(ROOT / "environment.toml")
    outside = tmp_path / "mine.toml"
    outside.write_text((FIXTURE_JOBS / "local.toml").read_text())
    with pytest.raises(ChartError, match="a job file must be under"):
        synth_run(env, outside, run="r1", overrides=[], outdir=tmp_path / "m", spec_text="")


def test_reproduce_re_creates_a_submitted_runs_manifest(tmp_path, capsys):
    from raytrain_eks.cli import main
    from training.config import load_job_config
    from training.run_record import RunRecord

    written = _synth(tmp_path, overrides=["train.max_steps=12"])
    job = next(d for d in yaml.safe_load_all(written.rayjob.read_text()) if d)
    env_vars = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    argv = shlex.split(job["spec"]["entrypoint"])
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    config = load_job_config(ROOT / argv[4], overrides)
    run_dir = tmp_path / "runs" / "local-test-1"
    record = RunRecord(str(run_dir), environ=env_vars)
    record.start(job_config=config.to_dict(), is_infrastructure_check=False, cluster={"world_size": 2},
                 command=[sys.executable, *argv[1:]])
    record.finish(status="succeeded")
    assert main(["reproduce", str(run_dir)]) == 0
    assert "identical    yes: byte-identical to what ran" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["lora-qwen2.5-14b.toml", "finetune-qwen2.5-7b-offload.toml"])
def test_a_family_job_in_its_subfolder_travels_and_is_named_as_the_archive_holds_it(tmp_path, name):
    """``submit jobs/family/<job>``: the entrypoint names ``jobs/family/<job>`` and the code
    archive holds that file as it is in the tree, so the RayJob reads what was submitted."""
    import zipfile

    env = load_environment(ROOT / "environment.toml")
    written = synth_run(env, ROOT / "jobs" / "family" / name, run="family-1", overrides=[], outdir=tmp_path / "m",
                        spec_text=(ROOT / "environment.toml").read_text())
    job = next(d for d in yaml.safe_load_all(written.rayjob.read_text()) if d)
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[argv.index("--config") + 1] == f"jobs/family/{name}"
    with zipfile.ZipFile(written.code_path) as archive:
        assert archive.read(f"jobs/family/{name}") == (ROOT / "jobs" / "family" / name).read_bytes()
