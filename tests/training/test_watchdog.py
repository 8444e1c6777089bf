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
    assert incidents.classify(error, alive) == kind


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


def test_no_hang_is_declared_while_ranks_register_within_the_first_step_bound_or_after_the_last_step(tmp_path):
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=8,
                              world_size=2, on_gpu=False)
    watch.attempt = 1
    state = {"attempt": 1, "ranks": {0: _rank(10, 3)}, "min_step_at": {1: 1.0, 2: 2.0, 3: 3.0}, "first_done": {},
             "heavy": [], "started": {1: 0.0}, "errors": {}}
    watch.check(state, now=500.0)  # one rank of two, within the first-step bound: still starting
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


def test_two_restarts_before_training_again_do_not_count_the_lost_time_twice(tmp_path):
    """A restart whose next attempt fails again before its first step (the bad node not yet
    replaced) leaves two incidents waiting; the first finished step resolves both. Ray Train 2.58
    restarts the whole group each time (``worker_group/state.py`` ``_shutdown_workers``, then a new
    group): the run lost ONE stretch of time, from the resumed step's first finish to training
    again; the incidents' losses must add up to it, not each claim all of it."""
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=True)
    died = {"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"], "text": "The actor died", "preempted": False}
    first = {"attempt": 1, "ranks": {0: _rank(10, 7), 1: _rank(11, 7)},
             "min_step_at": {s: 100.0 + 2 * s for s in range(1, 8)},
             "first_done": {s: 100.0 + 2 * s for s in range(1, 8)}, "heavy": [4], "started": {1: 90.0},
             "errors": {1: {1: died}}}
    watch.check(first, now=120.0)
    second = {**first, "attempt": 2, "ranks": {0: _rank(20, 4, 4), 1: _rank(21, 4, 4)}, "min_step_at": {},
              "started": {1: 90.0, 2: 140.0}}
    watch.check(second, now=141.0)
    watch.check({**second, "errors": {**first["errors"], 2: {1: died}}}, now=160.0)  # fails again, no step made
    third = {**second, "attempt": 3, "ranks": {0: _rank(30, 4, 4), 1: _rank(31, 4, 4)},
             "started": {1: 90.0, 2: 140.0, 3: 170.0}, "errors": {**first["errors"], 2: {1: died}}}
    watch.check(third, now=171.0)
    watch.check({**third, "min_step_at": {5: 180.0}}, now=181.0)
    entries = json.loads((tmp_path / "run" / "run.json").read_text())[contract.INCIDENTS]
    assert [e["resumed_from_step"] for e in entries] == [4, 4]
    # one stretch lost: step 4 first finished at 108, step 5 again at 180, less one step (2 s)
    assert sum(e["wall_lost_s"] for e in entries) == 70.0
    assert [e["wall_lost_s"] for e in entries] == [52.0, 18.0]  # each up to the next fault, the last to training again


def test_a_health_check_timeout_does_not_claim_the_unanswering_process_was_gone(tmp_path):
    """Ray Train 2.58 ``worker_group/worker_group.py`` ``_poll_workers_and_collect_errors``: a
    WorkerHealthCheckTimeoutError is raised for a poll that has HUNG past
    ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S`` (600 s): the process is alive (frozen, e.g. SIGSTOP,
    which the first steps' 900 s bound lets Ray see first); Ray then ``ray.kill``s it
    (``worker_group/state.py`` ``_shutdown_workers``). The record must not say it was gone."""
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=True)
    hung = {"classes": ["WorkerHealthCheckTimeoutError"], "text": "A worker health check has been hanging for 600.1 "
            "seconds. Marking the worker as dead.", "preempted": False}
    state = {"attempt": 1, "ranks": {0: _rank(10, 1), 1: _rank(11, 1)}, "min_step_at": {1: 100.0},
             "first_done": {1: 100.0}, "heavy": [], "started": {1: 90.0}, "errors": {1: {1: hung}}}
    watch.check(state, now=700.0)
    [entry] = record.data[contract.INCIDENTS]
    assert entry["kind"] == "health_check"
    assert not any("gone" in s for s in entry["saved"]), entry["saved"]


