"""MLflow: the driver keeps the run on the tracking server named by the job's ``[tracking]`` or
``MLFLOW_TRACKING_URI`` (MLflow's own variable; ``http(s)://...`` or a SageMaker MLflow ARN), in
the experiment ``tracking.mlflow_experiment`` / ``MLFLOW_EXPERIMENT_NAME`` (default: the job's
name), through the REST API (training/mlflow_rest.py: no client in the image). Live
(:func:`open_driver_sink`, :class:`LiveRun`):

- at the start: the run, found by its ``raytrain.run_dir`` tag (a resumed run or a restarted
  driver continues the same MLflow run) or created, with the job config flattened as parameters
  (``train.max_steps``; a resumed attempt's changed value as the tag ``raytrain.param.<key>``:
  MLflow parameters cannot change) and the record's identity as tags (image and digest, commit, spec hash);
- while it trains: every :data:`POLL_S` a driver thread reads ``metrics.jsonl`` from the run's
  storage and logs its new lines' figures by step, under the TensorBoard sink's names
  (``train/loss``), in ``log-batch`` calls within MLflow's limits;
- at the end: the rest of the metrics, status, verdict tags, and run.json, metrics.jsonl and the
  report as artifacts.

A server that does not answer is one warning line; the run goes on and the follower catches up
when it answers, at the latest at the end. The same code logs a finished run after the fact
(``raytrain-eks runs show RUN --to-mlflow URI``: :func:`export_run`).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime
from typing import Any, Callable

from training import contract, verdict
from training.storage.files import read_bytes
from training.metric_sinks import row_step, scalars
from training.mlflow_rest import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH, Tracking, wire_number

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ENV_REQUEST_TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
"""One request's wait after the fact (:func:`export_run`), MLflow's own client variable (mlflow
3.17.2 ``environment_variables.py``: 120 s by default); the live driver keeps :data:`TIMEOUT_S`."""
ARTIFACTS = (contract.RECORD_NAME, contract.METRICS_NAME, "report/report.md")
"""What is uploaded of the run directory, where present."""
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
"""run.json's status → MLflow's RunStatus (a run still ``running`` is logged as it stands)."""
TAG_PREFIX = "raytrain."
RUN_DIR_TAG = f"{TAG_PREFIX}run_dir"
"""The tag that finds the MLflow run of a run directory again (a resume, a restarted driver)."""
PARAM_TAG_PREFIX = f"{TAG_PREFIX}param."
"""``raytrain.param.<key>``: a resumed attempt's value of a parameter the MLflow run logged
with another (MLflow parameters cannot change)."""
CURSOR_TAG = f"{TAG_PREFIX}metrics_lines_logged"
"""How many complete lines of metrics.jsonl the MLflow run holds (a restarted driver goes on from there)."""
POLL_S = 10.0
"""How often the driver reads metrics.jsonl while the run trains (rank 0 mirrors it into storage
at the report cadence, ``train.report_every_n_steps``)."""
TIMEOUT_S = 10.0
"""One request's wait: a server that hangs delays the follower thread, and the driver's end by
as much, never the training."""


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
            RUN_DIR_TAG: record.get("run_dir") or ""}
    if isinstance(commit, str) and commit:
        tags["mlflow.source.git.commit"] = commit
    return {key: str(value)[:MAX_TAG_VAL_LENGTH] for key, value in tags.items()}


def metric_entries(rows: list[dict[str, Any]], since_ms: int = 0) -> list[dict[str, Any]]:
    """``log-batch`` metrics: every number of every row at its step and time (ms)."""
    return [entry for entries in rows_entries(rows, since_ms) for entry in entries]


def rows_entries(rows: list[dict[str, Any] | None], since_ms: int) -> list[list[dict[str, Any]]]:
    """Each row's metrics (None: a line that is not a row, none). A row without a time
    (evaluations, the summary) takes the time of the row before it (``since_ms`` for the first:
    the run's start), so the same file always gives the same metrics: mlflow 3.17.2 keys a metric
    by (key, timestamp, step, value) (``store/tracking/dbmodels/models.py`` ``metric_pk``) and
    ``sqlalchemy_store._log_metrics_once`` drops one sent again, so a line logged twice is held once."""
    out = []
    for row in rows:
        stamp = (row or {}).get(contract.WALL_TIME)
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
            since_ms = int(stamp * 1000)
        out.append([{"key": key, "value": wire_number(value), "step": row_step(row), "timestamp": since_ms}
                    for key, value in (scalars(row) if row else ())])
    return out


def _epoch_ms(stamp: Any) -> int | None:
    """run.json's ISO time (``start_time``, ``end_time``) in ms since the epoch; None when absent."""
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def _read(uri: str) -> bytes | None:
    try:
        return read_bytes(uri)
    except FileNotFoundError:
        return None


def complete_lines(text: bytes | None) -> list[bytes]:
    """metrics.jsonl's complete lines: a last line without its newline is still being written."""
    text = text or b""
    return text[:text.rfind(b"\n") + 1].splitlines()


def parsed(line: bytes) -> dict[str, Any] | None:
    """A line's row; None for a line that is not a JSON object (skipped, as the report does)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LiveRun:
    """One run directory's MLflow run, kept by the driver: :meth:`start` (a follower thread),
    :meth:`after_run` (the end). :meth:`finish` alone logs a finished run after the fact."""

    def __init__(self, uri: str, experiment: str, run_dir: str, *, poll_s: float = POLL_S,
                 timeout_s: float = TIMEOUT_S, say: Callable[[str], None] = _warn):
        self.tracking = Tracking(uri, timeout_s=timeout_s)
        self.uri, self.experiment, self.run_dir = uri, experiment, run_dir.rstrip("/")
        self.poll_s, self.say = poll_s, say
        self.info: dict[str, str] = {}
        """``run_id``, ``experiment_id``, ``artifact_uri`` once the run is open."""
        self.lines = 0
        """Complete lines of metrics.jsonl the MLflow run holds."""
        self._start_ms = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def _tags(self, record: dict[str, Any]) -> dict[str, str]:
        """:func:`run_tags`, the run found again by its record's ``run_dir`` (where its driver
        logged it from: a local copy logged after the fact is the same run), else the folder read."""
        return {**run_tags(record), RUN_DIR_TAG: str(record.get("run_dir") or self.run_dir).rstrip("/")}

    def open(self, record: dict[str, Any]) -> dict[str, str]:
        """Find the run by :data:`RUN_DIR_TAG` or create it; log the parameters it lacks."""
        if self.info:
            return self.info
        experiment_id = self.tracking.experiment_id(self.experiment)
        self._start_ms = _epoch_ms(record.get("start_time")) or int(time.time() * 1000)
        params = flatten(record.get("job_config") or {})
        found = self.tracking.find_run(experiment_id, RUN_DIR_TAG, self._tags(record)[RUN_DIR_TAG])
        changed: list[str] = []
        if found is None:
            name = (record.get("job_config") or {}).get("run_name") or self.run_dir.rsplit("/", 1)[-1]
            info = self.tracking.create_run(experiment_id, name, self._tags(record), self._start_ms)
            tags = None
        else:
            info, data = found["info"], found.get("data") or {}
            self._start_ms = int(info.get("start_time") or self._start_ms)  # the first attempt's: same times again
            logged_tags = {t["key"]: t["value"] for t in data.get("tags") or []}
            logged = {p["key"]: p["value"] for p in data.get("params") or []}
            self.lines = int(logged_tags[CURSOR_TAG]) if logged_tags.get(CURSOR_TAG, "").isdigit() else 0
            # mlflow 3.17.2 sqlalchemy_store._log_params refuses a changed value (the whole batch):
            # the parameter keeps its first value, this attempt's is a tag (tags may change), and
            # a tag an earlier attempt set follows the value back.
            changed = sorted(key for key, value in params.items() if logged.get(key, value) != value)
            tags = self._tags(record) | {PARAM_TAG_PREFIX + key: value for key, value in params.items()
                                       if key in changed or PARAM_TAG_PREFIX + key in logged_tags}
            params = {key: value for key, value in params.items() if key not in logged}
            if info.get("status") != "RUNNING" and record.get("status") == "running":
                self.tracking.reopen_run(info["run_id"])
        self.tracking.log_batch(info["run_id"], params=params, tags=tags)
        if changed:
            self.say(f"mlflow: run {info['run_id']} keeps the first values of {', '.join(changed)} "
                     f"(MLflow parameters cannot change); this attempt's are the tags {PARAM_TAG_PREFIX}<key>")
        self.info = {"run_id": info["run_id"], "experiment_id": experiment_id, "artifact_uri": info["artifact_uri"]}
        return self.info

    def catch_up(self) -> int:
        """Log metrics.jsonl's lines past :attr:`lines`; returns how many were logged. The
        cursor tag travels in the same ``log-batch`` as its metrics, which mlflow 3.17.2 writes
        first (``sqlalchemy_store.log_batch``: params, metrics, then tags): a cursor is never
        ahead of the metrics it counts."""
        lines = complete_lines(_read(f"{self.run_dir}/{contract.METRICS_NAME}"))
        if len(lines) <= self.lines:
            return 0
        per_line = rows_entries([parsed(line) for line in lines], self._start_ms)
        chunk, logged = [], 0
        for index in range(self.lines, len(lines)):
            if chunk and len(chunk) + len(per_line[index]) > MAX_METRICS_PER_BATCH - 1:  # one entity: the cursor
                logged += self._send(chunk, index)
                chunk = []
            chunk += per_line[index]
        return logged + self._send(chunk, len(lines))

    def _send(self, metrics: list[dict[str, Any]], upto: int) -> int:
        self.tracking.call("runs/log-batch", {"run_id": self.info["run_id"], "metrics": metrics,
                                              "tags": [{"key": CURSOR_TAG, "value": str(upto)}]})
        sent, self.lines = upto - self.lines, upto
        return sent

    def attempt(self, action: Callable[[], Any]) -> bool:
        """Run ``action``; a failure is one warning line for the whole run, never an error."""
        try:
            action()
            return True
        except Exception as err:  # noqa: BLE001 - the tracking is a copy; run.json is the record
            if not self._warned:
                self._warned = True
                self.say(f"warning: mlflow: {self.uri}: {type(err).__name__}: {err}; the run goes on, its "
                         "metrics are logged when the server answers (at the latest at the end)")
            return False

    def start(self, record: dict[str, Any]) -> "LiveRun":
        """Open the run and follow metrics.jsonl in a thread until :meth:`stop`."""
        def follow() -> None:
            while True:
                self.attempt(lambda: (self.open(record), self.catch_up()))
                if self._stop.wait(self.poll_s):
                    return

        self._thread = threading.Thread(target=follow, name="mlflow-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the follower thread (after the request it may be in)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self, record: dict[str, Any]) -> dict[str, str]:
        """The end: the rest of the metrics, the outcome's tags, the artifacts, the status.
        Raises what the server or the storage raised."""
        self.stop()
        info = self.open(record)
        self.catch_up()
        self.tracking.log_batch(info["run_id"], tags=self._tags(record))
        if record.get("status") in STATUS:  # before the files: a store not written leaves no run RUNNING
            self.tracking.finish_run(info["run_id"], STATUS[record["status"]], _epoch_ms(record.get("end_time")))
        for name in ARTIFACTS:
            data = _read(f"{self.run_dir}/{name}")
            if data is not None:
                self.tracking.put_artifact(info["artifact_uri"], name, data)
        return info

    def after_run(self, record: dict[str, Any]) -> None:
        """The driver's end of the run: :meth:`finish`, or one warning line saying how to log it later."""
        try:
            info = self.finish(record)
        except Exception as err:  # noqa: BLE001 - the tracking is a copy; run.json is the record
            self.say(f"warning: mlflow: {self.uri}: the run is not fully logged ({type(err).__name__}: {err}); "
                     f"later: raytrain-eks runs <prefix> --to-mlflow {self.uri}")
            return
        print(f"mlflow: run {info['run_id']} in experiment {info['experiment_id']} at {self.uri}", flush=True)


