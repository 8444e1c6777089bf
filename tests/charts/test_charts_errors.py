"""Job configs the cluster cannot run fail synth with ONE line; the entrypoint is shell-safe."""
from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from charts_testspec import ROOT, SPEC_TOML, large_env, make_env
from fixture_paths import FIXTURE_JOBS

from charts import ChartError
from charts.jobs import JobPlan, _toml_value, plan_jobs
from training.config import load_job_config
from training.config_sections import WorldSize

GPU_JOB = """
name = "{name}"
[model]
config = {{ hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2 }}
[data]
kind = "synthetic"
[train]
seq_len = 64
global_batch_size = {batch}
max_steps = 10
warmup_steps = 1
[parallel]
use_gpu = {use_gpu}
strategy = "{strategy}"
{extra}
"""


def job_root(tmp_path: Path, **jobs: str) -> Path:
    """A tree like the repository's: the real training/ and a jobs/ with the given files."""
    (tmp_path / "training").symlink_to(ROOT / "training", target_is_directory=True)
    (tmp_path / "jobs").mkdir()
    for stem, text in jobs.items():
        (tmp_path / "jobs" / f"{stem}.toml").write_text(text)
    return tmp_path


def gpu_job(name="bad", batch=64, use_gpu="true", strategy="full_shard", extra=""):
    return GPU_JOB.format(name=name, batch=batch, use_gpu=use_gpu, strategy=strategy, extra=extra)


def plan_error(root: Path, env=None) -> str:
    with contextlib.chdir(root), pytest.raises(ChartError) as caught:
        plan_jobs(env or make_env(), root / "jobs", root)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("job, expected", [
    (gpu_job(extra="num_workers = 16"),
     "jobs/bad.toml: parallel.num_workers: 16 asks for more GPUs than the cluster has: the spec's GPU group "
     "'gpu' has 8 = 2 nodes x 4 GPUs (g6.12xlarge, test-environment.toml)"),
    (gpu_job(strategy="zero3"),
     "jobs/bad.toml: parallel.strategy: 'zero3' is not allowed (allowed: full_shard, hybrid_shard, no_shard)"),
    (gpu_job(batch=48, extra="num_workers = 6"), "jobs/bad.toml: parallel.num_workers: 6 must be a multiple of the GPUs per node"),
    (gpu_job(use_gpu="false", extra="num_workers = 64\nworkers_per_node = 64"),
     "jobs/bad.toml: parallel.num_workers: 64 x cpus_per_worker 1.0 = 64 CPUs do not fit one worker pod (40 CPUs on g6.12xlarge)"),
    (gpu_job(name="1st"), "jobs/bad.toml: name: '1st' is not a RayJob name"),
], ids=["more-gpus-than-the-cluster", "unknown-strategy", "not-whole-nodes", "cpu-job-too-big", "bad-name"])
def test_refused_with_one_line(tmp_path, job, expected):
    assert plan_error(job_root(tmp_path, bad=job)).startswith(expected)


def test_a_batch_the_spec_world_size_cannot_divide_names_the_overrides(tmp_path):
    # 40 sequences cannot be split over 32 workers of 4 x g6.48xlarge (fine on 8 GPUs).
    root = job_root(tmp_path, bad=gpu_job(batch=40))
    with contextlib.chdir(root):
        plan_jobs(make_env(), root / "jobs", root)
    message = plan_error(root, large_env())
    assert message.startswith("jobs/bad.toml: train.global_batch_size: 40 must be divisible by num_workers x "
                              "micro_batch_size (32 x 1 = 32)")
    assert "parallel.num_workers=32" in message


def test_two_files_with_one_job_name_are_refused(tmp_path):
    root = job_root(tmp_path, a=gpu_job(name="twin"), b=gpu_job(name="twin"))
    assert plan_error(root) == "jobs/b.toml: name: 'twin' is already used by jobs/a.toml"


