"""Each verdict from a REAL run: the `local` job (the demo's) trained in one plain process with
the loop the Ray workers run, its record written by the driver's own code
(:func:`training.launch.run_in_process`: start, train, merge what rank 0 returned, finish).

- accepted: the local job's own ``[accept]`` criteria (tests/fixtures/jobs/local.toml, a copy of
  the shipped one), shortened to a few steps;
- rejected: the same run (ONE training, shared by both tests: a criterion does not change what
  trains) finished with an eval criterion no model reaches; the run itself succeeds;
- execution-failed: a corrupt data file (stage ``data``), and ``require_transport = "efa"``
  on a CPU machine (stage ``transport``, refused by the gate); both stop before the first step.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
from fixture_paths import FIXTURE_JOBS

from training.config import load_job_config
from training.run_record import RunRecord
from training.verdict import EXIT_CODES, exit_code

ROOT = Path(__file__).resolve().parents[2]
# One worker, 12 steps of 2 x 128 tokens, 2 eval batches: a few seconds of CPU, and the real
# tokenizer, vocabulary and corpus of the demo.
SHORT = ["parallel.num_workers=1", "parallel.workers_per_node=1", "train.global_batch_size=2",
         "train.max_steps=12", "eval.every_n_steps=0", "eval.max_batches=2", "checkpoint.every_n_steps=0"]


def _run(tmp_path: Path, monkeypatch, overrides: list[str]) -> tuple[dict, str | None]:
    from training.launch import run_in_process
    from training.loop import local_context

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("RAYTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    job = load_job_config(FIXTURE_JOBS / "local.toml", SHORT + overrides)
    run_dir = tmp_path / "runs" / job.run_name
    (tmp_path / "local").mkdir()
    ctx = local_context(str(tmp_path / "local"), run_dir=str(run_dir))
    try:
        final = run_in_process(job, ctx)  # never raises: the record must say what failed
    finally:
        dist.destroy_process_group()
    record = json.loads((run_dir / "run.json").read_text())
    assert record == json.loads(json.dumps(final, default=str))  # what it returned is what it wrote
    return record, record["error"]


@pytest.fixture(scope="module")
def verdict_run(tmp_path_factory):
    """The `local` job's short run with its own criteria, trained once for the module."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _run(tmp_path_factory.mktemp("local-run"), monkeypatch, [])


@pytest.mark.slow
def test_the_local_job_with_its_declared_criteria_is_accepted(verdict_run):
    record, error = verdict_run
    assert error is None and record["status"] == "succeeded"
    accept = record["job_config"]["accept"]
    assert accept["eval_loss_after_max"] and accept["improvement_min"]  # the file declares criteria
    verdict = record["verdict"]
    assert verdict["verdict"] == "accepted", verdict
    assert {c["criterion"] for c in verdict["criteria"]} >= {"eval_loss_after_max", "improvement_min", "transport"}
    assert all(c["met"] for c in verdict["criteria"])
    assert record["exit_code"] == EXIT_CODES["accepted"] == 0
    # what ran, read on the worker: GPU-only facts absent with a reason, never invented
    versions = record["versions"]
    assert versions["read_on"].startswith("rank-0 worker") and versions["torch"]
    assert "absent" in versions["gpu"] and "absent" in versions["nccl"]
    assert record["ranks"][0]["rank"] == 0 and "absent" in record["ranks"][0]["availability_zone"]
    inputs = record["inputs"]
    assert len(inputs["tokenizer"]["sha256"]) == 64 and inputs["data"]["source"]["files"] == 1
    assert inputs["data"]["train_blocks_sha256"] and inputs["model"]["init_seed"] == 0
    # a local run pins no image and no manifest: it declares no reproducibility level, and says why
    assert record["reproducibility"]["declared"] == "none"
    assert "manifest hash" in record["reproducibility"]["missing_for_infrastructure"]


@pytest.mark.slow
def test_an_unreachable_eval_criterion_rejects_a_run_that_succeeded(verdict_run, tmp_path):
    # The same run's record as the driver held it before its final write, its job config
    # carrying the unreachable criterion (as `accept.eval_loss_after_max=0.01` would have set).
    ran, _ = verdict_run
    job_config = {**ran["job_config"], "accept": {**ran["job_config"]["accept"], "eval_loss_after_max": 0.01}}
    pending = RunRecord(str(tmp_path))
    pending.data = {**ran, "job_config": job_config, "status": "running", "verdict": None, "exit_code": None}
    record = pending.finish(status="succeeded")
    assert record["error"] is None and record["eval"]["after"]["eval_loss"] > 0.01
    verdict = record["verdict"]
    assert verdict["verdict"] == "rejected" and verdict["criterion"] == "eval_loss_after_max"
    assert "required 0.01" in verdict["reason"]
    assert record["exit_code"] == exit_code(verdict) == 3


@pytest.mark.slow
def test_bad_data_is_an_execution_failure_of_the_data_stage(tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a fine line"}\n{"text": "cut off\n')
    record, error = _run(tmp_path, monkeypatch, [f"data.path={bad}"])
    assert error is not None and record["status"] == "failed"
    verdict = record["verdict"]
    assert verdict["verdict"] == "execution-failed" and verdict["stage"] == "data", verdict
    assert "bad.jsonl" in verdict["reason"] and "line 2" in verdict["reason"]
    assert record["exit_code"] == 1


@pytest.mark.slow
def test_a_transport_that_cannot_be_met_locally_is_an_execution_failure(tmp_path, monkeypatch):
    record, error = _run(tmp_path, monkeypatch, ["evidence.require_transport=efa"])
    # the gate refuses the run before its first step (ending the workers, so Ray does not retry)
    assert record["status"] == "failed" and record["throughput"] == {} and "require_transport" in error
    verdict = record["verdict"]
    assert verdict["verdict"] == "execution-failed" and verdict["stage"] == "transport", verdict
    assert "single-node" in verdict["reason"]
