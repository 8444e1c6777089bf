"""A job smaller than a node, down to one GPU: its world size is decided once (``charts.jobs.size_job``),
reaches the job as typed entry-point arguments (``training.config_sections.WorldSize``) and is what the
worker pod asks for. ``num_workers = 1`` is one GPU, no longer "not sized yet"."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from charts_testspec import ROOT, make_env
from tiny_qwen import tiny_qwen2_config

from charts.code_bundle import CodeBundle
from charts import ChartError
from charts.jobs import plan_job
from charts.ray_charts import rayjob_spec
from environment.contract import GPU_RESOURCE
from training.__main__ import parse_args
from training.config import load_job_config
from training.config_sections import WorldSize

CODE = CodeBundle(path=Path("training-0000000000000000.zip"), content_hash="0" * 16, files=1)
MODEL = ", ".join(f"{k} = {json.dumps(v)}" for k, v in tiny_qwen2_config().items())


def write_job(tmp_path: Path, workers: int | None, strategy: str = "full_shard") -> Path:
    job = tmp_path / "one-gpu.toml"
    size = "" if workers is None else f"num_workers = {workers}"
    job.write_text(f"""
name = "one-gpu"
[model]
config = {{ {MODEL} }}
[data]
kind = "synthetic"
[train]
seq_len = 32
micro_batch_size = 1
global_batch_size = 8
max_steps = 2
warmup_steps = 1
[eval]
max_batches = 1
[checkpoint]
export_hf = false
[parallel]
use_gpu = true
strategy = "{strategy}"
{size}
""")
    return job


def worker_group(plan, env):
    (group,) = rayjob_spec(env, plan, CODE, None)["rayClusterSpec"]["workerGroupSpecs"]
    return group


@pytest.mark.parametrize("workers, world, pods, pod_gpus", [
    (1, (1, 1), 1, "1"),       # one GPU: one pod asking for one GPU
    (2, (2, 2), 1, "2"),       # half a g6.12xlarge
    (4, (4, 4), 1, "4"),       # one whole node
    (None, (8, 4), 2, "4"),    # absent: every GPU of the group (2 x 4), as before
    (0, (8, 4), 2, "4"),
])
def test_the_world_size_is_decided_once_and_the_pod_asks_for_it(tmp_path, monkeypatch, workers, world, pods, pod_gpus):
    monkeypatch.chdir(ROOT)
    env = make_env()  # 2 x g6.12xlarge (4 L4 each)
    plan = plan_job(env, write_job(tmp_path, workers), ROOT)
    assert plan.world == WorldSize(num_workers=world[0], workers_per_node=world[1])
    assert (plan.config.parallel.num_workers, plan.config.parallel.workers_per_node) == world
    group = worker_group(plan, env)
    (container,) = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == plan.worker_replicas == pods
    # Ray learns the pod's GPUs from num-gpus; KubeRay reads them off the limit only when it is
    # absent (ray-operator/controllers/ray/common/pod.go, v1.7.0): both say the same.
    assert limits[GPU_RESOURCE] == group["rayStartParams"]["num-gpus"] == pod_gpus
    assert pods * int(pod_gpus) == world[0]
    # The size travels as data: typed arguments the job's own parser reads, not --set text ...
    argv = shlex.split(plan.entrypoint)
    assert not [a for a in argv if a.startswith(("parallel.num_workers=", "parallel.workers_per_node="))]
    args = parse_args(argv[3:])
    assert args.world == plan.world
    # ... and the job builds the very config the charts planned.
    assert load_job_config(args.config, args.overrides, args.world) == plan.config


@pytest.mark.parametrize("workers, strategy, expected", [
    (6, "full_shard", "parallel.num_workers: 6 must be a multiple of the GPUs per node, or at most one node's 4"),
    (12, "full_shard", "parallel.num_workers: 12 asks for more GPUs than the cluster has"),
    (1, "hybrid_shard", "parallel.strategy: 'hybrid_shard' needs >= 2 nodes (num_workers 1 / workers_per_node 1 = 1)"),
])
def test_a_size_the_group_cannot_hold_is_one_line(tmp_path, monkeypatch, workers, strategy, expected):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ChartError) as caught:
        plan_job(make_env(), write_job(tmp_path, workers, strategy), ROOT)
    assert "\n" not in str(caught.value) and expected in str(caught.value), caught.value


def test_the_entry_point_refuses_a_gpu_job_it_cannot_size(tmp_path):
    """Run bare, a GPU job that leaves its size to the node group is refused before Ray starts;
    with its size it passes its check at that size."""
    from training.__main__ import main

    job = write_job(tmp_path, None)
    assert main(["--config", str(job)]) == 2
    assert main(["--config", str(job), "--workers", "1", "--workers-per-node", "1", "--check"]) == 0


@pytest.mark.slow  # one Ray Train fit (1 worker) on the session's Ray cluster
def test_a_one_gpu_job_runs_through_the_entry_point_as_its_rayjob_runs_it(tmp_path, monkeypatch, ray_cluster):
    """The planned RayJob's own entrypoint, run by ``python -m training`` in the repository (the
    archive's root). No GPU here: the CPU stands in for it (``parallel.use_gpu=false``) and the
    run's storage is a local folder instead of the bucket; the size is the entrypoint's."""
    monkeypatch.chdir(ROOT)
    plan = plan_job(make_env(), write_job(tmp_path, 1), ROOT)
    argv = shlex.split(plan.entrypoint)
    stand_in = ["--set", "parallel.use_gpu=false", "--set", f"checkpoint.storage_path={tmp_path / 'runs'}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
           "RAYTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, *argv[1:], *stand_in], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    record = json.loads((tmp_path / "runs" / "one-gpu" / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert record["cluster"]["world_size"] == 1 and record["cluster"]["workers_per_node"] == 1
    command = record["command"]
    at = command.index("--workers")
    assert command[at:at + 4] == ["--workers", "1", "--workers-per-node", "1"]