# --- a hang before the first step, probes in parallel (review of issue 50) ----------------------

def _info(pid: int) -> dict:
    """What a rank registers at worker start, before its model build: no step yet."""
    return {"pid": pid, "node_id": "n1", "actor_id": "", "host": "h", "node": "node-a", "stack_file": "/x",
            "start_step": None, "trace_prefix": ""}


class _Ref:
    def __init__(self, rank: int, kill: bool, answer: dict | None):
        self.rank, self.kill, self.answer = rank, kill, answer


class _ProbingWatchdog(watchdog.Watchdog):
    """The watchdog with its node tasks answered here: ``answers[rank]`` is what the probe task
    on that rank's node returns, ``None`` a node that never answers."""

    def __init__(self, answers: dict, **kw):
        super().__init__(**kw)
        self.answers, self.sent = answers, []

    def _on_node(self, info, *, kill):
        rank = next(r for r, a in self.answers.items() if a is not None and a.get("pid") == info["pid"]
                    or r == info.get("rank"))
        self.sent.append((rank, kill))
        answer = self.answers[rank]
        return _Ref(rank, kill, None if answer is None else ({"state": "gone", "killed": True} if kill else answer))


@pytest.fixture
def fake_ray(monkeypatch):
    """Models ray 2.58 ``python/ray/_private/worker.py``: ``ray.wait(refs, num_returns=, timeout=)``
    returns ``(ready, not_ready)`` once ``num_returns`` are ready or the timeout passes;
    ``ray.get(ref, timeout=)`` of one that never finishes raises ``GetTimeoutError``."""
    import ray
    from ray.exceptions import GetTimeoutError

    calls = {"wait": [], "get": []}

    def wait(refs, *, num_returns=1, timeout=None, **_):
        calls["wait"].append((len(refs), num_returns, timeout))
        ready = [r for r in refs if r.answer is not None]
        return ready, [r for r in refs if r.answer is None]

    def get(ref, *, timeout=None):
        calls["get"].append(timeout)
        if isinstance(ref, list):
            return [get(r, timeout=timeout) for r in ref]
        if ref.answer is None:
            raise GetTimeoutError("Get timed out: some object(s) not ready.")
        return ref.answer

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(watchdog.Watchdog, "_nodes_alive", lambda self: {})
    return calls


def _watch(tmp_path, answers: dict, world_size: int, max_steps: int = 16) -> tuple[_ProbingWatchdog, RunRecord]:
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    return _ProbingWatchdog(answers, run_name="j", run_dir=str(tmp_path / "run"), record=record,
                            max_steps=max_steps, world_size=world_size, on_gpu=False), record


def test_a_rank_stuck_before_its_first_step_or_never_registered_is_a_hang(tmp_path, fake_ray):
    """Rank 0 registered at worker start and sits in its restore (an S3 read, a DCP load waiting
    on a peer); rank 1 never registered. Once the first-step bound has passed since the attempt
    started, that is a hang naming both; only rank 0 (its pid is known) is probed and killed."""
    first = watchdog.floors()[2]
    watch, record = _watch(tmp_path, {0: {"pid": 10, "state": "S", "stack": "in restore"}, 1: None}, world_size=2)
    board = watchdog._Board()
    board.begin(0, _info(10), 100.0)
    watch.check(board.state(), now=100.0 + first - 1)  # still within the first-step bound: starting
    assert record.data[contract.INCIDENTS] == []
    watch.check(board.state(), now=100.0 + first + 1)
    [entry] = record.data[contract.INCIDENTS]
    assert entry["kind"] == incidents.HANG and entry["ranks"] == [0, 1]
    assert "rank 1: never registered" in entry["detail"] and "rank 0: no step yet" in entry["detail"]
    assert sorted(watch.sent) == [(0, False), (0, True)]  # never a probe of a rank without a pid
    assert (tmp_path / "run" / "incidents" / "1-hang" / "rank-0.txt").read_text() == "in restore"


