"""The verdict's rules on hand-made records (the real runs are in test_verdict_runs.py)."""
from __future__ import annotations

import pytest
from fixture_paths import FIXTURE_JOBS

from training import verdict
from training.config import JobConfigError, load_job_config


def _record(status="succeeded", accept=None, before=3.0, after=2.0, transport="efa", **extra):
    return {"status": status, "job_config": {"accept": accept or {}}, "transport": {"transport": transport},
            "eval": {"before": {"eval_loss": before}, "after": {"eval_loss": after} if after is not None else None},
            "throughput": {"tokens_per_s": 1000.0}, **extra}


@pytest.mark.parametrize("error, stage", [
    ("TrainingFailedError <- DataError: notes.jsonl, line 3: not JSON", "data"),
    ("WorkerGroupError: ... TransportError: evidence.require_transport = 'efa' but", "transport"),
    ("OSError: When reading information for key 'runs/x' in bucket 'b': AWS Error ACCESS_DENIED", "storage"),
    ("export: FileNotFoundError: no checkpoint", "storage"),
    ("ActorDiedError: The actor died unexpectedly", "infrastructure"),
    ("FloatingPointError: loss is nan at step 12", "training"),
])
def test_failure_stage_names_the_stage_behind_a_wrapper(error, stage):
    assert verdict.failure_stage(error) == stage


def test_the_three_verdicts_and_their_exit_codes():
    ok = verdict.judge(_record(accept={"eval_loss_after_max": 2.5, "improvement_min": 0.5, "tokens_per_s_min": 500}))
    assert ok["verdict"] == "accepted" and len(ok["criteria"]) == 3 and verdict.exit_code(ok) == 0
    slow = verdict.judge(_record(accept={"tokens_per_s_min": 5000}))
    assert (slow["verdict"], slow["criterion"], verdict.exit_code(slow)) == ("rejected", "tokens_per_s_min", 3)
    failed = verdict.judge(_record(status="failed", failure={"stage": "data", "error": "DataError: x"}))
    assert (failed["verdict"], failed["stage"], verdict.exit_code(failed)) == ("execution-failed", "data", 1)
    assert verdict.judge({"status": "running"}) is None and verdict.exit_code(None) == verdict.EXIT_NO_VERDICT


def test_a_missing_figure_never_meets_a_criterion_and_transport_is_execution():
    no_after = verdict.judge(_record(accept={"improvement_min": 0.1}, after=None))
    assert no_after["verdict"] == "rejected" and no_after["criteria"][0]["measured"] is None
    wrong_net = verdict.judge(_record(accept={"transport": "efa", "eval_loss_after_max": 0.1}, transport="socket"))
    assert wrong_net["verdict"] == "execution-failed" and wrong_net["stage"] == "transport"
    stopped = verdict.judge(_record(status="stopped"))
    assert stopped["verdict"] == "execution-failed" and stopped["stage"] == "infrastructure"
    assert verdict.headline(stopped).startswith("EXECUTION-FAILED (infrastructure): stopped by SIGTERM")


@pytest.mark.parametrize("override, message", [
    ("accept.improvement_min=-1", "accept.improvement_min: -1.0 must be >= 0"),
    ("accept.exact_match_min=0.5", "accept.exact_match_min: 0.5 needs eval.exact_match = true"),
    ("accept.transport=ib", "accept.transport: 'ib' is not allowed (allowed: any, efa, socket, single-node)"),
    ("accept.speed=1", "accept.speed: 'speed' is not a known field"),
])
def test_bad_criteria_are_refused_in_one_line(override, message):
    with pytest.raises(JobConfigError) as caught:
        load_job_config(FIXTURE_JOBS / "local.toml", [override])
    assert message in str(caught.value) and "jobs/local.toml" in str(caught.value)


def test_a_stopped_local_run_is_no_infrastructure_fault_and_not_called_resumable():
    """A local run's storage (moto in memory) and Ray head end with its submit: before the fix a
    deliberate ``raytrain-eks stop`` read "EXECUTION-FAILED (infrastructure) ... resumable". The
    local backend marks its runs (the variable in the Ray job's runtime env); the driver records it."""
    import json

    from raytrain_eks.backends.local import submit_command
    from training import contract

    command = submit_command("http://127.0.0.1:8265", "r1", "python -m training --config jobs/local.toml",
                             "env_vars:\n  A: b\n")
    env_vars = json.loads(command[command.index("--runtime-env-json") + 1])["env_vars"]
    assert env_vars == {"A": "b", contract.STORAGE_LIVES_FOR_ONE_SUBMIT_ENV: "1"}
    stopped = verdict.judge({**_record(status="stopped"), contract.STORAGE_LIVES_FOR_ONE_SUBMIT: True})
    line = verdict.headline(stopped)
    assert line.startswith("EXECUTION-FAILED (stopped): stopped before max_steps") and "cannot resume" in line
    assert "infrastructure" not in line and "resumable" not in line
