"""The run storage's one description (training/storage/__init__.py): the kind follows from the URI, and
the job config, the launcher and the checkpoint code all read it from there."""
from __future__ import annotations

import os

import pytest
from fixtures_runs_s3 import _moto_server, moto_s3  # noqa: F401  (fixtures)
from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)

from training import launch
from training.checkpointing.markers import run_uri
from training.config import JobConfigError, job_config_from_dict
from training.storage import RunStorage


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


# --- the storage room: one file-system factory, one retry policy, the same reads on every kind ---

def test_every_kind_of_storage_is_read_and_written_through_the_one_factory(tmp_path, moto_s3):
    """The same write, read, listing and download on a plain path, a ``file://`` mount and S3
    (moto's server, the real S3 protocol); the factory names the path on each kind's file system."""
    from training.storage import files

    for base in (str(tmp_path / "plain"), f"file://{tmp_path / 'shared'}", "s3://runs-111122223333/room"):
        run = RunStorage(base).run("r1")
        files.write_json(f"{run}/run.json", {"status": "running"})
        files.write_bytes(f"{run}/logs/a/b.log", b"line\n")
        assert files.read_json(f"{run}/run.json") == {"status": "running"}
        assert [f.uri.rsplit("/", 1)[-1] for f in files.list_files(run)] == ["b.log", "run.json"]
        assert (files.download(f"{run}/logs", tmp_path / "dl" / RunStorage(base).kind) / "a" / "b.log").read_bytes() \
            == b"line\n"
        filesystem, path = files.filesystem_for(run)
        assert path == RunStorage(base).path + "/r1"
        assert files.is_local(filesystem) == (RunStorage(base).kind != "s3")
        assert files.read_retrying(f"{run}/absent.json") is None  # absent: None, never an error
    with pytest.raises(ValueError, match="gs://b/k: not s3://bucket/key, file:///<path> nor a path"):
        files.filesystem_for("gs://b/k")


def test_the_retry_policy_is_read_in_one_place(monkeypatch, tmp_path):
    """pyarrow's S3 client is built with the policy's attempts; a read that must not take an
    error for an absent file is retried READ_TRIES times, then raises (the lease's read)."""
    from pyarrow import fs

    from training.storage import files

    monkeypatch.setenv("AWS_REGION", "us-east-1")
    built = []
    monkeypatch.setattr(fs, "S3FileSystem", lambda **kwargs: built.append(kwargs) or fs.LocalFileSystem())
    files.filesystem_for("s3://bucket/key")
    assert built[0]["retry_strategy"].max_attempts == files.S3_ATTEMPTS
    monkeypatch.setattr(files, "RETRY_PAUSE_S", 0.0)
    target = tmp_path / "x.json"
    target.write_text("{}")
    calls = []
    real = files.filesystem_for

    class Failing:
        """A file system whose reads fail as pyarrow's S3 client's do once its retries are spent."""
        def open_input_file(self, path):
            calls.append(path)
            raise OSError("AWS Error NETWORK_CONNECTION")

    monkeypatch.setattr(files, "filesystem_for", lambda uri: (Failing(), real(uri)[1]))
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        files.read_retrying(str(target))
    assert len(calls) == files.READ_TRIES


def test_no_module_outside_the_storage_room_builds_a_file_system_or_an_s3_client():
    """One factory: every pyarrow file system and S3 client of the job is built in
    training/storage/files.py; elsewhere a module asks it, or uses the one Ray Train's
    StorageContext holds (which the launcher built there)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    builders = {"S3FileSystem", "LocalFileSystem", "from_uri", "client", "resource"}
    found = []
    for path in sorted((root / "training").rglob("*.py")):
        if path.parent.name == "storage" and path.parent.parent.name == "training":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in builders:
                owner = ast.unparse(node.func.value)
                if owner in ("fs", "pafs", "pyarrow.fs", "fs.FileSystem", "pafs.FileSystem", "boto3"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    assert found == []


def test_a_stored_file_is_read_in_as_few_gets_as_its_size_needs(tmp_path, s3_server, s3_bucket):
    """Every GET to S3 is a request with its own latency and price. pyarrow 26's S3 input stream
    fetches 256 KiB per GET under ``read()`` and ``copy_files`` 1 MiB per chunk: 80 and 20 GETs
    for this 20 MiB file (and moto, the store here, reads the whole object for each). Read whole,
    downloaded as a folder, by name, or into the node's cache: one GET of it each
    (``files.READ_CHUNK_BYTES`` a GET)."""
    import uuid

    from training.storage import files

    prefix = f"{s3_bucket}/reads-{uuid.uuid4().hex[:8]}"
    data = os.urandom(20 * 2**20)
    files.write_bytes(f"{prefix}/big.bin", data)
    store = s3_server.store
    key = f"/{prefix.removeprefix('s3://')}/big.bin"

    def gets(read) -> int:
        before = store.gets(key)
        read()
        return store.gets(key) - before

    assert gets(lambda: files.read_bytes(f"{prefix}/big.bin")) == 1
    assert gets(lambda: files.read_retrying(f"{prefix}/big.bin")) == 1
    assert gets(lambda: files.download(prefix, tmp_path / "folder")) == 1
    assert gets(lambda: files.download_files(prefix, ["big.bin"], tmp_path / "named")) == 1
    assert gets(lambda: files.fetch_prefix(prefix, cache_dir=tmp_path / "cache")) == 1
    for where in (tmp_path / "folder", tmp_path / "named", files.fetch_prefix(prefix, cache_dir=tmp_path / "cache")):
        assert (where / "big.bin").read_bytes() == data


def test_a_stored_file_is_fetched_as_stored_whatever_its_name_says(tmp_path, s3_server, s3_bucket):
    """pyarrow's streams guess a codec from the name (``open_input_stream``/``open_output_stream``
    ``compression='detect'``): a ``.gz`` file was gzipped again on its way in and came back
    decompressed from one reader and as stored from another (``copy_files``, ``open_input_file``).
    Written and read by any of them, the bytes are the ones given."""
    import gzip
    import uuid

    from training.storage import files

    prefix = f"{s3_bucket}/gz-{uuid.uuid4().hex[:8]}"
    stored = gzip.compress(b'{"a": 1}\n')
    files.write_bytes(f"{prefix}/rows.jsonl.gz", stored)
    assert files.read_bytes(f"{prefix}/rows.jsonl.gz") == stored
    assert (files.download_files(prefix, ["rows.jsonl.gz"], tmp_path / "named") / "rows.jsonl.gz").read_bytes() == stored
    assert (files.fetch_prefix(prefix, cache_dir=tmp_path / "cache") / "rows.jsonl.gz").read_bytes() == stored
    assert (files.download(prefix, tmp_path / "folder") / "rows.jsonl.gz").read_bytes() == stored