def test_a_normal_first_step_within_the_bound_is_never_a_hang(tmp_path, fake_ray):
    """Both ranks register at worker start, restore within the bound, then make their first step:
    no hang at any look; the board's slowest-rank step ignores a rank with no step yet."""
    first = watchdog.floors()[2]
    watch, record = _watch(tmp_path, {0: {"pid": 10}, 1: {"pid": 11}}, world_size=2)
    board = watchdog._Board()
    board.begin(0, _info(10), 100.0)
    board.begin(1, _info(11), 101.0)
    watch.check(board.state(), now=100.0 + first - 10)
    board.restored(0, 10, 4, 100.0 + first - 5)  # restored step 4, late but within the bound
    board.step(0, 10, 5, False, 100.0 + first - 4)  # rank 1 has no step yet: it must not count
    assert board.state()["min_step_at"] == {5: 100.0 + first - 4}
    board.restored(1, 11, 4, 100.0 + first - 3)
    watch.check(board.state(), now=100.0 + first + 10)  # everyone started: the first step's bound runs
    board.step(1, 11, 5, False, 100.0 + first + 20)
    watch.check(board.state(), now=100.0 + first + 21)
    assert record.data[contract.INCIDENTS] == []
    assert watch.sent == []


def test_probes_wait_once_for_all_ranks_and_an_unanswering_rank_is_not_killed(tmp_path, fake_ray):
    """Three ranks stuck at step 7; rank 2's node never answers. All probes go out at once and one
    ``ray.wait`` bounds them (not PROBE_TIMEOUT_S per rank, under the watchdog's lock); rank 2 is
    recorded as giving no answer and no kill is sent to it."""
    answers = {0: {"pid": 10, "state": "S", "stack": "a"}, 1: {"pid": 11, "state": "T", "stack": "b"}, 2: None}
    watch, record = _watch(tmp_path, answers, world_size=3)
    watch.attempt = 1
    ranks = {r: {**_rank(10 + r, 7), "rank": r} for r in range(3)}
    state = {"attempt": 1, "ranks": ranks, "min_step_at": {s: 100.0 + 2 * s for s in range(1, 8)},
             "first_done": {}, "heavy": [], "started": {1: 90.0}, "errors": {}}
    watch.check(state, now=10_000.0)
    [entry] = record.data[contract.INCIDENTS]
    assert fake_ray["wait"] and fake_ray["wait"][0] == (3, 3, watchdog.PROBE_TIMEOUT_S)
    assert (2, True) not in watch.sent
    assert (1, True) in watch.sent  # the stopped one
    assert "rank 2: step 7, process no answer" in entry["detail"] and entry["ranks"] == [1, 2]
    assert "not killed" in entry["detail"]


def test_an_incident_resolves_when_the_next_attempt_registered_before_its_restore(tmp_path):
    """The ranks now register at worker start, before their restore: the watchdog may see the
    next attempt before any rank knows the step it resumes from; the incident must still resolve
    with it once the ranks restored and trained again."""
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=True)
    died = {"classes": ["WorkerHealthCheckFailedError", "ActorDiedError"], "text": "The actor died", "preempted": False}
    first = {"attempt": 1, "ranks": {0: _rank(10, 7), 1: _rank(11, 7)},
             "min_step_at": {s: 100.0 + 2 * s for s in range(1, 8)},
             "first_done": {s: 100.0 + 2 * s for s in range(1, 8)}, "heavy": [], "started": {1: 90.0},
             "errors": {1: {1: died}}}
    watch.check(first, now=120.0)
    board = watchdog._Board()
    board.attempt, board.first_done, board.errors = 1, dict(first["first_done"]), dict(first["errors"])
    board.ranks = {0: {**_rank(10, 7), "attempt": 1}, 1: {**_rank(11, 7), "attempt": 1}}
    board.begin(0, _info(20), 130.0)
    board.begin(1, _info(21), 130.0)
    watch.check(board.state(), now=131.0)  # the next attempt, not restored yet
    board.restored(0, 20, 4, 140.0)
    board.restored(1, 21, 4, 140.0)
    board.step(0, 20, 5, False, 150.0)
    board.step(1, 21, 5, False, 150.0)
    watch.check(board.state(), now=151.0)
    [entry] = record.data[contract.INCIDENTS]
    assert entry["resumed_from_step"] == 4 and entry["steps_lost"] == 3


