"""What submit copies out of a run directory (raytrain_eks/run_results.py: ``wanted``): the event
files come with the records; a folder marker is no file. pyarrow 26's S3FileSystem.create_dir
leaves an empty ``<dir>/`` object (seen in the submit --local run: ``tensorboard/`` beside the
event files, which made the copy fail with FileExistsError before this rule)."""
from __future__ import annotations

import pytest

from raytrain_eks.run_results import wanted


@pytest.mark.parametrize("relative, copied", [
    ("run.json", True), ("metrics.jsonl", True), ("hf/model.safetensors", True),
    ("tensorboard/events.out.tfevents.1764752400.host.train", True),
    ("tensorboard/", False), ("hf/", False), ("checkpoint_000005/.metadata", False),
])
def test_what_submit_copies(relative, copied):
    assert wanted(relative) is copied
