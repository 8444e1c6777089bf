"""Valid but unusual inputs pass every entry point: a minimal file (optional sections absent), a
byte-order mark, a section given as dotted keys. The bad ones are in cases.py."""
from __future__ import annotations

import subprocess
import sys

from cases import ROOT
from fixture_paths import FIXTURE_JOBS
from environment import load_environment
from training.config import load_job_config

MINIMAL_ENV = """
[cluster]
name = "tiny"
region = "eu-west-1"
availability_zones = ["eu-west-1a", "eu-west-1b"]
gpu_availability_zone = "eu-west-1b"
public_access_cidrs = ["0.0.0.0/0"]

[[gpu_node_groups]]
"""
MINIMAL_JOB = """
name = "tiny"
model.config = { hidden_size = 64, num_hidden_layers = 1, num_attention_heads = 4, vocab_size = 151936 }
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_minimal_environment_takes_every_default(tmp_path):
    path = tmp_path / "env.toml"
    path.write_text(MINIMAL_ENV)
    env = load_environment(path)
    assert env.world_size == env.primary_gpu_group.max_nodes * env.primary_gpu_group.gpus_per_node
    out = _run("-m", "raytrain_eks.cli", "summary", "--env", str(path))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_a_minimal_job_passes_its_check(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(MINIMAL_JOB)
    assert load_job_config(path).data.kind == "synthetic"
    out = _run("-m", "training", "--config", str(path), "--check")
    assert out.returncode == 0, out.stderr
    assert "ok (1 worker, full_shard, 100 steps of" in out.stdout


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    env, job = tmp_path / "env.toml", tmp_path / "job.toml"
    env.write_text(MINIMAL_ENV, encoding="utf-8-sig")
    job.write_text(MINIMAL_JOB, encoding="utf-8-sig")
    assert load_environment(env).cluster.name == "tiny"
    assert load_job_config(job).name == "tiny"


def test_a_gpu_job_check_says_how_it_is_sized():
    out = _run("-m", "training", "--config", str(FIXTURE_JOBS.relative_to(ROOT) / "smoke.toml"), "--check")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert "1 workers" not in first and "1 worker," not in first and "one per GPU of its node group" in first
