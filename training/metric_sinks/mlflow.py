"""MLflow: when the run's record is final, the driver logs the run to the tracking server named
by ``MLFLOW_TRACKING_URI`` (MLflow's own variable; ``http(s)://...`` or a SageMaker MLflow ARN),
in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default: the job's name), through the REST API
(training/mlflow_rest.py: no client in the image):

- parameters: the job config, flattened (``train.max_steps``);
- metrics: every figure of metrics.jsonl by step, under the TensorBoard sink's names (``train/loss``);
- tags: image and digest, commit, spec hash, status and verdict, the run directory;
- artifacts: run.json, metrics.jsonl and the report when the run directory holds one.

No worker sink: the figures come from metrics.jsonl in storage, so the same code logs a finished
run after the fact (``raytrain-eks runs show RUN --to-mlflow URI``).
"""
from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

from training import contract, verdict
from training.checkpointing.storage import filesystem_for
from training.metric_sinks._figures import row_step, row_time, scalars
from training.mlflow_rest import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH, Tracking

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ARTIFACTS = (contract.RECORD_NAME, contract.METRICS_NAME, "report/report.md")
"""What is uploaded of the run directory, where present."""
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
"""run.json's status → MLflow's RunStatus (a run still ``running`` is logged as it stands)."""
TAG_PREFIX = "raytrain."


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"max_steps": 10}}`` → ``{"train.max_steps": "10"}``; lists as JSON."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:MAX_PARAM_VAL_LENGTH]
    return flat


def run_tags(record: dict[str, Any]) -> dict[str, str]:
    """The record's identity and outcome as tags (``mlflow.source.git.commit`` is MLflow's own)."""
    judged = record.get("verdict") or {}
    commit = (record.get("source") or {}).get("git_commit")
    tags = {f"{TAG_PREFIX}image": record.get("image") or "", f"{TAG_PREFIX}image_digest": record.get("image_digest") or "",
            f"{TAG_PREFIX}spec_hash": record.get("spec_hash") or "", f"{TAG_PREFIX}status": record.get("status") or "",
            f"{TAG_PREFIX}verdict": judged.get("verdict", ""), f"{TAG_PREFIX}verdict_line": verdict.headline(judged),
            f"{TAG_PREFIX}run_dir": record.get("run_dir") or ""}
    if isinstance(commit, str) and commit:
        tags["mlflow.source.git.commit"] = commit
    return {key: str(value)[:MAX_TAG_VAL_LENGTH] for key, value in tags.items()}


def metric_entries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``log-batch`` metrics: every number of every row at its step and time (ms)."""
    return [{"key": key, "value": value, "step": row_step(row), "timestamp": int(row_time(row) * 1000)}
            for row in rows for key, value in scalars(row)]


def _epoch_ms(stamp: Any) -> int | None:
    """run.json's ISO time (``start_time``, ``end_time``) in ms since the epoch; None when absent."""
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def _read(uri: str) -> bytes | None:
    filesystem, path = filesystem_for(uri)
    try:
        with filesystem.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        return None


def metric_rows(text: bytes | None) -> list[dict[str, Any]]:
    """metrics.jsonl's rows; a line that is not JSON is skipped (as the report does)."""
    rows = []
    for line in (text or b"").decode("utf-8", "replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def export_run(uri: str, run_dir: str, *, experiment: str = "", record: dict[str, Any] | None = None) -> dict[str, str]:
    """Log the run in ``run_dir`` (local path or ``s3://``) to the tracking server ``uri``;
    returns ``{"run_id", "experiment_id", "artifact_uri"}``."""
    base = run_dir.rstrip("/")
    if record is None:
        text = _read(f"{base}/{contract.RECORD_NAME}")
        if text is None:
            raise FileNotFoundError(f"{base}/{contract.RECORD_NAME}: no run record to log")
        record = json.loads(text)
    job_config = record.get("job_config") or {}
    tracking = Tracking(uri)
    experiment_id = tracking.experiment_id(experiment or job_config.get("name") or "raytrain-eks")
    run_name = job_config.get("run_name") or base.rsplit("/", 1)[-1]
    start_ms = _epoch_ms(record.get("start_time")) or int(time.time() * 1000)
    info = tracking.create_run(experiment_id, run_name, run_tags(record), start_ms)
    run_id = info["run_id"]
    files = {name: _read(f"{base}/{name}") for name in ARTIFACTS}
    tracking.log_batch(run_id, metrics=metric_entries(metric_rows(files[contract.METRICS_NAME])),
                       params=flatten(job_config))
    for name, data in files.items():
        if data is not None:
            tracking.put_artifact(info["artifact_uri"], name, data)
    if record.get("status") in STATUS:
        tracking.finish_run(run_id, STATUS[record["status"]], _epoch_ms(record.get("end_time")))
    return {"run_id": run_id, "experiment_id": experiment_id, "artifact_uri": info["artifact_uri"]}


def after_run(job: Any, run_dir: str, record: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    """The driver's copy of the finished run, when the job's ``tracking.mlflow_uri`` or
    ``MLFLOW_TRACKING_URI`` names a server (the job's wins; its experiment likewise)."""
    env = os.environ if environ is None else environ
    tracking = getattr(job, "tracking", None)
    uri = getattr(tracking, "mlflow_uri", "") or env.get(ENV_TRACKING_URI, "")
    if not uri.startswith(("http://", "https://", "arn:")):
        return  # unset, or a store only an MLflow client writes (file:, sqlite:, databricks)
    experiment = getattr(tracking, "mlflow_experiment", "") or env.get(ENV_EXPERIMENT) or job.name
    logged = export_run(uri, run_dir, experiment=experiment, record=record)
    print(f"mlflow: run {logged['run_id']} in experiment {logged['experiment_id']} at {uri}", flush=True)
