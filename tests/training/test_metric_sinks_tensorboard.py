"""The TensorBoard sink (training/metric_sinks/tensorboard.py), read back with TensorBoard's own
reader (tensorboard 2.21.0 ``EventAccumulator``, in the tracking venv: tests/tracking_venv.py):
every figure of metrics.jsonl by step, the job config as text, the driver's verdict: the
fan-out's rows, mirrored from the worker's scratch folder into the run directory at each sync,
the run directory holding what metrics.jsonl holds after every sync (not only at close). A real
run: tests/training/test_tracking_real_run.py; in its shipped form: tests/e2e/test_submit_local.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tracking_venv import expected_scalars, last_by_step, read_events

from training import contract, metric_sinks
from training.metric_sinks.tensorboard import ACCEPTED_TAG, CONFIG_TAG, TEXT_SUFFIX, VERDICT_TAG, config_text

JOB = SimpleNamespace(name="local", run_name="r1", to_dict=lambda: {"name": "local", "train": {"max_steps": 4}},
                      train=SimpleNamespace(max_steps=4))
TRAIN = {"kind": "train", "lr": 1e-4, "grad_norm": 1.5, "tokens_per_s": 5123.25, "mfu": None,
         "peak_memory_gib": 0.75, "tokens_seen": 2048, "step_time_s": 0.4}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_same_figures(events: dict, rows: list[dict]) -> None:
    expected = expected_scalars(rows)
    assert expected  # the comparison compares something
    assert {tag: last_by_step(points) for tag, points in events["scalars"].items() if tag != ACCEPTED_TAG} == expected


def test_every_figure_by_step_reaches_the_run_directory_at_each_sync(tmp_path):
    ctx = SimpleNamespace(rank=0, local_dir=str(tmp_path / "scratch"), run_dir=str(tmp_path / "run"), storage=None,
                          in_ray=False)
    log = metric_sinks.open_metrics(JOB, ctx, names=("tensorboard",))  # and metrics.jsonl, always first
    log.sinks[0].stream = open("/dev/null", "w")
    log.write({"kind": "eval", "step": 0, "eval_loss": 4.5})
    for step in (1, 2):
        log.write({**TRAIN, "step": step, "loss": 3.0 - step / 4})
    log.sync()
    logdir = tmp_path / "run" / contract.TENSORBOARD_DIR
    _assert_same_figures(read_events(logdir), _rows(tmp_path / "scratch" / contract.METRICS_NAME))

    for step in (3, 4):
        log.write({**TRAIN, "step": step, "loss": 3.0 - step / 4})
    log.write({"kind": "eval", "step": 4, "eval_loss": 2.25})
    log.write({"kind": "summary", "steps": 4, "losses": [2.75, 2.5, 2.25, 2.0], "stopped_by_signal": False})
    log.close()
    metric_sinks.after_run(JOB, str(tmp_path / "run"), {"verdict": {"verdict": "rejected", "criterion": "eval_loss",
                                                                  "reason": "2.25 > 2.0"}})
    events = read_events(logdir)
    _assert_same_figures(events, _rows(tmp_path / "scratch" / contract.METRICS_NAME))
    assert events["scalars"]["train/loss"] == [[1, 2.75], [2, 2.5], [3, 2.25], [4, 2.0]]
    assert "train/mfu" not in events["scalars"]  # n/a on CPU: no point rather than a fake 0
    assert events["text"][CONFIG_TAG + TEXT_SUFFIX] == [[0, config_text(JOB.to_dict())]]
    assert events["text"][VERDICT_TAG + TEXT_SUFFIX] == [[4, "REJECTED (eval_loss): 2.25 > 2.0"]]
    assert events["scalars"][ACCEPTED_TAG] == [[4, 0.0]]


def test_other_ranks_write_no_events(tmp_path):
    ctx = SimpleNamespace(rank=1, local_dir=str(tmp_path / "scratch"), run_dir=str(tmp_path / "run"), storage=None,
                          in_ray=False)
    log = metric_sinks.open_metrics(JOB, ctx, names=("tensorboard",))
    assert log.sinks == []
    assert not (tmp_path / "scratch").exists()


def test_an_earlier_runs_event_file_in_the_scratch_folder_stays_out_of_this_run(tmp_path):
    """The scratch folder is keyed by the run's storage location (training/run_record.py
    ``scratch_key``): a local run reusing a name, or the demo's ``local`` on another clone of the
    same host, finds the earlier run's event file there. Before the fix ``sync`` mirrored every
    file of the folder, and TensorBoard showed both runs' losses as one run."""
    scratch = tmp_path / "scratch" / contract.TENSORBOARD_DIR
    scratch.mkdir(parents=True)
    (scratch / "events.out.tfevents.1700000000.host.worker").write_bytes(b"an earlier run's events")
    ctx = SimpleNamespace(rank=0, local_dir=str(tmp_path / "scratch"), run_dir=str(tmp_path / "run"), storage=None,
                          in_ray=False)
    log = metric_sinks.open_metrics(JOB, ctx, names=("tensorboard",))
    log.write({**TRAIN, "step": 1, "loss": 2.75})
    log.close()
    mirrored = sorted(p.name for p in (tmp_path / "run" / contract.TENSORBOARD_DIR).iterdir())
    assert len(mirrored) == 1 and "1700000000" not in mirrored[0], mirrored
