"""A REAL run of the `local` job (shortened; one plain process: the loop the Ray workers run and
the driver's record code, :func:`training.launch.run_in_process`), tracked by both sinks: its
TensorBoard events (read with TensorBoard 2.21.0's ``EventAccumulator``) and its MLflow run (on a
real ``mlflow server`` 3.17.2 on 127.0.0.1, read back through the server's REST API with the
standard library) hold the same figures as metrics.jsonl, step by step; the MLflow run holds them
while the run still trains; and a run whose server does not answer while it trains succeeds,
with one warning line, and its MLflow run is complete once the server answers at the end. Both
oracles run in the tracking venv (tests/tracking_venv.py). The same through `raytrain-eks submit
--local`: tests/e2e/test_tracking_submit.py."""
from __future__ import annotations

import importlib
import json
import socket
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
import torch.distributed as dist
from fixture_paths import FIXTURE_JOBS
from tracking_venv import expected_scalars, last_by_step, read_events, rest_get, rest_post, tracking_python

from training import contract, metric_sinks, verdict
from training.config import load_job_config
from training.metric_sinks.mlflow import ENV_EXPERIMENT, ENV_TRACKING_URI, flatten
from training.metric_sinks.tensorboard import ACCEPTED_TAG, CONFIG_TAG, TEXT_SUFFIX, VERDICT_TAG, config_text

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "tracking-test"
SHORT = ["parallel.num_workers=1", "parallel.workers_per_node=1", "train.global_batch_size=2", "train.max_steps=6",
         "train.log_every_n_steps=1", "eval.every_n_steps=3", "eval.max_batches=2", "checkpoint.every_n_steps=0"]

pytestmark = pytest.mark.slow


PROBE_SINK = '''
"""A test sink (tests/training/test_tracking_real_run.py): rank 0's rows and its end, handed to the test."""
ON_WRITE = ON_CLOSE = None


class Probe:
    def write(self, row):
        if ON_WRITE is not None:
            ON_WRITE(row)

    def close(self):
        if ON_CLOSE is not None:
            ON_CLOSE()


def open_sink(job, ctx):
    return Probe() if ctx.rank == 0 else None
'''


def _train(tmp_path: Path, monkeypatch, url: str, experiment: str, *, on_write=None, on_close=None):
    """The shortened `local` job in this process with the MLflow server named in the environment
    as a user names it, and the probe sink beside the shipped ones: ``(job, record, run_dir)``."""
    from training.launch import run_in_process
    from training.loop import local_context

    folder = tmp_path / "probe-sink"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE_SINK)
    monkeypatch.setattr(metric_sinks, "__path__", [*metric_sinks.__path__, str(folder)])
    probe = importlib.import_module("training.metric_sinks.probe")
    probe.ON_WRITE, probe.ON_CLOSE = on_write, on_close
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("RAYTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_TRACKING_URI, url)
    monkeypatch.setenv(ENV_EXPERIMENT, experiment)
    job = load_job_config(FIXTURE_JOBS / "local.toml", SHORT)
    run_dir = tmp_path / "runs" / job.run_name
    run_dir.mkdir(parents=True)
    try:  # the run directory is the worker's own: metrics.jsonl lands there, as in storage
        final = run_in_process(job, local_context(str(run_dir), run_dir=str(run_dir)))
    finally:
        dist.destroy_process_group()
        sys.modules.pop("training.metric_sinks.probe", None)
    return job, final, run_dir


def _wait_for_step(url: str, experiment: str, step: int, bound_s: float = 300.0) -> dict:
    """The MLflow run as the server holds it once its ``train/loss`` reaches ``step`` (the
    follower reads metrics.jsonl every POLL_S): a bounded wait for that event, failing at the bound."""
    import time

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        runs = _search(url, experiment)
        if runs:
            # a run with no train/loss yet answers {} (proto3 JSON leaves an empty list out)
            history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=runs[0]["info"]["run_id"],
                               metric_key="train/loss").get("metrics", [])
            if any(int(m["step"]) >= step for m in history):
                return {"status": runs[0]["info"]["status"], "steps": sorted(int(m["step"]) for m in history)}
        time.sleep(1)
    pytest.fail(f"train/loss of step {step} did not reach the server within {bound_s} s")


