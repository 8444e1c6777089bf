"""The job's Prometheus metrics through Ray's real metrics pipeline, and a quiet console.

ONE ``TorchTrainer.fit``: 2 Ray workers (FSDP2 on gloo) train a tiny Qwen2 for 8 steps,
checkpointing every 2, while a thread scrapes the node's metrics endpoint as Prometheus does on
EKS. The workers stay alive after training until one scrape holds every metric of every rank at
the last step, each equal to what rank 0 wrote to metrics.jsonl (the event, waited for with a
bound), so no assertion depends on when the scrapes fell. Ray's per-report lines must be in Ray
Train's log files and not on the console.

What a scrape is, in Ray 2.58 (read, and the reason for the rules below): a worker's exporter
reads each gauge under that gauge's own lock, and the node's agent keeps each series for two
export intervals after it last heard of it, evicting series one metric at a time at a scrape
(``ray/_private/telemetry/open_telemetry_metric_recorder.py``, ``_resolve_gauge_ttl_seconds``
and ``_create_observable_callback``). So a scrape is not a transaction: it may hold only some of
a rank's series (seen in CI: a rank's step without its loss), and one that falls while a rank
sets its gauges may mix two steps' values. Mid-run scrapes are therefore checked gauge by gauge,
against the step shown or one beside it; the exact, whole check is the held last step.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tiny_qwen import tiny_qwen2_config
from training import contract
from training.config import job_config_from_dict

pytestmark = pytest.mark.slow
STEPS = 8
REPORT_LINE = "Reporting training result"


def _job(storage: str):
    return job_config_from_dict({
        "name": "metrics-test",
        "model": {"config": tiny_qwen2_config()},
        "data": {"kind": "synthetic"},
        "train": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 4, "max_steps": STEPS,
                  "lr": 1e-3, "warmup_steps": 1, "report_every_n_steps": 2},
        "parallel": {"strategy": "full_shard", "num_workers": 2, "workers_per_node": 2},
        "checkpoint": {"storage_path": storage, "every_n_steps": 2, "export_hf": False},
        "eval": {"every_n_steps": 4, "max_batches": 2},
    }, "test")


HOLD_LIMIT_S = 180
"""The longest the workers wait, after training, for the scrapes to have seen everything."""
# MFU has no peak to compare with on CPU: never set, so never exported
EXPECTED = set(contract.PROMETHEUS_METRICS) - {contract.METRIC_MFU}


def _held_worker(config: dict) -> dict | None:
    """The real worker entry, then held alive (its gauges stay served) until the test has seen
    every metric of every rank in one scrape, or :data:`HOLD_LIMIT_S` passed."""
    import time

    from training.loop import train_loop_per_worker

    returned = train_loop_per_worker(config)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not os.path.exists(config["release"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # a file written by the test process: the only signal both share here
    return returned


GLOBAL = (contract.METRIC_STEP, contract.METRIC_LOSS, contract.METRIC_LR, contract.METRIC_GRAD_NORM)
"""The gauges every rank sets to the same value (the global-batch figures); metrics.jsonl holds
rank 0's timings, so only these are compared for the other rank."""


def _logged(row: dict, rank: str) -> dict[str, float]:
    """What rank ``rank``'s per-step gauges must hold after the step of metrics.jsonl ``row``,
    computed here from the row's own fields (the sink's ``step_values`` is what is under test)."""
    values = {
        contract.METRIC_STEP: row["step"],
        contract.METRIC_LOSS: row["loss"],
        contract.METRIC_LR: row["lr"],
        contract.METRIC_GRAD_NORM: row["grad_norm"],
        contract.METRIC_STEP_TIME: row["step_time_s"],
        contract.METRIC_COMPUTE_TIME: row["compute_s"],
        contract.METRIC_TOKENS_PER_S: row["tokens_per_s_per_device"],
        # per-device tokens over compute seconds: the run's rate over 2 devices, scaled by wall/compute
        contract.METRIC_COMPUTE_TOKENS_PER_S: row["tokens_per_s"] / 2 * row["step_time_s"] / row["compute_s"],
        contract.METRIC_TFLOPS: row["tflops_per_device"],
        contract.METRIC_PEAK_MEMORY: row["peak_memory_gib"] * 2**30,
    }
    return values if rank == "0" else {name: values[name] for name in GLOBAL}


def _read_rows(path: Path) -> list[dict]:
    """metrics.jsonl as far as it is written (rank 0 appends while the test reads)."""
    try:
        lines = path.read_text().split("\n")[:-1]  # the last piece may be a line still being written
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _final_and_logged(snapshot: dict, rows: list[dict]) -> bool:
    """Every rank's every metric in this one scrape, at the last step, each per-step value equal
    to metrics.jsonl's for that step and the held-out loss to its last evaluation's."""
    train = [r for r in rows if r["kind"] == "train" and r["step"] == STEPS]
    evals = [r["eval_loss"] for r in rows if r["kind"] == "eval"]
    if not train or not evals or set(snapshot) != {"0", "1"}:
        return False
    for rank, series in snapshot.items():
        if set(series) != EXPECTED:
            return False
        value = {name: one.value for name, one in series.items()}
        if value[contract.METRIC_EVAL_LOSS] != pytest.approx(evals[-1], rel=1e-9):
            return False
        if any(value[name] != pytest.approx(v, rel=1e-9) for name, v in _logged(train[-1], rank).items()):
            return False
    return True


