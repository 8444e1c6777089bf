"""The driver's side, fast: run.json's one merge, what the workers are handed, the collective timeout."""
from __future__ import annotations

import json

import pytest

from tiny_qwen import tiny_qwen2_config
from training import contract, launch
from training.config import job_config_from_dict
from training.run_record import RunRecord
from training.storage.files import read_json


def _job(storage: str = "", **parallel):
    return job_config_from_dict({
        "name": "launch-test", "model": {"config": tiny_qwen2_config()}, "data": {"kind": "synthetic"},
        "train": {"seq_len": 16, "micro_batch_size": 1, "global_batch_size": 2, "max_steps": 2, "warmup_steps": 1},
        "parallel": {"num_workers": 2, "workers_per_node": 2, **parallel},
        "checkpoint": {"storage_path": storage},
    }, "test")


def _facts() -> dict:
    return {"versions": {"read_on": "rank-0 worker on gpu-1", "torch": "2.13.0"}, "ranks": [{"rank": 0}, {"rank": 1}],
            "inputs": {"data": {"kind": "synthetic"}}, "nccl_logs": [], "hosts": {"0": "gpu-1", "1": "gpu-1"},
            "transport": {"transport": "single-node", "ranks": [{"rank": 0, "nccl_version": "2.29.7"}]},
            "data": {}, "throughput": {contract.TOKENS_PER_S: 100.0}, "checkpoints": [],
            "eval": {"before": {"eval_loss": 3.0}, "after": {"eval_loss": 2.0}}}


def test_the_driver_merges_what_rank_0_returned_once(tmp_path):
    # Given the driver's first record and the summary rank 0 returned with its facts, when the
    # driver finishes the record, then run.json holds the workers' fields, the driver's own
    # (command, hosts.driver), a verdict, and no facts key (it is the return value's, not the record's).
    job = _job(str(tmp_path))
    record = launch.start_record(job, ["python", "-m", "training"])
    assert read_json(record.uri)["status"] == "running"
    returned = {contract.KIND: contract.KIND_SUMMARY, "steps": 2, "stopped_by_signal": False,
                contract.WORKER_FACTS: _facts()}
    final = launch.finish_record(record, returned=returned)
    written = read_json(record.uri)
    assert written == json.loads(json.dumps(final, default=str))
    assert written["status"] == "succeeded" and written["verdict"]["verdict"] == "accepted" and written["exit_code"] == 0
    assert written["versions"]["read_on"].startswith("rank-0 worker")  # the worker's replace the driver's
    assert written["versions"]["nccl"] == "2.29.7"  # filled from the transport evidence
    assert written["hosts"] == {"driver": written["hosts"]["driver"], "0": "gpu-1", "1": "gpu-1"}
    assert written["command"] == ["python", "-m", "training"] and written["throughput"][contract.TOKENS_PER_S] == 100.0
    assert contract.WORKER_FACTS not in written and set(written) <= set(contract.RECORD_FIELDS)


@pytest.mark.parametrize("returned, error, data_errors, status, stage, code", [
    ({contract.REFUSED: "transport is single-node, require_transport = efa"}, None, None, "failed", "transport", 1),
    ({contract.EXPORT_ERROR: "AccessDenied: s3://b/hf"}, None, None, "failed", "storage", 1),
    ({"stopped_by_signal": True}, None, None, "stopped", "infrastructure", 143),
    (None, RuntimeError("ActorDiedError: worker 1 died"), None, "failed", "infrastructure", 1),
    (None, None, [{"rank": 1, "error_class": "DataError", "error": "a.jsonl, line 2: not JSON"}], "failed", "data", 2),
])
def test_each_way_a_run_ends_is_one_status_stage_and_exit_code(tmp_path, returned, error, data_errors, status,
                                                               stage, code):
    record = RunRecord(str(tmp_path), environ={})
    record.start(job_config=_job().to_dict(), is_infrastructure_check=True, cluster={"nodes": 1})
    final = launch.finish_record(record, returned=returned, error=error, data_errors=data_errors)
    assert (final["status"], final["verdict"]["stage"], final["exit_code"]) == (status, stage, code)
    if status == "failed":
        assert final["error"] and "\n" not in final["error"] and final[contract.FAILURE][contract.FAILURE_STAGE] == stage


