"""Resuming runs no code a checkpoint names (training/checkpointing/state.py, restore.py).

Anything that could write a run's prefix could once plant bytes the resume unpickles: the
trainer state went through ``torch.load(weights_only=False)`` (a plain pickle: it calls whatever
the bytes name), and DCP's ``.metadata`` is ``pickle.load`` (torch 2.13
``torch/distributed/checkpoint/filesystem.py``, ``FileSystemReader.read_metadata``), read before
its sha256 was checked against the marker. The gadget below creates a file when unpickled.
One process, no process group (a DCP checkpoint written by one rank loads in one process)."""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import torch


class Gadget:
    """Unpickling it calls ``Path.touch`` on a path of the test's choosing."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_planted_trainer_state_runs_no_code(tmp_path):
    from training.checkpointing.state import _from_bytes

    evidence = tmp_path / "ran"
    blob = io.BytesIO()
    torch.save({"step": 1, "rng": Gadget(evidence)}, blob)
    with pytest.raises(pickle.UnpicklingError):
        _from_bytes(blob.getvalue())
    assert not evidence.exists()


def test_the_trainer_state_round_trips_through_the_restricted_loader():
    import random

    import numpy as np

    from training.checkpointing.state import TrainerState

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = TrainerState(step=7, tokens_seen=99, extra={"best": 1.5})
    blob = saved.state_dict()
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    loaded = TrainerState()
    loaded.load_state_dict(blob)
    assert (loaded.step, loaded.tokens_seen, loaded.extra) == (7, 99, {"best": 1.5})
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


def test_a_planted_dcp_metadata_is_refused_before_it_is_read(tmp_path):
    import torch.distributed.checkpoint as dcp

    from training.checkpointing.restore import restore
    from training.checkpointing.state import TrainerState, checkpoint_state
    from training.checkpointing.markers import DCP_METADATA, describe_files, write_marker

    model = torch.nn.Linear(4, 2)
    trainer = TrainerState(step=2)
    folder = tmp_path / "run" / "checkpoint_000002"
    dcp.save(checkpoint_state(model, None, trainer, 0), checkpoint_id=str(folder), no_dist=True)
    write_marker(folder, step=2, world_size=1, files=describe_files(folder))
    evidence = tmp_path / "ran"
    (folder / DCP_METADATA).write_bytes(pickle.dumps(Gadget(evidence)))  # after the marker: its hash differs
    loaded = restore(model=model, optimizer=None, trainer=TrainerState(),
                      local_root=str(tmp_path / "local"), resume_from=str(folder))
    assert loaded is None and not evidence.exists()