@pytest.fixture(scope="module")
def scraped(ray_cluster, tmp_path_factory):
    import ray

    from devtools.metrics_scrape import Watcher, report
    from training import launch, loop

    [node] = [n for n in ray.nodes() if n["Alive"]]
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    job = _job(str(tmp_path_factory.mktemp("storage")))
    release = tmp_path_factory.mktemp("release") / "seen-everything"
    seen_everything = threading.Event()
    metrics = Path(launch.run_dir(job)) / contract.METRICS_NAME

    def on_snapshot(snapshot: dict) -> None:
        if not seen_everything.is_set() and _final_and_logged(snapshot, _read_rows(metrics)):
            seen_everything.set()
            release.touch()  # the workers may exit now

    # The workers cannot import this test module: they get _held_worker by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "train_loop_per_worker", _held_worker)  # build_trainer takes it from there
        trainer = launch.build_trainer(job)
    trainer.train_loop_config["release"] = str(release)
    # This run's series only: the session's cluster served other tests' runs, and the node's
    # agent keeps a finished worker's series for a while.
    with Watcher(url, interval_s=0.5, run=job.run_name, on_snapshot=on_snapshot) as watcher:
        result = trainer.fit()
    assert result.error is None
    rows = _read_rows(metrics)
    record = result.return_value[contract.WORKER_FACTS]  # rank 0's run.json fields
    print("\n".join(report(watcher, rows)))  # what the demo prints (pytest -s shows it)
    return job, watcher, rows, record, seen_everything.is_set()


def test_every_metric_is_scraped_for_every_rank_with_its_labels(scraped):
    job, watcher, _, _, complete = scraped
    assert watcher.snapshots, f"no scrape held the job's metrics ({watcher.scrapes} scrapes, {watcher.errors} errors)"
    seen: dict[str, set[str]] = {}
    for snapshot in watcher.snapshots:
        for rank, series in snapshot.items():
            seen.setdefault(rank, set()).update(series)
            for one in series.values():
                assert one.labels[contract.LABEL_RUN] == job.run_name
                assert one.labels[contract.LABEL_JOB] == job.name
                assert one.labels[contract.LABEL_RANK] == rank
                assert one.labels[contract.LABEL_NODE]
                assert "step" not in one.labels  # one series per rank, not per step
    assert seen == {"0": EXPECTED, "1": EXPECTED}
    # every value stays served, not only in the interval it was set in (the held-out loss was
    # set at step 4, the checkpoint timings after each write ended): one scrape held them all,
    # at the last step and equal to metrics.jsonl
    last = {rank: {"step": series[contract.METRIC_STEP].value if contract.METRIC_STEP in series else None,
                   "missing": sorted(EXPECTED - set(series))} for rank, series in watcher.last.items()}
    assert complete, f"no scrape held every metric of both ranks at step {STEPS}, equal to metrics.jsonl; last: {last}"


def _mismatches(snapshot: dict, rows: list[dict], timings: list[tuple[float, float]]) -> tuple[list[str], int]:
    """One scrape against metrics.jsonl ``rows`` and rank 0's checkpoint ``timings``: the gauges
    that disagree, and how many ranks' series agreed exactly with the step they show.

    Gauge by gauge: a missing series is no disagreement (evicted on its own, or not yet
    exported), and a value may be the step's or a step beside it (the scrape fell while the rank
    set its gauges). A gauge a whole step behind or ahead of the rest is not allowed past the
    last step, which :func:`_final_and_logged` checks whole."""
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    evals = [r["eval_loss"] for r in rows if r["kind"] == "eval"]
    wrong, exact = [], 0
    for rank, series in snapshot.items():
        value = {name: one.value for name, one in series.items()}
        if contract.METRIC_EVAL_LOSS in value:  # set first: the held-out loss before step 1
            if not any(value[contract.METRIC_EVAL_LOSS] == pytest.approx(e, rel=1e-9) for e in evals):
                wrong.append(f"rank {rank}: eval loss {value[contract.METRIC_EVAL_LOSS]}, none of {evals}")
        # rank 0's own checkpoint timings are the record's (each rank times its own write)
        if rank == "0" and contract.METRIC_CHECKPOINT_STALL in value and contract.METRIC_CHECKPOINT_WRITE in value:
            pair = (value[contract.METRIC_CHECKPOINT_STALL], value[contract.METRIC_CHECKPOINT_WRITE])
            if pair not in [pytest.approx(t, rel=1e-9) for t in timings]:
                wrong.append(f"rank 0: checkpoint timings {pair}, none of {timings}")
        if contract.METRIC_STEP not in value:
            continue
        step = int(value[contract.METRIC_STEP])
        logged = _logged(train[step], rank)
        near = [logged, *(_logged(train[s], rank) for s in (step - 1, step + 1) if s in train)]
        for name, expected in logged.items():
            if name in value and not any(value[name] == pytest.approx(one[name], rel=1e-9) for one in near):
                wrong.append(f"rank {rank}: {name} = {value[name]} at step {step}, metrics.jsonl {expected}")
        exact += all(value.get(name) == pytest.approx(v, rel=1e-9) for name, v in logged.items())
    return wrong, exact


