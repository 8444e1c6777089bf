"""`raytrain-eks runs PREFIX --to-mlflow URI` as a user runs it: the fixture runs logged after the
fact to a real ``mlflow server`` 3.17.2 on 127.0.0.1 (tests/tracking_venv.py), read back through
its REST API: one run per run directory, its metrics by step equal to its metrics.jsonl, its
run.json as an artifact. A bad URI is refused in one line before any run is read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracking_venv import expected_scalars, last_by_step, mlflow_server, rest_get, rest_post

from training import contract

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "tests" / "fixtures" / "runs"


def _cli(*argv: str, prefix: Path = RUNS) -> subprocess.CompletedProcess:
    # MLflow's own variable: a loaded machine's slow answer is not a server down
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_TIMEOUT": "600"}
    return subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "runs", str(prefix), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200, env=env)


def test_a_bad_uri_is_refused_before_any_run_is_read():
    proc = _cli("--to-mlflow", "mlflow.example.com:5000")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: runs: --to-mlflow: tracking URI 'mlflow.example.com:5000': "
                                   "is not http(s)://host[:port] nor a SageMaker MLflow ARN "
                                   "(arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>)")


@pytest.mark.slow
def test_every_listed_run_is_logged_with_its_figures_by_step(tmp_path):
    with mlflow_server(tmp_path / "mlflow") as url:
        proc = _cli("--to-mlflow", url, "--experiment", "fixtures")
        assert proc.returncode == 0, proc.stderr
        experiment = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="fixtures")["experiment"]
        runs = rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
        by_dir = {next(t["value"] for t in r["data"]["tags"] if t["key"] == "raytrain.run_dir"): r for r in runs}
        assert len(runs) == 2 and len(by_dir) == 2
        for run_dir in sorted(RUNS.iterdir()):
            record = json.loads((run_dir / contract.RECORD_NAME).read_text())
            run = by_dir[record["run_dir"]]
            assert f"mlflow: {run_dir.name} -> run {run['info']['run_id']}" in proc.stdout
            assert run["info"]["status"] == "FINISHED"
            rows = [json.loads(line) for line in (run_dir / contract.METRICS_NAME).read_text().splitlines()]
            for key, points in expected_scalars(rows, float32=False).items():
                history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=run["info"]["run_id"],
                                   metric_key=key)["metrics"]
                assert last_by_step([[m["step"], m["value"]] for m in history]) == points, key
            root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
            stored = rest_get(url, f"/api/2.0/mlflow-artifacts/artifacts/{root}/{contract.RECORD_NAME}")
            assert stored == (run_dir / contract.RECORD_NAME).read_bytes()
        # Again, from these local copies of runs that ran in S3: each goes into the MLflow run it
        # has (found by its record's run_dir, where its driver logged it from), not a new one.
        again = _cli("--to-mlflow", url, "--experiment", "fixtures")
        assert again.returncode == 0, again.stderr
        rerun = rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
        assert sorted(r["info"]["run_id"] for r in rerun) == sorted(r["info"]["run_id"] for r in runs)


def test_no_aws_credentials_for_a_sagemaker_server_is_one_line(tmp_path):
    """A SageMaker MLflow ARN signs every request (SigV4): without credentials botocore raises
    ``NoCredentialsError`` (botocore ``auth.py`` ``SigV4Auth.add_auth``), which is neither an
    OSError nor a ValueError: the CLI ended in a traceback."""
    env = {**os.environ, "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_EC2_METADATA_DISABLED": "true"}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        env.pop(name, None)
    arn = "arn:aws:sagemaker:eu-west-1:123456789012:mlflow-tracking-server/team"
    proc = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "runs", str(RUNS), "--to-mlflow", arn], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: runs: --to-mlflow {arn}: ") and line.endswith(
        ": no AWS credentials to sign the requests to the SageMaker MLflow tracking server with (SigV4)")


@pytest.mark.slow
def test_without_experiment_the_run_goes_to_the_experiment_its_job_named(tmp_path):
    """The driver logs into ``tracking.mlflow_experiment`` when the job names one
    (training/metric_sinks/mlflow.py ``tracking_target``); ``runs/search`` looks in the
    experiments it is given only, so logging the run later into the job's name instead made a
    second MLflow run of it, in another experiment."""
    import shutil

    prefix = tmp_path / "runs"
    shutil.copytree(RUNS / "efa-full", prefix / "efa-full")
    record_path = prefix / "efa-full" / contract.RECORD_NAME
    record = json.loads(record_path.read_text())
    record["job_config"]["tracking"] = {"mlflow_uri": "", "mlflow_experiment": "team-x"}
    record_path.write_text(json.dumps(record))
    with mlflow_server(tmp_path / "mlflow") as url:
        proc = _cli("--to-mlflow", url, prefix=prefix)
        assert proc.returncode == 0, proc.stderr
        names = [e["name"] for e in rest_post(url, "/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]]
        assert "team-x" in names and "efa-full" not in names