# --- a lost node that Ray marks dead only after Ray Train restarted the group (issue 50) --------

@pytest.mark.parametrize("marked_dead_at", ["next attempt", "first step again", "end of the run"])
def test_a_worker_on_a_node_ray_marks_dead_later_is_recorded_as_that_node_lost(tmp_path, monkeypatch, marked_dead_at):
    """A node lost whole, as Ray 2.58 reports it when the node's processes vanish at once: Ray
    Train's next poll (``worker_group/worker_group.py`` ``_poll_workers_and_collect_errors``, every
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``) fails for the lost rank with a
    ``WorkerHealthCheckFailedError`` wrapping ``ActorUnavailableError`` while the GCS still lists the
    node ALIVE (it marks a node dead after its health check fails 5 times, 3 s apart: measured
    12 s in the chaos run). Ray Train then restarts the group and ``ray.kill``s every worker
    (``worker_group/state.py`` ``_shutdown_workers``), so the lost worker's actor ends with
    reason ``RAY_KILL``, not ``NODE_DIED``: the only record of the loss is the node, dead in
    ``ray.nodes()`` by the time the next attempt starts, or only once it trains again. The
    incident must end as ``node_lost`` of the rank on it, naming the Ray node."""
    record = RunRecord(str(tmp_path / "run"), environ={})
    record.start(job_config={"name": "j"}, is_infrastructure_check=False)
    watch = watchdog.Watchdog(run_name="j", run_dir=str(tmp_path / "run"), record=record, max_steps=16,
                              world_size=2, on_gpu=False)
    alive = {"head": True, "node-b": True, "node-c": True}
    monkeypatch.setattr(watchdog.Watchdog, "_nodes_alive", lambda self: dict(alive))
    monkeypatch.setattr(incidents, "death_reasons", lambda ranks: {})  # the lost worker's actor: RAY_KILL
    on = lambda pid, node_id, step, start=0: {**_rank(pid, step, start), "node_id": node_id}  # noqa: E731
    unavailable = {"classes": ["WorkerHealthCheckFailedError", "ActorUnavailableError"],
                   "text": "A worker health check failed.", "preempted": False}
    reset = {"classes": ["RuntimeError"], "text": "[gloo/transport/tcp/pair.cc:537] Read error: Connection reset "
             "by peer", "preempted": False}
    first = {"attempt": 1, "ranks": {0: on(10, "head", 7), 1: on(11, "node-b", 7)},
             "min_step_at": {s: 100.0 + 2 * s for s in range(1, 8)},
             "first_done": {s: 100.0 + 2 * s for s in range(1, 8)}, "heavy": [4], "started": {1: 90.0},
             "errors": {1: {0: reset, 1: unavailable}}}
    watch.check(first, now=120.0)
    [entry] = record.data[contract.INCIDENTS]
    assert (entry["kind"], entry["ranks"]) == ("worker_lost", [1])  # all that is known when Ray Train saw it
    if marked_dead_at == "next attempt":
        alive["node-b"] = False
    second = {**first, "attempt": 2, "ranks": {0: on(20, "head", 4, 4), 1: on(21, "node-c", 4, 4)},
              "min_step_at": {}, "started": {1: 90.0, 2: 140.0}}
    watch.check(second, now=141.0)
    if marked_dead_at == "first step again":
        alive["node-b"] = False
    trained = {**second, "min_step_at": {5: 150.0}}
    watch.check(trained, now=151.0)
    alive["node-b"] = False
    watch._state = lambda: trained  # the end: the driver's last look (no board here)
    watch.stop()
    [entry] = json.loads((tmp_path / "run" / "run.json").read_text())[contract.INCIDENTS]
    assert (entry["kind"], entry["ranks"], entry["nodes"]) == ("node_lost", [1], ["node-a"]), entry
    assert "node-b" in entry["detail"] and "worker_lost" in entry["detail"], entry["detail"]
    assert entry["resumed_from_step"] == 4 and entry["steps_lost"] == 3 and entry["progress_again_s"] == 30.0