def test_cli_prints_error_and_exits_2(tmp_path):
    (tmp_path / "tree").mkdir()
    root = job_root(tmp_path / "tree", bad=gpu_job(extra="num_workers = 16"))
    spec = tmp_path / "environment.toml"
    spec.write_text(SPEC_TOML)
    proc = subprocess.run([sys.executable, "-m", "charts.main", "--env", str(spec), "--root", str(root),
                           "--outdir", str(tmp_path / "dist")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: jobs/bad.toml: parallel.num_workers: 16 asks for more GPUs than the cluster has: the spec's GPU "
        f"group 'gpu' has 8 = 2 nodes x 4 GPUs (g6.12xlarge, {spec})"]
    assert not list((tmp_path / "dist").glob("*.k8s.yaml"))


def test_entrypoint_is_shell_safe_and_round_trips():
    # Whatever a value holds, the shell hands the job exactly the argv the chart meant.
    hostile = "s3://bucket/it's; rm -rf / $(reboot) `x` \"q\""
    cfg = load_job_config(FIXTURE_JOBS / "smoke.toml")
    plan = JobPlan(name="smoke", config_path="jobs/smoke.toml", config=cfg,
                   overrides=(f"checkpoint.storage_path={_toml_value(hostile)}", "parallel.use_gpu=true"),
                   world=WorldSize(num_workers=8, workers_per_node=4), node_group="gpu")
    argv = shlex.split(plan.entrypoint)
    assert argv == ["python", "-m", "training", "--config", "jobs/smoke.toml",
                    "--set", f"checkpoint.storage_path={hostile}", "--set", "parallel.use_gpu=true",
                    "--workers", "8", "--workers-per-node", "4"]


@pytest.mark.parametrize("value, expected", [
    ("s3://b/runs", "s3://b/runs"),   # a bare word stays readable
    ("true", '"true"'),               # would read back as a boolean: quoted
    ("8", '"8"'),
    (8, "8"),
    (True, "true"),
])
def test_override_values_read_back_unchanged(tmp_path, value, expected):
    assert _toml_value(value) == expected
    from training.config import _set_dotted

    raw: dict = {}
    _set_dotted(raw, "a.b", expected, "test")
    assert raw == {"a": {"b": value}}


def test_a_gpu_job_is_validated_at_the_spec_size(tmp_path):
    """hybrid_shard needs >= 2 nodes: the file alone has no nodes, the spec's 2 x 4 GPUs do."""
    root = job_root(tmp_path, hybrid=gpu_job(name="hybrid", strategy="hybrid_shard"))
    with contextlib.chdir(root):
        [plan] = plan_jobs(make_env(), root / "jobs", root)
    assert plan.config.parallel.strategy == "hybrid_shard"
    assert (plan.config.parallel.num_workers, plan.config.parallel.workers_per_node) == (8, 4)


def test_every_entrypoint_reaches_the_job_unchanged(default_synth):
    # through KubeRay's submitter bash and ray job submit's list2cmdline + /bin/sh
    from charts_oracles.ray_job_submit import job_argv
    entrypoints = {chart: o["spec"]["entrypoint"] for chart, objs in default_synth.docs.items()
                   for o in objs if o["kind"] == "RayJob"}
    assert entrypoints
    for chart, entrypoint in entrypoints.items():
        assert job_argv(entrypoint) == shlex.split(entrypoint), chart


def test_the_oracle_sees_what_the_second_shell_breaks():
    from charts_oracles.ray_job_submit import job_argv
    hostile = shlex.join(["python", "--set", "data.path=s3://b/it's $(x)"])
    assert shlex.split(hostile)[-1] == "data.path=s3://b/it's $(x)"  # survives the first shell
    assert job_argv(hostile) is None                                  # not the second
    assert job_argv(shlex.join(["python", "--set", 'x="8"', "--set", "y=a b"])) == ["python", "--set", 'x="8"', "--set", "y=a b"]


def test_a_value_the_job_shell_would_break_is_refused(tmp_path):
    text = (FIXTURE_JOBS / "finetune-qwen2.5-1.5b.toml").read_text().replace(
        'path = "s3://{bucket}/data/chat/"', 'path = "s3://{bucket}/data/it\'s $(chat)/"')
    message = plan_error(job_root(tmp_path, bad=text))
    assert message.startswith("jobs/bad.toml: data.path: \"s3://raytrain-raytrain-111122223333-us-east-1/data/it's "
                              "$(chat)/\" cannot reach the job: ray job submit hands the entrypoint to a shell again")