def export_run(uri: str, run_dir: str, *, experiment: str = "", record: dict[str, Any] | None = None) -> dict[str, str]:
    """Log the run in ``run_dir`` (local path or ``s3://``) to the tracking server ``uri`` (the
    MLflow run it already has there, else a new one); returns ``{"run_id", "experiment_id", "artifact_uri"}``."""
    base = run_dir.rstrip("/")
    if record is None:
        text = _read(f"{base}/{contract.RECORD_NAME}")
        if text is None:
            raise FileNotFoundError(f"{base}/{contract.RECORD_NAME}: no run record to log")
        record = json.loads(text)
    config = record.get("job_config") or {}
    # the driver's choice (tracking_target), so the run's MLflow run is found where it was logged
    experiment = experiment or (config.get("tracking") or {}).get("mlflow_experiment") or config.get("name") or "raytrain-eks"
    wait = os.environ.get(ENV_REQUEST_TIMEOUT, "120")
    if not wait.isdigit() or not int(wait):
        raise ValueError(f"{ENV_REQUEST_TIMEOUT}={wait!r}: not a whole number of seconds above 0")
    return LiveRun(uri, experiment, base, timeout_s=float(wait)).finish(record)


def tracking_target(job: Any, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """``(uri, experiment)`` when the job's ``tracking.mlflow_uri`` or ``MLFLOW_TRACKING_URI``
    names a server (the job's wins; its experiment likewise); None otherwise."""
    env = os.environ if environ is None else environ
    tracking = getattr(job, "tracking", None)
    uri = getattr(tracking, "mlflow_uri", "") or env.get(ENV_TRACKING_URI, "")
    if not uri.startswith(("http://", "https://", "arn:")):
        return None  # unset, or a store only an MLflow client writes (file:, sqlite:, databricks)
    return uri, getattr(tracking, "mlflow_experiment", "") or env.get(ENV_EXPERIMENT) or job.name


def open_driver_sink(job: Any, run_dir: str, record: dict[str, Any], environ: dict[str, str] | None = None) -> LiveRun | None:
    """The driver's live MLflow run for this run (None without a server): started now, ended by
    its :meth:`LiveRun.after_run`."""
    target = tracking_target(job, environ)
    return None if target is None else LiveRun(target[0], target[1], run_dir).start(dict(record))


def after_run(job: Any, run_dir: str, record: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    """The finished run, logged by a driver that followed none (:func:`export_run`)."""
    target = tracking_target(job, environ)
    if target is None:
        return
    logged = export_run(target[0], run_dir, experiment=target[1], record=record)
    print(f"mlflow: run {logged['run_id']} in experiment {logged['experiment_id']} at {target[0]}", flush=True)