def _search(url: str, experiment: str) -> list[dict]:
    try:
        found = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=experiment)["experiment"]
    except OSError:  # the experiment does not exist yet (HTTP 404)
        return []
    # an experiment with no run yet answers {} (proto3 JSON leaves an empty list out)
    return rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [found["experiment_id"]]}).get("runs", [])


@pytest.fixture(scope="module")
def server(local_run_mlflow) -> str:
    """The session's real MLflow server (tests/conftest.py ``local_run_mlflow``, started once): each
    run here in an experiment of its own, read by that experiment's name."""
    if not local_run_mlflow:
        tracking_python()  # skips, saying how to make the tracking venv
    return local_run_mlflow


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, server):
    """The `local` job, 6 steps with an evaluation at step 3, with the MLflow server named in the
    environment: ``(job, record, run_dir, server url, what the server held when step 4 was logged)``."""
    tmp_path = tmp_path_factory.mktemp("tracked-run")
    seen: dict = {}
    url = server

    def at_step_4(row):
        if row.get("kind") == "train" and row.get("step") == 4:
            seen.update(_wait_for_step(url, EXPERIMENT, 3))

    with pytest.MonkeyPatch.context() as monkeypatch:
        job, final, run_dir = _train(tmp_path, monkeypatch, url, EXPERIMENT, on_write=at_step_4)
        yield job, final, run_dir, url, seen


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / contract.METRICS_NAME).read_text().splitlines()]


def test_the_events_hold_metrics_jsonl_step_by_step(tracked_run):
    job, final, run_dir, _, _ = tracked_run
    rows = _rows(run_dir)
    events = read_events(run_dir / contract.TENSORBOARD_DIR)
    assert {tag: last_by_step(p) for tag, p in events["scalars"].items() if tag != ACCEPTED_TAG} == expected_scalars(rows)
    assert [step for step, _ in events["scalars"]["train/loss"]] == list(range(1, 7))
    assert [step for step, _ in events["scalars"]["eval/eval_loss"]] == [0, 3, 6]
    assert events["text"][CONFIG_TAG + TEXT_SUFFIX] == [[0, config_text(job.to_dict())]]
    assert events["text"][VERDICT_TAG + TEXT_SUFFIX] == [[6, verdict.headline(final["verdict"])]]
    assert events["scalars"][ACCEPTED_TAG] == [[6, float(final["verdict"]["verdict"] == verdict.ACCEPTED)]]


def test_the_mlflow_run_holds_metrics_jsonl_step_by_step(tracked_run):
    job, final, run_dir, url, _ = tracked_run
    experiment = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    runs = rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    assert len(runs) == 1
    info, data = runs[0]["info"], runs[0]["data"]
    assert info["run_name"] == job.run_name and info["status"] == "FINISHED"
    for field in ("start_time", "end_time"):  # the record's times, not the upload's
        assert int(info[field]) == int(datetime.fromisoformat(final[field]).timestamp() * 1000)
    assert {p["key"]: p["value"] for p in data["params"]} == flatten(final["job_config"])
    tags = {t["key"]: t["value"] for t in data["tags"]}
    assert tags["raytrain.verdict"] == final["verdict"]["verdict"]
    assert tags["raytrain.verdict_line"] == verdict.headline(final["verdict"])
    assert tags["raytrain.spec_hash"] == final["spec_hash"] and tags["raytrain.image_digest"] == final["image_digest"]

    expected = expected_scalars(_rows(run_dir), float32=False)
    assert {m["key"] for m in data["metrics"]} == set(expected)
    for key, points in expected.items():
        history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=info["run_id"], metric_key=key)["metrics"]
        assert last_by_step([[m["step"], m["value"]] for m in history]) == points, key

    root = info["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    for name in (contract.RECORD_NAME, contract.METRICS_NAME):
        assert rest_get(url, f"/api/2.0/mlflow-artifacts/artifacts/{root}/{name}") == (run_dir / name).read_bytes()


def test_log_batch_splits_within_the_server_s_limits(tracked_run):
    """mlflow 3.17.2 ``mlflow/utils/validation.py`` (``_validate_batch_log_limits``): over 1000
    metrics, 100 params or 100 tags in one ``log-batch`` is refused; the client's batches pass."""
    from training.mlflow_rest import MlflowError, Tracking

    url = tracked_run[3]
    tracking = Tracking(url)
    run_id = tracking.create_run(tracking.experiment_id("limits"), "limits", {}, 0)["run_id"]
    metrics = [{"key": f"m{i % 5}", "value": float(i), "step": i, "timestamp": 0} for i in range(2501)]
    with pytest.raises(MlflowError, match="INVALID_PARAMETER_VALUE"):  # the limit is the server's
        tracking.call("runs/log-batch", {"run_id": run_id, "metrics": metrics[:1001]})
    calls = tracking.log_batch(run_id, metrics=metrics, params={f"p{i}": str(i) for i in range(250)},
                               tags={f"t{i}": str(i) for i in range(150)})
    assert calls == 3  # 100+100+800, 100+50+850, 0+0+851
    data = rest_get(url, "/api/2.0/mlflow/runs/get", run_id=run_id)["run"]["data"]
    assert len(data["params"]) == 250 and sum(t["key"].startswith("t") for t in data["tags"]) == 150
    history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=run_id, metric_key="m0")["metrics"]
    assert sorted(m["step"] for m in history) == list(range(0, 2501, 5))


