"""The job's Prometheus metrics through Ray's real metrics pipeline, and a quiet console.

ONE ``TorchTrainer.fit``: 2 Ray workers (FSDP2 on gloo) train a tiny Qwen2 for 8 steps,
checkpointing every 2, while a thread scrapes the node's metrics endpoint as Prometheus does on
EKS. The workers stay alive after training until one scrape has held every metric of every
rank (the event, waited for with a bound), so no assertion depends on when the scrapes fell. Every scrape must agree with what rank 0 wrote to metrics.jsonl (and returned for run.json) for
the same step; Ray's per-report lines must be in Ray Train's log files and not on the console.
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


def _complete(snapshot: dict) -> bool:
    return {rank: set(series) for rank, series in snapshot.items()} == {"0": EXPECTED, "1": EXPECTED}


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

    def on_snapshot(snapshot: dict) -> None:
        if _complete(snapshot):
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
    run = Path(launch.run_dir(job))
    rows = [json.loads(line) for line in (run / contract.METRICS_NAME).read_text().splitlines() if line.strip()]
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
    # set at step 4, the checkpoint timings after each write ended): one scrape holds them all
    last = {rank: set(series) for rank, series in watcher.last.items()}
    assert complete and last == {"0": EXPECTED, "1": EXPECTED}, {r: EXPECTED - names for r, names in last.items()}


def test_scraped_values_equal_metrics_jsonl_at_the_same_step(scraped):
    _, watcher, rows, record, _ = scraped
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    evals = [r["eval_loss"] for r in rows if r["kind"] == "eval"]
    checked = 0
    for snapshot in watcher.snapshots:
        for rank, series in snapshot.items():
            value = {name: one.value for name, one in series.items()}
            if contract.METRIC_EVAL_LOSS in value:  # set first: the held-out loss before step 1
                assert any(value[contract.METRIC_EVAL_LOSS] == pytest.approx(e, rel=1e-9) for e in evals)
            if contract.METRIC_STEP not in value:
                continue
            row = train[int(value[contract.METRIC_STEP])]
            # the loss is the global-batch mean, the same on every rank; so are lr and grad norm
            assert value[contract.METRIC_LOSS] == pytest.approx(row["loss"], rel=1e-9)
            assert value[contract.METRIC_LR] == pytest.approx(row["lr"], rel=1e-9)
            assert value[contract.METRIC_GRAD_NORM] == pytest.approx(row["grad_norm"], rel=1e-9)
            if rank != "0":  # timings are each rank's own; metrics.jsonl holds rank 0's
                continue
            assert value[contract.METRIC_STEP_TIME] == pytest.approx(row["step_time_s"], rel=1e-9)
            assert value[contract.METRIC_COMPUTE_TIME] == pytest.approx(row["compute_s"], rel=1e-9)
            assert value[contract.METRIC_TOKENS_PER_S] == pytest.approx(row["tokens_per_s_per_device"], rel=1e-9)
            assert value[contract.METRIC_COMPUTE_TOKENS_PER_S] == pytest.approx(
                row["tokens_per_s"] / 2 * row["step_time_s"] / row["compute_s"], rel=1e-9)
            assert value[contract.METRIC_TFLOPS] == pytest.approx(row["tflops_per_device"], rel=1e-9)
            assert value[contract.METRIC_PEAK_MEMORY] == pytest.approx(row["peak_memory_gib"] * 2**30, rel=1e-9)
            if contract.METRIC_CHECKPOINT_STALL in value:
                timings = [(c["stall_s"], c["write_s"]) for c in record["checkpoints"]]
                assert (value[contract.METRIC_CHECKPOINT_STALL], value[contract.METRIC_CHECKPOINT_WRITE]) in [
                    pytest.approx(t, rel=1e-9) for t in timings]
            checked += 1
    assert checked


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
