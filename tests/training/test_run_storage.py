"""The run storage's one description (training/run_storage.py): the kind follows from the URI, and
the job config, the launcher and the checkpoint code all read it from there."""
from __future__ import annotations

import os

import pytest

from training import launch
from training.checkpointing.storage import run_uri
from training.config import JobConfigError, job_config_from_dict
from training.run_storage import RunStorage


@pytest.mark.parametrize("uri, kind, shared, path, run", [
    ("s3://bucket/runs", "s3", True, "bucket/runs", "s3://bucket/runs/r1"),
    ("s3://bucket/runs/", "s3", True, "bucket/runs", "s3://bucket/runs/r1"),
    ("file:///fsx/runs", "shared", True, "/fsx/runs", "/fsx/runs/r1"),
    ("/tmp/ray_results", "local", False, "/tmp/ray_results", "/tmp/ray_results/r1"),
])
def test_the_kind_follows_from_the_uri(uri, kind, shared, path, run):
    storage = RunStorage(uri)
    assert (storage.kind, storage.shared, storage.path, storage.run("r1")) == (kind, shared, path, run)


def test_a_relative_directory_is_this_machines():
    assert RunStorage("runs").path == os.path.abspath("runs") and RunStorage("runs").kind == "local"


def _job(storage: str):
    return job_config_from_dict({
        "name": "spans-nodes", "model": {"config": {"hidden_size": 64}}, "data": {"kind": "synthetic"},
        "train": {"seq_len": 16, "global_batch_size": 8, "max_steps": 2, "warmup_steps": 1},
        "parallel": {"use_gpu": True, "num_workers": 8, "workers_per_node": 4},
        "checkpoint": {"storage_path": storage}}, "jobs/x.toml")


@pytest.mark.parametrize("storage", ["s3://bucket/runs", "file:///fsx/runs"])
def test_a_job_spanning_nodes_needs_storage_every_node_sees(storage):
    job = _job(storage)
    assert job.num_nodes == 2
    # the launcher hands Ray Train the path on the storage's own file system
    path, filesystem = launch.storage_location(job)
    assert path == RunStorage(storage).path and (filesystem is None) == (RunStorage(storage).kind != "s3")
    assert launch.run_dir(job) == run_uri(storage, "spans-nodes") == RunStorage(storage).run("spans-nodes")


def test_a_node_local_directory_is_refused_for_a_job_spanning_nodes():
    with pytest.raises(JobConfigError) as caught:
        _job("/fsx/runs")
    assert str(caught.value) == (
        "jobs/x.toml: checkpoint.storage_path: '/fsx/runs' is a local directory but the job spans 2 nodes (use "
        "s3://bucket/prefix, or file:///<path> of a file system every node mounts: every node writes its shards there)")


def test_ray_train_takes_the_launchers_shared_path_as_one_storage_every_worker_checks(tmp_path):
    """Oracle: Ray Train's own StorageContext (ray 2.58.0, ``train/v2/_internal/execution/storage.py``:
    ``get_fs_and_path`` :298 resolves a path without a custom file system to pyarrow's local one;
    ``_create_validation_file`` :424 writes a marker under ``<storage>/<run>`` and
    ``_check_validation_file`` :436 refuses, on every worker that persists a checkpoint, a storage
    where it cannot see that marker: a node-local path fails there, a shared mount passes). The
    launcher's ``(storage_path, filesystem)`` for ``file://`` is that path and no file system, and
    Ray's run folder is :meth:`RunStorage.run`."""
    from ray.train.v2._internal.execution.storage import StorageContext

    job = _job(f"file://{tmp_path / 'fsx' / 'runs'}")
    path, filesystem = launch.storage_location(job)
    context = StorageContext(storage_path=path, experiment_dir_name=job.run_name, storage_filesystem=filesystem)
    assert context.storage_filesystem.type_name == "local"
    assert context.experiment_fs_path == launch.run_dir(job) == str(tmp_path / "fsx" / "runs" / "spans-nodes")
    context._check_validation_file()  # what a worker on another node of the mount runs before each checkpoint
