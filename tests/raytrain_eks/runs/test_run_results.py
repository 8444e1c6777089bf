"""What submit copies out of a run directory (raytrain_eks/runs/results.py: ``wanted``): the event
files come with the records; a folder marker is no file. pyarrow 26's S3FileSystem.create_dir
leaves an empty ``<dir>/`` object (seen in the submit --local run: ``tensorboard/`` beside the
event files, which made the copy fail with FileExistsError before this rule)."""
from __future__ import annotations

import pytest

from raytrain_eks.runs.results import wanted


@pytest.mark.parametrize("relative, copied", [
    ("run.json", True), ("metrics.jsonl", True), ("hf/model.safetensors", True),
    ("tensorboard/events.out.tfevents.1764752400.host.train", True),
    ("tensorboard/", False), ("hf/", False), ("checkpoint_000005/.metadata", False),
])
def test_what_submit_copies(relative, copied):
    assert wanted(relative) is copied


def test_a_run_on_a_file_system_is_read_by_its_path(tmp_path):
    """A shared (``file://``) or local run storage (training/storage/__init__.py): the same readers, no S3 client."""
    from raytrain_eks.runs.results import download_run, read_file, run_exists
    from training.storage import RunStorage

    storage = RunStorage(f"file://{tmp_path / 'runs'}")
    run = storage.run("r1")
    assert not run_exists(None, run)
    for relative, body in [("run.json", "{}"), ("logs/driver.log", "hi"), ("hf/config.json", "{}"),
                           ("checkpoint_00000002/.metadata", "x")]:
        (tmp_path / "runs" / "r1" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / "r1" / relative).write_text(body)
    assert run_exists(None, run) and read_file(None, f"{run}/logs/driver.log") == b"hi"
    copied = download_run(None, run, tmp_path / "out")
    assert sorted(copied) == ["hf/config.json", "logs/driver.log", "run.json"]  # no checkpoint shard
    assert (tmp_path / "out" / "logs" / "driver.log").read_text() == "hi"
