"""The job's own files travel with the run (raytrain_eks/runs/inputs.py): a local data.path,
model.path or model.tokenizer outside the code archive is uploaded once per content, and the
job is pointed at the copy; paths in the archive, S3 paths and hub ids stay as they are."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)
from raytrain_eks.runs import inputs as run_inputs


def _job(data: str = "", model: str = "", tokenizer: str = ""):
    return SimpleNamespace(data=SimpleNamespace(path=data), model=SimpleNamespace(path=model, tokenizer=tokenizer))


@pytest.fixture
def root(tmp_path):
    """A repository root: training/ travels in the archive, mydata/ does not."""
    (tmp_path / "training" / "assets" / "tok").mkdir(parents=True)
    (tmp_path / "training" / "assets" / "tok" / "tokenizer.json").write_text("{}")
    (tmp_path / "mydata").mkdir()
    (tmp_path / "mydata" / "chats.jsonl").write_text('{"text": "mine"}\n')
    model = tmp_path / "elsewhere" / "qwen"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (model / ".cache").mkdir()
    (model / ".cache" / "lock").write_text("hidden files stay behind")
    return tmp_path


def test_what_travels_and_where_it_goes(root):
    storage = "s3://bkt/runs"
    uploads = run_inputs.plan_uploads(_job("mydata/chats.jsonl", str(root / "elsewhere" / "qwen"),
                                           "training/assets/tok"), storage, root)
    assert [u.field for u in uploads] == ["data.path", "model.path"]  # the tokenizer is in the archive
    data, model = uploads
    assert data.origin == root / "mydata" / "chats.jsonl"
    assert data.uri.startswith("s3://bkt/runs/_inputs/") and data.uri.endswith("/chats.jsonl")
    assert model.uri.endswith("/qwen/") and sorted(uri.rsplit("/", 1)[1] for _, uri in model.files) == [
        "config.json", "model.safetensors"]
    assert run_inputs.overrides(uploads) == [f'data.path="{data.uri}"', f'model.path="{model.uri}"']
    # content (and the file's name) decides where it goes: the same file elsewhere goes to the same
    # place, and is not uploaded again; other bytes go elsewhere
    (root / "other").mkdir()
    (root / "other" / "chats.jsonl").write_bytes((root / "mydata" / "chats.jsonl").read_bytes())
    assert run_inputs.plan_uploads(_job(str(root / "other" / "chats.jsonl")), storage, root)[0].uri == data.uri
    (root / "mydata" / "chats.jsonl").write_text('{"text": "changed"}\n')
    assert run_inputs.plan_uploads(_job("mydata/chats.jsonl"), storage, root)[0].uri != data.uri


def test_s3_paths_hub_ids_and_missing_paths_stay(root):
    job = _job("s3://bkt/data/x/", "Qwen/Qwen2.5-1.5B-Instruct", "does/not/exist")
    assert run_inputs.plan_uploads(job, "s3://bkt/runs", root) == []


def test_upload_once_and_record_both_places(root, s3_bucket, tmp_path, capsys):  # noqa: F811
    import boto3

    storage = f"{s3_bucket}/{tmp_path.name}"
    uploads = run_inputs.plan_uploads(_job("mydata/chats.jsonl"), storage, root)
    client = boto3.client("s3")
    run_inputs.upload(client, uploads, storage, "run-a")
    run_inputs.upload(client, uploads, storage, "run-b")
    said = capsys.readouterr().out.splitlines()
    assert "(uploaded, 1 file(s)" in said[0] and "(already stored, 1 file(s)" in said[1]
    bucket, key = uploads[0].uri.removeprefix("s3://").split("/", 1)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b'{"text": "mine"}\n'
    recorded = json.loads(client.get_object(Bucket=bucket, Key=f"{tmp_path.name}/_inputs/run-b.json")["Body"].read())
    assert recorded == {"data.path": {"origin": str(root / "mydata" / "chats.jsonl"), "stored": uploads[0].uri}}
    run_inputs.write_record(uploads, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "inputs.json").read_text()) == recorded


def test_the_step_model_s_prediction_travels_in_the_run_s_inputs_record(s3_bucket, tmp_path):  # noqa: F811
    """``submit`` hands the run the preflight's prediction of its exposed communication in
    ``_inputs/<run>.json``, with or without files to upload; the driver reads it from there
    (tests/training/test_launch.py)."""
    import boto3

    from training import contract

    storage = f"{s3_bucket}/{tmp_path.name}"
    client = boto3.client("s3")
    prediction = {"label": "predicted", "share": [0.1, 0.2]}
    run_inputs.upload(client, [], storage, "run-c", prediction=prediction)
    run_inputs.upload(client, [], storage, "run-d")  # nothing to hand: no file
    bucket, key = contract.run_inputs_uri(storage, "run-c").removeprefix("s3://").split("/", 1)
    assert json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read()) == {contract.STEP_PREDICTION: prediction}
    assert client.list_objects_v2(Bucket=bucket, Prefix=key.replace("run-c", "run-d")).get("KeyCount") == 0


def test_a_run_on_a_shared_file_system_is_handed_its_record_there(tmp_path):
    """Runs on a shared file system (training/storage/__init__.py): the uploads stay in the bucket, but
    ``_inputs/<run>.json`` goes where the job's runs are, and the driver's own reader finds it."""
    from training.run_record import exposed_comm_handed

    shared = f"file://{tmp_path / 'fsx' / 'runs'}"
    prediction = {"label": "predicted", "share": [0.1, 0.2]}
    run_inputs.upload(None, [], "s3://bucket/runs", "run-e", prediction=prediction, run_storage=shared)
    assert exposed_comm_handed(shared, "run-e") == prediction
    assert (tmp_path / "fsx" / "runs" / "_inputs" / "run-e.json").is_file()


def test_a_link_out_of_the_folder_is_refused_before_anything_travels(root, tmp_path):
    """Before the check, ``/etc/passwd`` travelled through such a link (the review's finding)."""
    from charts import ChartError

    (root / "mydata" / "passwd.jsonl").symlink_to("/etc/passwd")
    with pytest.raises(ChartError, match=r"data.path: 'mydata': passwd.jsonl is a symbolic link to /etc/passwd"):
        run_inputs.plan_uploads(_job("mydata"), "s3://bkt/runs", root)


def test_a_file_no_job_reads_is_refused(root):
    from charts import ChartError

    (root / "elsewhere" / "qwen" / "id_rsa").write_text("a key that must not travel")
    with pytest.raises(ChartError, match=r"model.path: .*: id_rsa is not a file a job reads for model.path"):
        run_inputs.plan_uploads(_job(model=str(root / "elsewhere" / "qwen")), "s3://bkt/runs", root)


def test_more_than_the_limit_is_refused(root, monkeypatch):
    from charts import ChartError

    monkeypatch.setattr(run_inputs, "MAX_UPLOAD_BYTES", 32)
    with pytest.raises(ChartError, match=r"more than a submit uploads"):
        run_inputs.plan_uploads(_job(model=str(root / "elsewhere" / "qwen")), "s3://bkt/runs", root)
