"""`raytrain-eks submit jobs/local.toml --local` with ``[tracking]`` set, as a user sets it: the
RayJob's driver (on the local Ray head, reading metrics.jsonl from moto's S3 as it grows) keeps
the MLflow run on a real ``mlflow server`` 3.17.2 on 127.0.0.1 (tests/tracking_venv.py), read
back through MLflow's REST API with the standard library and compared with the metrics.jsonl the
run left, step by step. The run is the session's shared local run (``local_run`` in
tests/conftest.py, tracked by ``local_run_mlflow``; tests/shared_run.py). The in-process run (the
live and outage cases): tests/training/test_tracking_real_run.py."""
from __future__ import annotations

import json
from datetime import datetime

import pytest
from tracking_venv import expected_scalars, last_by_step, rest_get, rest_post, tracking_python

from left_running import left_running
from shared_run import MLFLOW_EXPERIMENT as EXPERIMENT
from training import contract
from training.metric_sinks.mlflow import CURSOR_TAG, RUN_DIR_TAG, flatten

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local_run")]


@pytest.fixture(scope="module")
def tracked_submit(local_run, local_run_mlflow):
    """``(out dir, the finished process, server url)``; the server outlives the run for the reads."""
    tracking_python()  # skips, saying how to make it, without the tracking venv (the run went untracked)
    return (*local_run, local_run_mlflow)


def test_the_run_s_mlflow_run_holds_metrics_jsonl_step_by_step(tracked_submit):
    out, proc, url = tracked_submit
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    record = json.loads((out / contract.RECORD_NAME).read_text())
    experiment = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    runs = rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    assert len(runs) == 1
    info, data = runs[0]["info"], runs[0]["data"]
    assert info["run_name"] == record["job_config"]["checkpoint"]["run_name"] and info["status"] == "FINISHED"
    for field in ("start_time", "end_time"):
        assert int(info[field]) == int(datetime.fromisoformat(record[field]).timestamp() * 1000)
    assert {p["key"]: p["value"] for p in data["params"]} == flatten(record["job_config"])
    tags = {t["key"]: t["value"] for t in data["tags"]}
    assert tags[RUN_DIR_TAG] == record["run_dir"] and record["run_dir"].startswith("s3://")
    assert tags["raytrain.verdict"] == record["verdict"]["verdict"] == "accepted"
    assert tags["raytrain.spec_hash"] == record["spec_hash"] != ""
    rows = [json.loads(line) for line in (out / contract.METRICS_NAME).read_text().splitlines()]
    assert tags[CURSOR_TAG] == str(len(rows))
    expected = expected_scalars(rows, float32=False)
    assert {m["key"] for m in data["metrics"]} == set(expected)
    for key, points in expected.items():
        history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=info["run_id"], metric_key=key)["metrics"]
        assert len(history) == len(points) and last_by_step([[m["step"], m["value"]] for m in history]) == points, key
    root = info["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    for name in (contract.RECORD_NAME, contract.METRICS_NAME):
        assert rest_get(url, f"/api/2.0/mlflow-artifacts/artifacts/{root}/{name}") == (out / name).read_bytes()
    assert f"mlflow: run {info['run_id']} in experiment {experiment['experiment_id']} at {url}" in proc.stdout + proc.stderr


def test_nothing_is_left_running(tracked_submit):
    out, _, _ = tracked_submit
    assert left_running(out) == {}
