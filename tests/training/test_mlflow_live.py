"""The driver's live MLflow run (training/metric_sinks/mlflow.py ``LiveRun``) against a real
``mlflow server`` 3.17.2 on 127.0.0.1 (tests/tracking_venv.py), read back through the server's
REST API with the standard library; metrics.jsonl written by hand between the follower's reads,
as rank 0's mirror grows it in storage. No training here: the runs that train are in
tests/training/test_tracking_real_run.py and tests/e2e/test_tracking_submit.py.

The oracles are mlflow 3.17.2's own rules, from its source in the tracking venv:
``store/tracking/dbmodels/models.py`` (``SqlMetric``: primary key ``metric_pk`` = key,
timestamp, step, run_uuid, value, is_nan) with ``store/tracking/sqlalchemy_store.py``
(``_log_metrics_once``: a metric sent again is dropped, not stored twice; ``_log_params``: a
changed parameter value refuses the batch; ``log_batch``: params, then metrics, then tags, each
in its own session), ``utils/validation.py`` (``_validate_batch_log_limits``: 1000 metrics, 100
params, 100 tags, 1000 entities per call) and ``utils/search_utils.py`` (the ``runs/search``
filter a run is found again with).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracking_venv import expected_scalars, mlflow_server, rest_get, rest_post

from training import contract
from training.metric_sinks.mlflow import CURSOR_TAG, RUN_DIR_TAG, LiveRun
from training.mlflow_rest import MlflowError, Tracking

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def _live(*args, **kwargs) -> LiveRun:
    """A LiveRun whose requests wait as long as a loaded machine needs (the driver's 10 s is a
    production bound; here a slow answer must not read as a server down)."""
    return LiveRun(*args, timeout_s=300, **kwargs)


def _rows(first: int, last: int) -> list[dict]:
    """Train rows of steps first..last, and an evaluation (no time, as the loop writes it) every 3."""
    rows = []
    for step in range(first, last + 1):
        rows.append({"kind": "train", "step": step, "loss": 5.0 - step / 10, "lr": 1e-4, "tokens_per_s": 100.0 + step,
                     "time": 1_760_000_000 + step})
        if step % 3 == 0:
            rows.append({"kind": "eval", "step": step, "eval_loss": 4.0 - step / 10})
    return rows


def _append(run_dir: Path, rows: list[dict], tail: str = "") -> None:
    with (run_dir / contract.METRICS_NAME).open("a") as out:
        out.write("".join(json.dumps(row) + "\n" for row in rows) + tail)


def _record(run_dir: Path, status: str = "running", **config) -> dict:
    return {"run_dir": str(run_dir), "status": status, "start_time": "2026-12-03T20:00:00+00:00",
            "end_time": "2026-12-03T20:10:00+00:00" if status != "running" else None,
            "job_config": {"name": "live", "run_name": run_dir.name, "train": {"max_steps": 9, **config}},
            "image": "img@sha256:" + "a" * 64, "image_digest": "sha256:" + "a" * 64, "spec_hash": "s" * 8,
            "source": {"git_commit": "c" * 40}, "verdict": {"verdict": "accepted"} if status != "running" else None}


def _runs(url: str, experiment: str) -> list[dict]:
    experiment_id = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=experiment)["experiment"]["experiment_id"]
    return rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id]})["runs"]


def _history(url: str, run_id: str, key: str) -> list[list[float]]:
    history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key=key)["metrics"]
    return sorted([int(m["step"]), m["value"]] for m in history)


def _holds_exactly(url: str, run_id: str, rows: list[dict]) -> None:
    """Every figure of ``rows`` once per step (no metric twice), as metrics.jsonl has it."""
    for key, points in expected_scalars(rows, float32=False).items():
        assert _history(url, run_id, key) == points, key


def test_a_restarted_driver_continues_the_same_mlflow_run_where_it_stopped(server, tmp_path):
    run_dir = tmp_path / "live-1"
    run_dir.mkdir()
    _append(run_dir, _rows(1, 5))
    first = _live(server, "restart", str(run_dir))
    info = first.open(_record(run_dir))
    assert first.catch_up() == 6 and first.lines == 6  # 5 train rows and the evaluation at step 3

    _append(run_dir, _rows(6, 9))  # the run goes on; the driver is replaced (a new process: a new LiveRun)
    second = _live(server, "restart", str(run_dir))
    assert second.open(_record(run_dir))["run_id"] == info["run_id"]  # found by its tag, not a new run
    assert second.lines == 6  # from the cursor tag the first driver left
    assert second.catch_up() == 6
    runs = _runs(server, "restart")
    assert len(runs) == 1
    tags = {t["key"]: t["value"] for t in runs[0]["data"]["tags"]}
    assert tags[RUN_DIR_TAG] == str(run_dir) and tags[CURSOR_TAG] == "12"
    _holds_exactly(server, info["run_id"], _rows(1, 9))


def test_a_line_logged_twice_is_held_once(server, tmp_path):
    """The cursor may lag the metrics it counts (mlflow writes the tag after the metrics, in
    another session): the lines after it are sent again, and the server keeps each metric once,
    an evaluation without a time of its own included (its time is the row before it's)."""
    run_dir = tmp_path / "live-2"
    run_dir.mkdir()
    _append(run_dir, _rows(1, 6))
    live = _live(server, "twice", str(run_dir))
    info = live.open(_record(run_dir))
    live.catch_up()
    again = _live(server, "twice", str(run_dir))
    again.open(_record(run_dir))
    again.lines = 0  # as if the cursor tag had never been written
    assert again.catch_up() == 8
    _holds_exactly(server, info["run_id"], _rows(1, 6))


def test_a_line_still_being_written_waits_for_its_newline(server, tmp_path):
    run_dir = tmp_path / "live-3"
    run_dir.mkdir()
    _append(run_dir, _rows(1, 2), tail='{"kind": "train", "step": 3, "lo')
    live = _live(server, "partial", str(run_dir))
    info = live.open(_record(run_dir))
    assert live.catch_up() == 2
    (run_dir / contract.METRICS_NAME).write_text("".join(json.dumps(r) + "\n" for r in _rows(1, 4)))
    assert live.catch_up() == 3
    _holds_exactly(server, info["run_id"], _rows(1, 4))


def test_many_lines_go_in_calls_within_the_server_s_limits(server, tmp_path, monkeypatch):
    """1000 entities a call (``_validate_batch_log_limits``), the cursor tag being one of them."""
    run_dir = tmp_path / "live-4"
    run_dir.mkdir()
    rows = [{"kind": "train", "step": s, **{f"m{k}": float(s + k) for k in range(7)}, "time": 1_760_000_000 + s}
            for s in range(1, 401)]  # 2,800 metrics
    _append(run_dir, rows)
    live = _live(server, "limits", str(run_dir))
    info = live.open(_record(run_dir))
    sent: list[dict] = []
    real_call = Tracking.call
    monkeypatch.setattr(Tracking, "call", lambda self, endpoint, payload=None, **kw:
                        (sent.append(payload) if endpoint == "runs/log-batch" else None) or real_call(self, endpoint, payload, **kw))
    assert live.catch_up() == 400
    assert [len(body["metrics"]) for body in sent] == [994, 994, 812]  # 142 rows of 7, twice, then the rest
    assert [body["tags"] for body in sent][-1] == [{"key": CURSOR_TAG, "value": "400"}]
    _holds_exactly(server, info["run_id"], rows)
    with pytest.raises(MlflowError, match="INVALID_PARAMETER_VALUE"):  # the limit is the server's
        live.tracking.call("runs/log-batch", {"run_id": info["run_id"], "metrics": sent[0]["metrics"] + sent[2]["metrics"][:7],
                                              "tags": sent[0]["tags"]})


def test_a_resumed_run_is_running_again_then_ends_with_the_new_outcome(server, tmp_path):
    run_dir = tmp_path / "live-5"
    run_dir.mkdir()
    _append(run_dir, _rows(1, 3))
    done = _live(server, "resume", str(run_dir)).finish(_record(run_dir, status="failed"))
    assert rest_get(server, "/api/2.0/mlflow/runs/get", run_id=done["run_id"])["run"]["info"]["status"] == "FAILED"

    resumed = _live(server, "resume", str(run_dir), say=print)
    assert resumed.open(_record(run_dir, lr=2e-4))["run_id"] == done["run_id"]
    run = rest_get(server, "/api/2.0/mlflow/runs/get", run_id=done["run_id"])["run"]
    assert run["info"]["status"] == "RUNNING"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["train.lr"] == "0.0002" and params["train.max_steps"] == "9"  # a new key added, the others kept
    _append(run_dir, _rows(4, 6))
    resumed.finish(_record(run_dir, status="succeeded", lr=2e-4))
    run = rest_get(server, "/api/2.0/mlflow/runs/get", run_id=done["run_id"])["run"]
    assert run["info"]["status"] == "FINISHED"
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["raytrain.verdict"] == "accepted"
    _holds_exactly(server, done["run_id"], _rows(1, 6))
    root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    assert rest_get(server, f"/api/2.0/mlflow-artifacts/artifacts/{root}/{contract.METRICS_NAME}") == \
        (run_dir / contract.METRICS_NAME).read_bytes()


def test_a_changed_parameter_keeps_its_first_value_and_this_attempt_s_is_a_tag(server, tmp_path):
    """MLflow parameters cannot change (``_log_params`` refuses the whole batch): the run goes
    on, the parameter keeps its first value, this attempt's value is the tag
    ``raytrain.param.<key>`` (tags can change: ``set_tag`` overwrites), and one line says so.
    A later attempt back on the first value sets the tag back."""
    run_dir = tmp_path / "live-6"
    run_dir.mkdir()
    first = _live(server, "changed", str(run_dir)).open(_record(run_dir))
    lines: list[str] = []
    again = _live(server, "changed", str(run_dir), say=lines.append)
    assert again.open(_record(run_dir, max_steps=20))["run_id"] == first["run_id"]
    assert lines == [f"mlflow: run {first['run_id']} keeps the first values of train.max_steps (MLflow parameters "
                     "cannot change); this attempt's are the tags raytrain.param.<key>"]
    run = rest_get(server, "/api/2.0/mlflow/runs/get", run_id=first["run_id"])["run"]
    assert {p["key"]: p["value"] for p in run["data"]["params"]}["train.max_steps"] == "9"
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["raytrain.param.train.max_steps"] == "20"
    with pytest.raises(MlflowError, match="INVALID_PARAMETER_VALUE"):  # what sending it would have got
        again.tracking.log_batch(first["run_id"], params={"train.max_steps": "20"})
    _live(server, "changed", str(run_dir), say=lines.append).open(_record(run_dir))
    run = rest_get(server, "/api/2.0/mlflow/runs/get", run_id=first["run_id"])["run"]
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["raytrain.param.train.max_steps"] == "9"
    assert len(lines) == 1


def test_a_non_finite_figure_is_logged_as_mlflow_holds_it_and_loses_nothing_after_it(server, tmp_path):
    """A diverged step writes ``NaN``/``Infinity`` into metrics.jsonl (``json.dumps``' default;
    the loop's loss is NaN for a batch without targets). Oracle: protobuf 7.36.2
    ``google/protobuf/json_format.py`` ``_ConvertFloat`` refuses a bare NaN/Infinity ("use quoted
    \\"NaN\\" instead"), and mlflow 3.17.2 ``server/handlers.py`` ``_get_request_message``
    swallows that ParseError and goes on with the half-parsed message: every metric after the
    bad one and the batch's tags (the cursor) are dropped, and a ``0.0`` at step 0, time 0 is
    stored instead. Sent quoted (proto3's JSON mapping, as MLflow's own client's
    ``message_to_json`` writes it), NaN is held as NaN and an infinity as
    ``sqlalchemy_store.sanitize_metric_value`` clamps it (±1.7976931348623157e308)."""
    run_dir = tmp_path / "live-7"
    run_dir.mkdir()
    rows = [{"kind": "train", "step": 1, "loss": 2.0, "grad_norm": 1.0, "time": 1_760_000_001},
            {"kind": "train", "step": 2, "loss": float("nan"), "grad_norm": float("inf"), "time": 1_760_000_002},
            {"kind": "eval", "step": 2, "eval_loss": 3.0, "eval_perplexity": float("-inf")},
            {"kind": "train", "step": 3, "loss": 1.5, "grad_norm": 0.5, "time": 1_760_000_003}]
    _append(run_dir, rows)
    live = _live(server, "nonfinite", str(run_dir))
    info = live.open(_record(run_dir))
    assert live.catch_up() == 4
    assert _history(server, info["run_id"], "train/loss") == [[1, 2.0], [2, "NaN"], [3, 1.5]]
    assert _history(server, info["run_id"], "train/grad_norm") == [[1, 1.0], [2, 1.7976931348623157e308], [3, 0.5]]
    assert _history(server, info["run_id"], "eval/eval_perplexity") == [[2, -1.7976931348623157e308]]
    assert _history(server, info["run_id"], "eval/eval_loss") == [[2, 3.0]]
    tags = {t["key"]: t["value"] for t in _runs(server, "nonfinite")[0]["data"]["tags"]}
    assert tags[CURSOR_TAG] == "4"
    again = _live(server, "nonfinite", str(run_dir))  # a restarted driver re-sends it all: held once
    again.open(_record(run_dir))
    again.lines = 0
    again.catch_up()
    assert _history(server, info["run_id"], "train/loss") == [[1, 2.0], [2, "NaN"], [3, 1.5]]


@pytest.mark.parametrize("name", ["it's", 'say "hi"', "both ' and \" \\ 50%_x"])
def test_a_run_directory_with_quotes_is_found_again(server, tmp_path, name):
    """mlflow 3.17.2 ``utils/search_utils.py``: a filter value is one string token in single or
    double quotes with no escapes (``_strip_quotes`` trims its ends), so a value holding both
    quote characters cannot be written with ``=``; a restarted driver must still find its run
    (not open a second one)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    first = _live(server, "quotes", str(run_dir)).open(_record(run_dir))
    again = _live(server, "quotes", str(run_dir)).open(_record(run_dir))
    assert again["run_id"] == first["run_id"]


def test_a_server_that_does_not_proxy_artifacts_gets_the_run_finished_and_its_files_in_its_store(tmp_path):
    """SageMaker's managed MLflow keeps artifacts in an S3 artifact store (its ``ArtifactStoreUri``)
    and serves no ``mlflow-artifacts`` proxy: a run's ``artifact_uri`` is ``s3://...``, which the
    client writes itself (mlflow 3.17.2 ``store/artifact/artifact_repository_registry.py``: the
    scheme picks the repository). Modelled by a real server run with ``--no-serve-artifacts
    --default-artifact-root <folder>`` (the same path through ``pyarrow.fs`` as ``s3://``). The
    run was left RUNNING with no files, the end refused."""
    store = tmp_path / "store"
    run_dir = tmp_path / "live-8"
    run_dir.mkdir()
    _append(run_dir, _rows(1, 3))
    (run_dir / contract.RECORD_NAME).write_text("{}")
    with mlflow_server(tmp_path / "mlflow", artifact_root=str(store)) as url:
        info = _live(url, "unproxied", str(run_dir)).finish(_record(run_dir, status="succeeded"))
        run = rest_get(url, "/api/2.0/mlflow/runs/get", run_id=info["run_id"])["run"]
        assert run["info"]["status"] == "FINISHED"
        _holds_exactly(url, info["run_id"], _rows(1, 3))
    assert not info["artifact_uri"].startswith("mlflow-artifacts:")
    from training.storage.files import filesystem_for

    filesystem, folder = filesystem_for(info["artifact_uri"])
    with filesystem.open_input_stream(f"{folder}/{contract.METRICS_NAME}") as stream:
        assert stream.read() == (run_dir / contract.METRICS_NAME).read_bytes()
