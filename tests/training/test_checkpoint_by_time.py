"""``checkpoint.every_minutes``: a checkpoint once that many minutes passed since the last one,
beside ``every_n_steps`` (the first that comes), in one process with the real manager and DCP."""
from __future__ import annotations

import pytest
import torch

from training.checkpointing import CheckpointManager, TrainerState
from training.config import JobConfigError, load_job_config


class Stream:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_a_checkpoint_comes_by_time_between_step_checkpoints(tmp_path):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    trainer = TrainerState(data=Stream(), scheduler=scheduler)
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=str(tmp_path),
                                run_name="r", every_n_steps=10, every_minutes=5, async_save=False)
    saved = []
    for step in range(1, 13):
        trainer.step = step
        if step == 7:  # five minutes since the last save, by the manager's own clock
            manager._last_save_at -= 5 * 60
        manager.step_end(step, {"loss": 1.0}, max_steps=100)
        saved.append(manager.last_saved_step)
    # step 7 by time, step 10 by steps, and the clock restarts at each save: nothing at 11, 12
    assert sorted(set(s for s in saved if s > 0)) == [7, 10]
    assert (tmp_path / "r" / "checkpoint_00000007").is_dir() and (tmp_path / "r" / "checkpoint_00000010").is_dir()
    manager.finish(12)


@pytest.mark.parametrize("value, message", [
    ("0.5", "checkpoint.every_minutes: 0.5 must be 0 (by steps only) or >= 1"),
    ("-2", "checkpoint.every_minutes: -2.0 must be >= 0"),
])
def test_a_bad_every_minutes_is_one_line_naming_file_field_value_and_what_is_allowed(value, message):
    with pytest.raises(JobConfigError) as err:
        load_job_config("jobs/local.toml", [f"checkpoint.every_minutes={value}"])
    assert str(err.value).startswith(f"jobs/local.toml: {message}")
    assert "\n" not in str(err.value)