def test_only_the_jobs_own_network_variables_reach_the_workers():
    # Ray's job supervisor hands a submitted job's driver its runtime env as JSON in
    # RAY_JOB_CONFIG_JSON_ENV_VAR (ray 2.58.0, dashboard/modules/job/job_supervisor.py
    # _get_driver_env_vars): the job's own variables. The rest of the driver's environment is
    # the head pod's (the image's NCCL_DEBUG and FI_PROVIDER, a CPU node's interface).
    head = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^docker0,lo", "FI_PROVIDER": "efa", "PATH": "/usr/bin",
            "RAYTRAIN_CODE_HASH": "sha256:abc", "AWS_REGION": "us-west-2"}
    job_env = {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp", "RAYTRAIN_CODE_HASH": "sha256:abc"}
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    submitted = {**head, RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps({"runtime_env": {"env_vars": job_env}, "metadata": {}})}
    assert launch.forwarded_env(submitted) == {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp",
                                               "RAYTRAIN_CODE_HASH": "sha256:abc", "AWS_REGION": "us-west-2"}
    # Outside a submitted job the driver's environment is the job's own.
    assert launch.forwarded_env(head) == {k: v for k, v in head.items() if k != "PATH"}


def test_a_collective_fails_after_minutes_not_rays_half_hour(tmp_path):
    # Ray's TorchConfig passes timeout_s to init_process_group (ray 2.58.0,
    # train/torch/config.py _setup_torch_process_group), default 1800 s.
    from ray.train.torch import TorchConfig

    trainer = launch.build_trainer(_job(str(tmp_path), use_gpu=False))
    assert trainer.backend_config.timeout_s < TorchConfig().timeout_s
    assert trainer.backend_config.timeout_s == launch.COLLECTIVE_TIMEOUT_S


def test_every_throughput_figure_of_the_record_has_one_definition():
    rows = [{contract.STEP: s, contract.TOKENS_PER_S: 10.0, contract.WINDOW_S: 1.0, contract.PEAK_MEMORY_GIB: 1.0}
            for s in (1, 2)]
    figures = set(contract.throughput_summary(rows)) - {contract.PEAK_MEMORY_GIB, contract.STEPS_MEASURED}
    assert figures == set(contract.FIGURES)
    assert set(contract.HASHES) == {"code_hash", "source.hash", "spec_hash", "job_config_hash", "manifest_hash"}
    assert all(key.split(".")[0] in contract.RECORD_FIELDS for key in contract.HASHES)
    # and the record says which: its own definitions section
    record = RunRecord("/nonexistent", environ={})
    record._write = lambda: None  # noqa: SLF001  (nothing to write here)
    assert record.start(job_config={}, is_infrastructure_check=True)["definitions"] == {
        "hashes": contract.HASHES, "throughput": contract.FIGURES}


def test_the_manifest_carries_a_prefix_of_the_job_config_hash_the_job_records(tmp_path):
    # One definition (contract.job_config_hash): the chart's label/environment value and the
    # record's "ran" are the same hash, the label a prefix (a label value takes no ':').
    from charts.jobs import JobPlan

    job = _job(str(tmp_path))
    plan = JobPlan(name=job.name, config_path="jobs/x.toml", config=job, overrides=(), world=None,
                   node_group="gpu")
    ran = read_json(launch.start_record(job, ["python"]).uri)["job_config_hash"]["ran"]
    assert ran == contract.job_config_hash(job.to_dict())
    assert ran.removeprefix("sha256:").startswith(plan.config_hash) and len(plan.config_hash) == contract.LABEL_HASH_CHARS


def test_the_driver_records_the_exposed_communication_it_was_handed_and_says_unknown_otherwise(tmp_path):
    """run.json ``exposed_comm``: the job does not time its collectives, so it records the step
    model's prediction ``submit`` left in ``<storage>/_inputs/<run>.json`` (label ``predicted``),
    and without one, label ``unknown`` with the reason: never a figure of its own."""
    job = _job(str(tmp_path))
    first = read_json(launch.start_record(job, ["python", "-m", "training"]).uri)["exposed_comm"]
    assert first["label"] == "unknown" and "does not time its collectives" in first["why"] and "share" not in first
    prediction = {"label": "predicted", "share": [0.12, 0.24], "seconds": [0.3, 0.9], "source": "step model"}
    inputs = tmp_path / contract.INPUTS_DIR / f"{job.run_name}.json"
    inputs.parent.mkdir()
    inputs.write_text(json.dumps({contract.STEP_PREDICTION: prediction}))
    assert read_json(launch.start_record(job, ["python", "-m", "training"]).uri)["exposed_comm"] == prediction
    assert set(contract.EXPOSED_COMM_LABELS) >= {prediction["label"], first["label"]}


def test_gpu_workers_get_expandable_segments_unless_the_job_sets_its_own_allocator():
    """torch 2.13 reads the CUDA allocator's settings once, ``PYTORCH_CUDA_ALLOC_CONF`` first,
    else ``PYTORCH_ALLOC_CONF`` (c10/cuda/CUDAAllocatorConfig.h ``instance()``): the workers get
    them from process start; a job's own setting of either wins; the head pod's does not count."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    gpu, cpu = _job(use_gpu=True), _job()
    assert launch.worker_env(gpu, {})["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert not set(launch.ALLOCATOR_ENV) & set(launch.worker_env(cpu, {}))
    own = launch.worker_env(gpu, {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"})
    assert own["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:512" and "PYTORCH_CUDA_ALLOC_CONF" not in own
    head_only = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
                 RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps({"runtime_env": {"env_vars": {}}, "metadata": {}})}
    assert launch.worker_env(gpu, head_only)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


_READ_ALLOCATOR = (
    "import json, sys\n"
    "from ray._private.utils import update_envs\n"
    "update_envs(json.loads(sys.argv[1]))\n"
    "import torch\n"
    "print(torch._C._accelerator_getAllocatorSettings())\n")


@pytest.mark.subprocess
@pytest.mark.parametrize("pod, driver, parsed", [
    ({}, {}, "expandable_segments:True"),
    # the image or pod sets its own: the runtime env's value replaces it in the worker
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, {}, "expandable_segments:True"),
    # the job's own generic setting, passed on alone: ours, read first, would hide it
    ({}, {"PYTORCH_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"},
     "expandable_segments:True,max_split_size_mb:512"),
])
def test_torch_in_a_gpu_worker_parses_the_allocator_settings_the_driver_hands_it(pod, driver, parsed):
    """Oracle for the path the setting takes, each step the upstream code itself:
    Ray Train 2.58 ``WorkerGroup._get_worker_runtime_env`` merges RunConfig.worker_runtime_env
    over its propagated variables (``ray/train/v2/_internal/execution/worker_group/worker_group.py``:
    1186-1205, the user's win); the worker process gets them from ``RuntimeEnvContext.exec_worker``
    (``ray/_private/runtime_env/context.py``:42-43: ``update_envs`` into ``os.environ`` before it
    execs the worker's Python), so before torch is imported; torch 2.13's generic allocator config
    (``AcceleratorAllocatorConfig::instance()`` in libc10, which owns ``expandable_segments``)
    parses the environment at its first use, ``PYTORCH_CUDA_ALLOC_CONF`` before
    ``PYTORCH_ALLOC_CONF``; ``_accelerator_getAllocatorSettings`` returns what it parsed. Here on
    the CPU build the same parser runs (the CUDA build consults it for expandable segments)."""
    import os
    import subprocess
    import sys

    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

    merged = WorkerGroup._get_worker_runtime_env({"env_vars": launch.worker_env(_job(use_gpu=True), driver)})
    env = {k: v for k, v in os.environ.items() if k not in launch.ALLOCATOR_ENV} | pod
    out = subprocess.run([sys.executable, "-c", _READ_ALLOCATOR, json.dumps(merged["env_vars"])], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == parsed


@pytest.mark.subprocess
def test_torch_accepts_the_shipped_setting_and_refuses_a_lower_case_one():
    """torch 2.13 ``ConfigTokenizer::toBool`` (c10/core/AllocatorConfig.h) takes exactly ``True``
    or ``False``: the shipped value parses, with the other settings a job may add; ``true`` is a
    ValueError at the worker's first CUDA allocation."""
    import subprocess
    import sys

    check = ("import sys, torch\n"
             "for s in sys.argv[1:]:\n"
             "    try:\n"
             "        torch._C._accelerator_setAllocatorSettings(s); print('ok')\n"
             "    except ValueError:\n"
             "        print('refused')\n")
    settings = [launch.GPU_ALLOCATOR_SETTINGS, launch.GPU_ALLOCATOR_SETTINGS + ",max_split_size_mb:512",
                launch.GPU_ALLOCATOR_SETTINGS + ",garbage_collection_threshold:0.6", "expandable_segments:true"]
    out = subprocess.run([sys.executable, "-c", check, *settings], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["ok", "ok", "ok", "refused"]
