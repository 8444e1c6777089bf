"""The gauges the loop sets (without Ray's exporter: a recording stand-in for ``Gauge``) and the
console handler the workers quiet. The real pipeline is tests/training/test_metrics_export.py."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from training import contract
from training import metrics
from training.metric_sinks import prometheus

ROW = {"kind": "train", "step": 7, "loss": 2.5, "lr": 1e-4, "grad_norm": 0.75, "tokens_per_s": 800.0,
       "tokens_per_s_per_device": 400.0, "tflops_per_device": 0.5, "mfu": None, "step_time_s": 2.0,
       "compute_s": 1.6, "peak_memory_gib": 1.5}


class RecordingGauge:
    made: list["RecordingGauge"] = []

    def __init__(self, name, description="", tag_keys=None):
        self.name, self.tag_keys, self.values, self.tags = name, tag_keys, [], None
        RecordingGauge.made.append(self)

    def set_default_tags(self, tags):
        self.tags = tags
        return self

    def set(self, value, tags=None):
        self.values.append(value)


@pytest.fixture
def gauges(monkeypatch):
    import ray.util.metrics

    RecordingGauge.made = []
    monkeypatch.setattr(ray.util.metrics, "Gauge", RecordingGauge)
    made = prometheus.for_worker(in_ray=True, run="r1", job="local", rank=1, refresh_s=0)
    return made, {g.name: g for g in RecordingGauge.made}


def test_step_values_of_a_metrics_row():
    values = prometheus.step_values(ROW)
    assert values[contract.METRIC_STEP] == 7
    assert values[contract.METRIC_TOKENS_PER_S] == 400.0
    assert values[contract.METRIC_COMPUTE_TOKENS_PER_S] == pytest.approx(500.0)  # 800 tokens / 1.6 s
    assert values[contract.METRIC_PEAK_MEMORY] == 1.5 * 2**30
    assert values[contract.METRIC_MFU] is None


def test_one_gauge_per_metric_labelled_run_job_rank_node(gauges):
    _, by_name = gauges
    assert set(by_name) == set(contract.PROMETHEUS_METRICS)
    for gauge in by_name.values():
        assert gauge.tag_keys == contract.METRIC_LABELS  # Ray requires a tuple
        assert gauge.tags[contract.LABEL_RUN] == "r1" and gauge.tags[contract.LABEL_JOB] == "local"
        assert gauge.tags[contract.LABEL_RANK] == "1" and gauge.tags[contract.LABEL_NODE]


def test_a_step_sets_its_figures_and_each_new_checkpoint_once(gauges):
    made, by_name = gauges
    first = SimpleNamespace(stall_s=0.2, write_s=1.5)
    made.step(ROW, [])
    made.step(ROW, [first])
    made.step(ROW, [first])  # the same checkpoint again: not set again
    assert by_name[contract.METRIC_LOSS].values == [2.5, 2.5, 2.5]
    assert by_name[contract.METRIC_MFU].values == []  # n/a on CPU: never set, never exported
    assert by_name[contract.METRIC_CHECKPOINT_STALL].values == [0.2]
    assert by_name[contract.METRIC_CHECKPOINT_WRITE].values == [1.5]
    made.evaluation({"kind": "eval", "step": 7, "eval_loss": 3.25})
    made.evaluation(None)
    assert by_name[contract.METRIC_EVAL_LOSS].values == [3.25]


def test_last_values_are_set_again_until_closed(monkeypatch):
    # Ray serves a gauge only for the interval in which it was set: the refresher re-sets each
    # last value (and nothing that was never set), until closed
    import threading

    import ray.util.metrics

    RecordingGauge.made = []
    monkeypatch.setattr(ray.util.metrics, "Gauge", RecordingGauge)
    made = prometheus.for_worker(in_ray=True, run="r", job="j", rank=0, refresh_s=0.01)
    by_name = {g.name: g for g in RecordingGauge.made}
    made.set({contract.METRIC_LOSS: 2.0})
    refreshed = threading.Event()
    for _ in range(1000):
        if len(by_name[contract.METRIC_LOSS].values) >= 3:
            refreshed.set()
            break
        threading.Event().wait(0.01)
    made.close()
    assert refreshed.is_set()
    assert set(by_name[contract.METRIC_LOSS].values) == {2.0}
    assert by_name[contract.METRIC_EVAL_LOSS].values == []


def test_the_refresh_is_half_of_rays_report_interval():
    assert prometheus.refresh_interval({}) == 5.0  # Ray's default: 10 s
    assert prometheus.refresh_interval({prometheus.REPORT_INTERVAL_ENV: "1000"}) == 0.5


def test_outside_ray_nothing_is_recorded():
    made = prometheus.for_worker(in_ray=False, run="r", job="j", rank=0)
    made.step(ROW, [SimpleNamespace(stall_s=1.0, write_s=2.0)])
    made.evaluation({"eval_loss": 1.0})
    assert not made.enabled


def test_quiet_console_keeps_the_file_handler(tmp_path):
    # given a root logger configured like Ray Train's worker (a console and a file handler),
    # after quieting an INFO record reaches the file only, a warning reaches both
    logger = logging.getLogger("raytrain-test-quiet")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    shown, filed = tmp_path / "console.txt", tmp_path / "file.txt"
    console_handler, file_handler = logging.FileHandler(shown), logging.FileHandler(filed)
    console_handler.set_name(metrics.CONSOLE_HANDLER)
    logger.handlers = [file_handler, console_handler]
    try:
        assert metrics.quiet_worker_console(logger) == 1
        logger.info("Reporting training result 1")
        logger.warning("a warning")
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers = []
    assert shown.read_text() == "a warning\n"
    assert filed.read_text() == "Reporting training result 1\na warning\n"


def test_a_restarted_rank_is_read_from_the_worker_furthest_along():
    # given the agent still serves a dead worker's series beside its replacement's (same rank,
    # another WorkerId), the scrape keeps the one at the later step
    from devtools.metrics_scrape import job_series, parse

    tags = 'run="r",job_name="j",node="n"'
    text = "\n".join([
        f'ray_raytrain_step{{WorkerId="old",rank="0",{tags}}} 9.0',
        f'ray_raytrain_loss{{WorkerId="old",rank="0",{tags}}} 3.0',
        f'ray_raytrain_step{{WorkerId="new",rank="0",{tags}}} 12.0',
        f'ray_raytrain_loss{{WorkerId="new",rank="0",{tags}}} 2.0',
        f'ray_raytrain_step{{WorkerId="w1",rank="1",{tags}}} 12.0',
        "ray_tasks 4.0", ""])
    series = job_series(parse(text))
    assert {rank: {name: s.value for name, s in by_name.items()} for rank, by_name in series.items()} == {
        "0": {contract.METRIC_STEP: 12.0, contract.METRIC_LOSS: 2.0}, "1": {contract.METRIC_STEP: 12.0}}


def test_the_scrape_of_a_run_ignores_the_series_another_run_left_on_the_node():
    # given the node's agent still serves a finished run's series beside this run's, a scrape
    # for this run keeps only its own; without a run it keeps what is furthest along
    from devtools.metrics_scrape import job_series, parse

    text = "\n".join([
        'ray_raytrain_step{WorkerId="a",rank="0",run="earlier",job_name="j",node="n"} 40.0',
        'ray_raytrain_step{WorkerId="b",rank="0",run="this",job_name="j",node="n"} 3.0',
        'ray_raytrain_loss{WorkerId="b",rank="0",run="this",job_name="j",node="n"} 5.0', ""])
    mine = job_series(parse(text), "this")
    assert {rank: {name: s.labels["run"] for name, s in by_name.items()} for rank, by_name in mine.items()} == {
        "0": {contract.METRIC_STEP: "this", contract.METRIC_LOSS: "this"}}
    assert job_series(parse(text))["0"][contract.METRIC_STEP].labels["run"] == "earlier"


def test_the_last_scrape_of_a_rank_is_one_that_held_all_its_per_step_gauges():
    # given a worker whose series leave the endpoint one metric at a time as it exits (the
    # agent drops each at its own age), the last scrape holding only its step does not
    # replace the last complete one
    from devtools.metrics_scrape import EVERY_STEP, Series, Watcher

    full = {name: Series({"rank": "0"}, 1.0) for name in EVERY_STEP}
    partial = {contract.METRIC_STEP: Series({"rank": "0"}, 2.0)}
    watcher = Watcher(url="http://127.0.0.1:9/metrics", snapshots=[{"0": full}, {"0": partial}])
    assert watcher.last == {"0": full}
    assert Watcher(url="", snapshots=[{"0": partial}]).last == {"0": partial}  # nothing better seen


def test_a_watcher_whose_callback_raises_keeps_the_error_and_stops_scraping():
    # given a callback that raises (a test's wait condition reading a file), the watcher keeps
    # the error for its caller instead of dying silently and leaving the caller to time out
    import http.server
    import threading

    from devtools.metrics_scrape import Watcher

    body = b'ray_raytrain_step{WorkerId="w",rank="0",run="r",job_name="j",node="n"} 1.0\n'

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    called = threading.Event()

    def on_snapshot(snapshot):
        called.set()
        raise ValueError("a half-written line")

    try:
        with Watcher(f"http://127.0.0.1:{server.server_port}/metrics", interval_s=0.05, on_snapshot=on_snapshot) as watcher:
            assert called.wait(60)
            watcher._thread.join(60)  # the scraping ended with the error
            assert not watcher._thread.is_alive()
    finally:
        server.shutdown()
    assert isinstance(watcher.callback_error, ValueError) and len(watcher.snapshots) == 1