def test_scraped_values_equal_metrics_jsonl_at_the_same_step(scraped):
    _, watcher, rows, record, complete = scraped
    assert complete  # the exact check: one whole scrape at the last step equal to metrics.jsonl
    timings = [(c["stall_s"], c["write_s"]) for c in record["checkpoints"]]
    exact = 0
    for snapshot in watcher.snapshots:
        wrong, agreed = _mismatches(snapshot, rows, timings)
        assert not wrong
        exact += agreed
    assert exact


def test_a_partial_or_torn_scrape_is_told_from_a_gauge_that_lags():
    """The rules of :func:`_mismatches` on made-up scrapes (no Ray): the partial scrape CI met
    (a rank's step without its loss; the check before this one raised ``KeyError``) and a torn
    one pass; a loss one step behind at the last step, or two steps behind mid-run, does not."""
    from devtools.metrics_scrape import Series

    def row(step):
        return {"kind": "train", "step": step, "loss": 10.0 - step, "lr": 0.1 * step, "grad_norm": 1.0 + step,
                "step_time_s": 1.0, "compute_s": 0.5, "tokens_per_s_per_device": 64.0, "tokens_per_s": 128.0,
                "tflops_per_device": 0.01, "peak_memory_gib": 0.5}

    rows = [row(s) for s in range(1, STEPS + 1)] + [{"kind": "eval", "step": 0, "eval_loss": 6.0}]

    def scrape(values: dict) -> dict:
        return {"1": {name: Series({}, v) for name, v in values.items()}}

    at = {s: _logged(row(s), "1") for s in range(1, STEPS + 1)}
    partial = {contract.METRIC_STEP: 2, contract.METRIC_LR: at[2][contract.METRIC_LR]}
    assert _mismatches(scrape(partial), rows, []) == ([], 0)
    assert _mismatches(scrape(at[3]), rows, []) == ([], 1)
    torn = {**at[3], contract.METRIC_LOSS: at[4][contract.METRIC_LOSS]}
    assert _mismatches(scrape(torn), rows, []) == ([], 0)
    lagging = {**at[4], contract.METRIC_LOSS: at[2][contract.METRIC_LOSS]}
    assert len(_mismatches(scrape(lagging), rows, [])[0]) == 1

    # the held last step is checked whole: it passes as logged, and a loss one step behind fails
    events = {contract.METRIC_EVAL_LOSS: 6.0, contract.METRIC_CHECKPOINT_STALL: 0.1, contract.METRIC_CHECKPOINT_WRITE: 0.2}

    def held(loss_step: int) -> dict:
        out = {}
        for rank in ("0", "1"):
            values = {**_logged(row(STEPS), "0"), **events}  # rank 1 serves its own timings
            values[contract.METRIC_LOSS] = row(loss_step)["loss"]
            out[rank] = {name: Series({}, v) for name, v in values.items()}
        return out

    assert _final_and_logged(held(STEPS), rows)
    assert not _final_and_logged(held(STEPS - 1), rows)
    assert not _final_and_logged({"0": held(STEPS)["0"]}, rows)  # a rank missing


def test_ray_trains_own_checkpoint_timers_are_served_too(scraped):
    # the training dashboard's upload panel reads these Ray Train metrics
    _, watcher, _, _, _ = scraped
    assert {"ray_train_checkpoint_transfer_total_time_s", "ray_train_report_total_blocked_time_s"} <= watcher.other_names


def test_reports_go_to_ray_trains_log_files_not_the_console(scraped):
    import ray

    job, _, _, _, _ = scraped
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    ours = set()
    for path in (logs / "train").glob("ray-train-app-worker-*.log"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if any(r.get("run_name") == job.run_name and REPORT_LINE in r.get("message", "") for r in records):
            ours.add(path.name.removeprefix("ray-train-app-worker-").removesuffix(".log"))
    assert len(ours) == 2  # both workers' report lines are in their log files
    console = [p for worker in ours for p in logs.glob(f"worker-{worker}-*") if p.suffix in (".out", ".err")]
    assert console
    text = "".join(p.read_text(errors="replace") for p in console)
    assert REPORT_LINE not in text
    assert f"step {STEPS}/{STEPS} |" in text  # the job's own progress line still reaches the console
