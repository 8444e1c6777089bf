"""Where `make demo FAULT=1` kills a worker, for the shipped local job and for jobs where no step fits."""
from __future__ import annotations

from pathlib import Path

import pytest

from devtools.demo import DemoError, fault_step
from training.config import load_job_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_local_job_faults_after_its_last_reported_step_before_the_second_checkpoint():
    job = load_job_config(ROOT / "jobs" / "local.toml")
    step = fault_step(job)
    every, report = job.checkpoint.every_n_steps, job.train.report_every_n_steps
    assert every < step < min(2 * every, job.train.max_steps) and step % report == 0
    assert not [s for s in range(step + 1, min(2 * every, job.train.max_steps)) if s % report == 0]


@pytest.mark.parametrize("sets", [
    ["checkpoint.every_n_steps=0"],                                   # no checkpoint to resume from
    ["train.report_every_n_steps=5"],                                 # nothing reported between 5 and 10
    ["train.max_steps=6", "train.report_every_n_steps=2"],            # step 6 is the last: no step 7 to fault before
])
def test_a_job_with_no_step_to_fault_after_is_one_line_naming_the_fields(sets):
    job = load_job_config(ROOT / "jobs" / "local.toml", sets)
    with pytest.raises(DemoError) as refused:
        fault_step(job)
    message = str(refused.value)
    assert "\n" not in message and "jobs/local.toml" in message
    assert "train.report_every_n_steps" in message and "checkpoint.every_n_steps" in message