def test_a_server_named_in_the_job_config_wins_over_the_environment(tracked_run):
    """``tracking.mlflow_uri`` / ``tracking.mlflow_experiment`` (the job's own) are used even
    when the environment names none: the driver's after-run logging of the same finished run."""
    from training.metric_sinks import mlflow as sink

    job, final, run_dir, url, _ = tracked_run
    named = load_job_config(FIXTURE_JOBS / "local.toml",
                            SHORT + [f'tracking.mlflow_uri="{url}"', 'tracking.mlflow_experiment="from-the-job"'])
    sink.after_run(named, str(run_dir), final, environ={})
    experiment = rest_get(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="from-the-job")["experiment"]
    runs = rest_post(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    assert [r["info"]["run_name"] for r in runs] == [job.run_name]


def test_the_mlflow_run_holds_the_steps_while_the_run_trains(tracked_run):
    """Live: when rank 0 logged step 4 of 6, the server already held steps 1..3, in a RUNNING run."""
    seen = tracked_run[4]
    assert seen["status"] == "RUNNING"
    assert seen["steps"][:3] == [1, 2, 3] and 6 not in seen["steps"]


class Outage:
    """The tracking server behind a port that refuses connections until :meth:`up` (a socket
    bound but not listening: the kernel answers a connect with RST, ECONNREFUSED, as for a
    server that is down), then forwards every connection to the real server."""

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def up(self) -> None:
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:  # closed
                return
            server = socket.create_connection((self.upstream[0], int(self.upstream[1])))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_a_server_down_while_the_run_trains_fails_nothing_and_is_caught_up_at_the_end(tmp_path_factory, capfd, server):
    """The server refuses every connection while the run trains (it comes up when rank 0's loop
    ends): the run succeeds, the driver said so in one warning line, and its MLflow run holds
    metrics.jsonl step by step once the driver has ended it."""
    tmp_path = tmp_path_factory.mktemp("outage")
    url = server
    with pytest.MonkeyPatch.context() as monkeypatch:
        outage = Outage(url)
        try:
            job, final, run_dir = _train(tmp_path, monkeypatch, outage.url, "outage", on_close=outage.up)
        finally:
            outage.close()
        err = capfd.readouterr().err
        assert final["status"] == "succeeded" and final["verdict"]["verdict"] != verdict.EXECUTION_FAILED
        warnings = [line for line in err.splitlines() if "mlflow" in line]
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: mlflow: {outage.url}: URLError:"), warnings
        assert "Connection refused" in warnings[0]
        runs = _search(url, "outage")
        assert [r["info"]["status"] for r in runs] == ["FINISHED"]
        for key, points in expected_scalars(_rows(run_dir), float32=False).items():
            history = rest_get(url, "/api/2.0/mlflow/metrics/get-history", run_id=runs[0]["info"]["run_id"], metric_key=key)
            assert sorted([int(m["step"]), m["value"]] for m in history["metrics"]) == points, key
