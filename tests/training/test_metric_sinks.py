"""The metric-sink registry (training/metric_sinks/): the loop's calls fan out to every sink file;
metrics.jsonl, the console and the Prometheus gauges come out as they did when the loop called
MetricsLog and TrainingGauges itself; a sink added as one file receives every call."""
from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest
from test_prometheus_units import ROW, RecordingGauge

from training import contract, metric_sinks, metrics
from training.metric_sinks import prometheus

JOB = SimpleNamespace(name="local", run_name="r1", to_dict=lambda: {"name": "local"},
                      train=SimpleNamespace(max_steps=7))
EVAL = {"kind": "eval", "step": 7, "eval_loss": 3.25}
CKPT = SimpleNamespace(stall_s=0.2, write_s=1.5)


def _script(log, gauges=None):
    """The loop's calls for: an evaluation, a window of two steps with a new checkpoint, the summary.
    ``gauges``: the loop before the registry (gauges called beside the log); None: the fan-out."""
    rows = [{**ROW, "step": 6, "loss": 2.75}, ROW]
    log.write(EVAL)
    if gauges is not None:
        gauges.evaluation(EVAL)
    for row in rows:
        log.write(row)
    if gauges is not None:
        gauges.step(rows[-1], [CKPT])
    else:
        log.checkpoints([CKPT])
    log.print(metrics.progress_line(rows[-1], 10, 30.0))
    log.sync()
    if gauges is not None:
        gauges.checkpoints([CKPT])  # after the final checkpoint: nothing new
    else:
        log.checkpoints([CKPT])
    log.write({"kind": "summary", "steps": 7})
    log.close()


@pytest.fixture
def recording(monkeypatch):
    import ray.util.metrics

    monkeypatch.setattr(ray.util.metrics, "Gauge", RecordingGauge)
    # refresh 0: no re-setting thread, so the recorded values are exactly the loop's sets
    monkeypatch.setattr(prometheus, "refresh_interval", lambda environ=None: 0)


def _gauges_made():
    made = {g.name: g for g in RecordingGauge.made}
    RecordingGauge.made = []
    return made


def test_the_registry_is_the_folder():
    assert metric_sinks.sink_names() == ("mlflow", "prometheus", "tensorboard")


def test_the_fan_out_writes_what_the_loop_wrote_before(tmp_path, recording):
    RecordingGauge.made = []
    before_out, after_out = io.StringIO(), io.StringIO()
    before_log = metrics.MetricsLog(tmp_path / "before", enabled=True, stream=before_out)
    _script(before_log, prometheus.for_worker(in_ray=True, run="r1", job="local", rank=0, refresh_s=0))
    before = _gauges_made()

    ctx = SimpleNamespace(rank=0, local_dir=str(tmp_path / "after"), storage=None, in_ray=True, run_dir="")
    fan_out = metric_sinks.open_metrics(JOB, ctx)
    fan_out.sinks[0].stream = after_out  # metrics.jsonl's log prints rank 0's console lines
    _script(fan_out)
    after = _gauges_made()

    name = contract.METRICS_NAME
    assert (tmp_path / "after" / name).read_bytes() == (tmp_path / "before" / name).read_bytes()
    assert after_out.getvalue() == before_out.getvalue() != ""
    assert set(after) == set(before) == set(contract.PROMETHEUS_METRICS)
    for gauge in before:  # what a scrape serves: each gauge's last value and labels
        assert after[gauge].tags == before[gauge].tags
        assert after[gauge].values[-1:] == before[gauge].values[-1:], gauge
    assert after[contract.METRIC_CHECKPOINT_STALL].values == before[contract.METRIC_CHECKPOINT_STALL].values == [0.2]
    assert after[contract.METRIC_EVAL_LOSS].values == [3.25]


def test_other_ranks_write_no_file_but_set_their_gauges(tmp_path, recording):
    RecordingGauge.made = []
    ctx = SimpleNamespace(rank=1, local_dir=str(tmp_path), storage=None, in_ray=True, run_dir="")
    _script(metric_sinks.open_metrics(JOB, ctx))
    assert not (tmp_path / contract.METRICS_NAME).exists()
    made = _gauges_made()
    assert made[contract.METRIC_LOSS].values[-1] == ROW["loss"] and made[contract.METRIC_LOSS].tags["rank"] == "1"


SINK_FILE = '''
"""A sink defined by the test: records every call it gets."""
CALLS = []


class Recorder:
    def __init__(self, rank):
        self.rank = rank

    def write(self, row):
        CALLS.append(("write", self.rank, row["kind"]))

    def checkpoints(self, timings):
        CALLS.append(("checkpoints", self.rank, len(timings)))

    def sync(self):
        CALLS.append(("sync", self.rank))

    def close(self):
        CALLS.append(("close", self.rank))


def open_sink(job, ctx):
    return Recorder(ctx.rank) if ctx.rank == 0 else None
'''


def test_a_sink_is_one_file_in_the_folder(tmp_path, monkeypatch, recording):
    import importlib

    folder = tmp_path / "more_sinks"
    folder.mkdir()
    (folder / "recorder.py").write_text(SINK_FILE)
    monkeypatch.setattr(metric_sinks, "__path__", [*metric_sinks.__path__, str(folder)])
    assert metric_sinks.sink_names() == ("mlflow", "prometheus", "recorder", "tensorboard")
    try:
        for rank in (0, 1):
            ctx = SimpleNamespace(rank=rank, local_dir=str(tmp_path / f"rank{rank}"), storage=None, in_ray=False,
                                  run_dir="")
            _script(metric_sinks.open_metrics(JOB, ctx))
        calls = importlib.import_module("training.metric_sinks.recorder").CALLS
    finally:
        sys.modules.pop("training.metric_sinks.recorder", None)
    assert calls == [("write", 0, "eval"), ("write", 0, "train"), ("write", 0, "train"), ("checkpoints", 0, 1),
                     ("sync", 0), ("checkpoints", 0, 1), ("write", 0, "summary"), ("close", 0)]
