"""The job's Prometheus metrics through Ray's real metrics pipeline, and a quiet console.

ONE ``TorchTrainer.fit``: 2 Ray workers (FSDP2 on gloo) train a tiny Qwen2 for 8 steps,
checkpointing every 2, while a thread scrapes the node's metrics endpoint as Prometheus does on
EKS. The workers stay alive after training until one scrape holds every metric of every rank at
the last step, each equal to what rank 0 wrote to metrics.jsonl (the event, waited for with a
bound), so no assertion depends on when the scrapes fell. Ray's per-report lines must be in Ray
Train's log files and not on the console.

What a scrape is, in Ray 2.58 (read, and the reason for the rules below). A worker collects its
gauges one at a time (``CollectGaugeMetricValues`` per gauge, under one recorder lock, clearing
each value once exported: hence the sink's re-sets, training/metric_sinks/prometheus.py), so an
export that falls inside ``TrainingGauges.set`` splits one step's values from the one before.
The node's agent stores an export value by value (``reporter_agent.py`` ``Export`` ->
``set_metric_value``) while a scrape reads gauge by gauge, and evicts each series on its own
once two export intervals passed without news of it
(``ray/_private/telemetry/open_telemetry_metric_recorder.py``, ``_resolve_gauge_ttl_seconds``,
``_create_observable_callback``). So a scrape is not a transaction: it may hold only some of a
rank's series (seen in CI: a rank's step without its loss) and may mix two exports' values, a
second or more of steps apart. Mid-run scrapes are therefore checked gauge by gauge against the
steps the rank showed around them; the exact, whole check is the held last step.
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
    except OSError:  # not copied to storage yet (it is at each sync and at the end)
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
    assert watcher.callback_error is None, repr(watcher.callback_error)
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


def _mismatches(snapshots: list[dict], rows: list[dict], timings: list[tuple[float, float]]) -> list[str]:
    """The scrapes, in order, against metrics.jsonl ``rows`` and rank 0's checkpoint ``timings``:
    the values no logged figure explains.

    Gauge by gauge: a missing series is no disagreement (evicted on its own, or not yet
    exported), and a value must be that gauge's at a logged step between the steps the rank
    showed in the scrapes before and after, one step wider each way (a scrape mixes exports, an
    export splits a step). A gauge lagging at the end is caught by :func:`_final_and_logged`."""
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    evals = [r["eval_loss"] for r in rows if r["kind"] == "eval"]
    # per rank, the step each scrape showed (None: not there, or its step not); a rank can
    # first appear in a later scrape than the other
    ranks = {rank for snapshot in snapshots for rank in snapshot}
    shown = {rank: [int(snapshot[rank][contract.METRIC_STEP].value)
                    if contract.METRIC_STEP in snapshot.get(rank, {}) else None for snapshot in snapshots]
             for rank in ranks}
    wrong = []
    for i, snapshot in enumerate(snapshots):
        for rank, series in snapshot.items():
            value = {name: one.value for name, one in series.items()}
            if contract.METRIC_EVAL_LOSS in value:  # set first: the held-out loss before step 1
                if not any(value[contract.METRIC_EVAL_LOSS] == pytest.approx(e, rel=1e-9) for e in evals):
                    wrong.append(f"rank {rank}: eval loss {value[contract.METRIC_EVAL_LOSS]}, none of {evals}")
            # rank 0's own checkpoint timings are the record's (each rank times its own write);
            # stall and write are two gauges, so each is checked on its own
            for column, name in enumerate((contract.METRIC_CHECKPOINT_STALL, contract.METRIC_CHECKPOINT_WRITE)):
                if rank == "0" and name in value and not any(value[name] == pytest.approx(t[column], rel=1e-9) for t in timings):
                    wrong.append(f"rank 0: {name} = {value[name]}, none of {[t[column] for t in timings]}")
            steps = shown[rank]
            before = next((s for s in reversed(steps[:i]) if s is not None), min(train))
            if steps[i] is not None:
                before = min(before, steps[i])
            after = next((s for s in steps[i + 1:] if s is not None), max(train))
            if steps[i] is not None:
                after = max(after, steps[i])
            near = [_logged(train[s], rank) for s in range(before - 1, after + 2) if s in train]
            for name, one in value.items():
                if name in near[0] and not any(one == pytest.approx(logged[name], rel=1e-9) for logged in near):
                    wrong.append(f"rank {rank}: {name} = {one} in a scrape between steps {before} and {after}, "
                                 f"metrics.jsonl {[logged[name] for logged in near]}")
    return wrong


def test_scraped_values_equal_metrics_jsonl_at_the_same_step(scraped):
    _, watcher, rows, record, complete = scraped
    assert complete  # the exact check: one whole scrape at the last step equal to metrics.jsonl
    timings = [(c["stall_s"], c["write_s"]) for c in record["checkpoints"]]
    assert _mismatches(watcher.snapshots, rows, timings) == []


def test_a_partial_or_mixed_scrape_is_told_from_a_gauge_that_lags():
    """The rules of :func:`_mismatches` on made-up scrapes (no Ray): the partial scrape CI met
    (a rank's step without its loss; the check before this one raised ``KeyError``) and mixed
    ones pass; a loss from before the scrape that came before, or one never logged, does not;
    at the held last step a loss one step behind fails."""
    from devtools.metrics_scrape import Series

    def row(step):
        return {"kind": "train", "step": step, "loss": 10.0 - step, "lr": 0.1 * step, "grad_norm": 1.0 + step,
                "step_time_s": 1.0, "compute_s": 0.5, "tokens_per_s_per_device": 64.0, "tokens_per_s": 128.0,
                "tflops_per_device": 0.01, "peak_memory_gib": 0.5}

    rows = [row(s) for s in range(1, STEPS + 1)] + [{"kind": "eval", "step": 0, "eval_loss": 6.0}]
    at = {s: _logged(row(s), "1") for s in range(1, STEPS + 1)}

    def scrapes(*values: dict) -> list[dict]:
        return [{"1": {name: Series({}, v) for name, v in one.items()}} for one in values]

    def loss_of(step: int, shown: int) -> dict:
        return {**at[shown], contract.METRIC_LOSS: at[step][contract.METRIC_LOSS]}

    partial = {contract.METRIC_STEP: 2, contract.METRIC_LR: at[2][contract.METRIC_LR]}
    assert _mismatches(scrapes(partial), rows, []) == []
    # a rank that first appears in a later scrape (CI met it: the check indexed past its list)
    only_eval = {"0": {contract.METRIC_EVAL_LOSS: Series({}, 6.0)}}
    assert _mismatches([only_eval, *scrapes(at[2], at[3])], rows, []) == []
    assert len(_mismatches([only_eval, *scrapes(at[2], loss_of(7, 3), at[4])], rows, [])) == 1
    assert _mismatches(scrapes(at[2], at[3], at[5]), rows, []) == []
    assert _mismatches(scrapes(at[2], loss_of(4, 3), at[4]), rows, []) == []  # an export split step 4
    assert _mismatches(scrapes(at[2], loss_of(6, 3), at[6]), rows, []) == []  # two exports, three steps
    lagging = _mismatches(scrapes(at[4], loss_of(1, 5), at[6]), rows, [])
    assert len(lagging) == 1 and "raytrain_loss" in lagging[0], lagging
    assert len(_mismatches(scrapes({**at[3], contract.METRIC_LR: 123.0}), rows, [])) == 1
    timings = [(0.1, 0.2), (0.3, 0.4)]
    mixed = {"0": {contract.METRIC_CHECKPOINT_STALL: Series({}, 0.3), contract.METRIC_CHECKPOINT_WRITE: Series({}, 0.2)}}
    assert _mismatches([mixed], rows, timings) == []  # stall and write are two gauges
    unknown = {"0": {contract.METRIC_CHECKPOINT_STALL: Series({}, 0.5)}}
    assert len(_mismatches([unknown], rows, timings)) == 1

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
