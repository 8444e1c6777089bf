"""The progress watchdog's decisions (training/watchdog.py) and the incidents they write
(training/incidents.py), from the board's state as the ranks and Ray Train's controller fill it.
The faults themselves, injected from outside real Ray runs, are tests/e2e/test_chaos.py."""
from __future__ import annotations

import json

import pytest

from training import contract, incidents, verdict, watchdog
from training.run_record import RunRecord


def test_the_bound_is_three_measured_steps_with_a_floor_and_room_for_a_heavy_step():
    # before two steps are measured: the first-step bound
    assert watchdog.hang_bound([5.0], [], next_is_heavy=False, first_step_s=900)[0] == 900
    # fast steps: the floor
    assert watchdog.hang_bound([0.5] * 10, [], next_is_heavy=False, floor_s=60)[0] == 60
    # slow steps: three of them (the median: one slow step does not move it)
    assert watchdog.hang_bound([100.0] * 9 + [1000.0], [], next_is_heavy=False, floor_s=60)[0] == 300
    # a step that also checkpoints or evaluates: a stated allowance until one was measured ...
    assert watchdog.hang_bound([0.5] * 10, [], next_is_heavy=True, floor_s=60, event_floor_s=300)[0] == 360
    # ... then three of the longest measured (a fast one does not lower the floor)
    bound, why = watchdog.hang_bound([0.5] * 10, [200.0], next_is_heavy=True, floor_s=60, event_floor_s=300)
    assert bound == 600 and "evaluating/checkpointing step 200.00 s" in why
    assert watchdog.hang_bound([0.5] * 10, [5.0], next_is_heavy=True, floor_s=60, event_floor_s=300)[0] == 60


def test_the_floors_come_from_the_environment_when_set(monkeypatch):
    monkeypatch.setenv(contract.ENV_HANG_FLOOR_S, "20")
    monkeypatch.setenv(contract.ENV_HANG_FIRST_STEP_S, "not a number")
    assert watchdog.floors() == (20.0, 20.0, watchdog.FIRST_STEP_S)


@pytest.mark.parametrize("error, alive, kind", [
    ({"classes": ["WorkerHealthCheckTimeoutError"]}, True, incidents.HEALTH_CHECK),
    ({"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"]}, True, incidents.WORKER_LOST),
    ({"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"]}, False, incidents.NODE_LOST),
    ({"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"], "preempted": True}, True, incidents.PREEMPTION),
    ({"classes": ["RuntimeError"]}, True, incidents.WORKER_ERROR),
])
def test_each_error_ray_train_saw_gets_its_kind(error, alive, kind):
    assert watchdog.classify(error, alive) == kind


def _rank(pid: int, step: int, start: int = 0) -> dict:
    return {"pid": pid, "node_id": "n1", "host": "h", "node": "node-a", "stack_file": "/x", "start_step": start,
            "step": step, "t": 0.0}


def test_a_lost_worker_becomes_one_incident_with_its_resume_and_cost(tmp_path):
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=True)
    first = {"attempt": 1, "ranks": {0: _rank(10, 7), 1: _rank(11, 7)},
             "min_step_at": {s: 100.0 + 2 * s for s in range(1, 8)},
             "first_done": {s: 100.0 + 2 * s for s in range(1, 8)}, "heavy": [4], "started": {1: 90.0},
             "errors": {}}
    watch.check(first, now=116.0)
    assert record.data[contract.INCIDENTS] == []  # progress, no error: nothing to record
    failed = {**first, "errors": {1: {1: {"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"],
                                          "text": "The actor died unexpectedly", "preempted": False}}}}
    watch.check(failed, now=120.0)
    watch.check(failed, now=122.0)  # Ray's note is seen once
    [entry] = record.data[contract.INCIDENTS]
    assert (entry["kind"], entry["ranks"], entry["nodes"], entry["step"]) == ("worker_lost", [1], ["node-a"], 7)
    assert entry["resumed_from_step"] is None  # not yet trained again
    # the next attempt restores step 4 and finishes its first step at t=150
    second = {**failed, "attempt": 2, "ranks": {0: _rank(20, 4, 4), 1: _rank(21, 4, 4)}, "min_step_at": {},
              "started": {1: 90.0, 2: 140.0}}
    watch.check(second, now=141.0)
    watch.check({**second, "min_step_at": {5: 150.0}}, now=151.0)
    [entry] = json.loads((tmp_path / "run" / "run.json").read_text())[contract.INCIDENTS]
    assert entry["resumed_from_step"] == 4 and entry["steps_lost"] == 3
    assert entry["progress_again_s"] == 30.0  # seen at 120, training again at 150
    # lost: from step 4's first finish (108) to the first step again (150), less one step (2 s)
    assert entry["wall_lost_s"] == 40.0 and entry["devices"] == 2
    assert entry["gpu_minutes_lost"] == entry["device_minutes_lost"] == round(2 * 40 / 60, 2)


def test_no_hang_is_declared_before_every_rank_registered_or_after_the_last_step(tmp_path):
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=8,
                              world_size=2, on_gpu=False)
    watch.attempt = 1
    state = {"attempt": 1, "ranks": {0: _rank(10, 3)}, "min_step_at": {1: 1.0, 2: 2.0, 3: 3.0}, "first_done": {},
             "heavy": [], "started": {1: 0.0}, "errors": {}}
    watch.check(state, now=10_000.0)  # one rank of two: still starting
    done = {**state, "ranks": {0: _rank(10, 8), 1: _rank(11, 8)}}
    watch.check(done, now=10_000.0)  # past the last step: evaluation and export, Ray's health check covers them
    assert record.data[contract.INCIDENTS] == []


def test_a_verdict_never_hides_an_incident(tmp_path):
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    entry = incidents.add(record, incidents.incident(incidents.HANG, ranks=[1], nodes=["node-b"], step=30,
                                                     detail="no step for 61 s"))
    incidents.resolved(record, entry, resumed_from_step=20, progress_again_s=74.2, wall_lost_s=95.0, devices=8,
                       on_gpu=True)
    final = record.finish(status="succeeded")
    assert final["verdict"]["verdict"] == verdict.ACCEPTED and final["verdict"]["incidents"] == 1
    assert "after 1 incident (1 hang)" in verdict.headline(final["verdict"])
    line = incidents.line(final[contract.INCIDENTS][0])
    assert "hang of rank 1 on node-b at step 30" in line and "resumed from step 20, 10 steps lost" in line
    assert "12.67 GPU-minutes lost" in line
    with pytest.raises(ValueError, match="incident kind: 'oops' is not allowed"):
        incidents.incident("oops")
