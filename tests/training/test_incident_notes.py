"""run.json's ``attempts``, the preemption incidents and ``cost`` from the notes rank 0 leaves in
storage (training/incidents.py): the notes are written and read back through the real file layer;
the incidents have the one shape of training/incidents.py."""
from __future__ import annotations

import json

import pytest

from training import contract, incidents

A, B, C = "node-a", "node-b", "node-c"


def _start(time, world, nodes, resumed, reached=0):
    return {"note": "start", "time": time, "world_size": world, "nodes": nodes, "resumed_from_step": resumed,
            "reached_step": reached, "reached_time": None, "instance_type": "g6.12xlarge", "capacity_type": "spot"}


def test_notes_round_trip_in_order(tmp_path):
    incidents.write_note(str(tmp_path), "start", {"world_size": 4})
    incidents.write_note(str(tmp_path), "notice", {"saved": 8})
    assert [n["note"] for n in incidents.read_notes(str(tmp_path))] == ["start", "notice"]
    assert incidents.read_notes(str(tmp_path / "none")) == []


def test_a_notice_becomes_a_preemption_incident_completed_by_the_next_start():
    notes = [
        _start("2026-12-05T12:00:00+00:00", 4, {A: [0, 1], B: [2, 3]}, 0),
        {"note": "notice", "time": "2026-12-05T12:01:00+00:00", "saved": 8, "nodes": {B: [2, 3]},
         "checkpoint_s": 2.4, "world_size": 4},
        _start("2026-12-05T12:02:00+00:00", 2, {A: [0, 1]}, 8, 8),
        _start("2026-12-05T12:03:00+00:00", 4, {A: [0, 1], C: [2, 3]}, 12, 13),
    ]
    assert [a["world_size"] for a in incidents.attempts_of(notes)] == [4, 2, 4]
    [entry] = incidents.preemptions(notes, on_gpu=True)
    assert set(entry) == set(incidents.FIELDS) and entry["kind"] == incidents.PREEMPTION
    assert (entry["ranks"], entry["nodes"], entry["step"], entry["resumed_from_step"], entry["steps_lost"]) == (
        [2, 3], [B], 8, 8, 0)
    # 4 devices idle from the notice (12:01) to the next start (12:02)
    assert entry["gpu_minutes_lost"] == pytest.approx(4.0) and entry["device_minutes_lost"] == pytest.approx(4.0)
    assert incidents.preemptions(notes, on_gpu=False)[0]["gpu_minutes_lost"] == 0.0


def test_cost_by_type_and_capacity_with_spot_labelled_an_estimate():
    runs = [{"time": "2026-12-05T12:00:00+00:00", "nodes": {A: [0], B: [1]}, "instance_type": "g6.12xlarge",
             "capacity_type": "spot"},
            {"time": "2026-12-05T13:00:00+00:00", "nodes": {A: [0]}, "instance_type": "g6.12xlarge",
             "capacity_type": "spot"}]
    env = {contract.ENV_NODE_PRICE: "1.84", contract.ENV_PRICE_LABEL: "spot estimate (0.4 x, assumed)"}
    cost = incidents.cost_of(runs, end="2026-12-05T13:30:00+00:00", tokens=2_000_000,
                            incidents=[{"gpu_minutes_lost": 4.0, "device_minutes_lost": 4.0}], environ=env)
    [row] = cost["node_hours"]
    assert row["node_hours"] == pytest.approx(2.5) and row["usd"] == pytest.approx(4.6)
    assert cost["estimate"] and "estimate" in row["price"]
    assert cost["usd_per_1m_tokens"] == pytest.approx(2.3) and cost["gpu_minutes_lost"] == 4.0
    local = incidents.cost_of(runs[:1], end="2026-12-05T12:30:00+00:00", tokens=10, incidents=[], environ={})
    assert local["usd"] == 0.0 and local["price_label"] == incidents.LOCAL_PRICE_LABEL


def test_the_driver_summary_reads_the_notes_and_the_metrics(tmp_path):
    (tmp_path / contract.METRICS_NAME).write_text("\n".join(json.dumps(r) for r in (
        {"kind": "train", "step": 1, "time": 1.0}, {"kind": "train", "step": 2, "time": 2.0},
        {"kind": "eval", "step": 3})) + "\n")
    assert incidents.last_logged_step(str(tmp_path)) == (2, 2.0)
    incidents.write_note(str(tmp_path), "start", {k: v for k, v in _start("x", 2, {A: [0, 1]}, 0).items()
                                                 if k not in ("note", "time")})
    found = incidents.summarize(str(tmp_path), end="2099-01-01T00:00:00+00:00", on_gpu=False)
    assert found["preemptions"] == [] and len(found["attempts"]) == 1


def test_a_drain_is_one_incident_the_node_loss_after_its_notice_is_folded_into_the_preemption():
    """The drained node then leaves the cluster: the watchdog sees that as ``node_lost`` (by the
    Kubernetes node name; the notice names Ray node ids). One event: ONE incident, its
    device-minutes counted once in ``cost``; a fault before the notice stays its own."""
    notes = [
        _start("2026-12-05T12:00:00+00:00", 4, {A: [0, 1], B: [2, 3]}, 0),
        {"note": "notice", "time": "2026-12-05T12:01:00+00:00", "saved": 8, "nodes": {B: [2, 3]},
         "checkpoint_s": 2.4, "world_size": 4},
        _start("2026-12-05T12:02:00+00:00", 2, {A: [0, 1]}, 8, 8),
    ]
    earlier = incidents.incident(incidents.HANG, ranks=[1], nodes=["ip-10-0-0-6"], step=3, detail="no step",
                                 time="2026-12-05T12:00:20+00:00")
    earlier.update(device_minutes_lost=1.0, gpu_minutes_lost=1.0)
    lost = incidents.incident(incidents.NODE_LOST, ranks=[2, 3], nodes=["ip-10-0-0-7"], step=8,
                              detail="node left the cluster", time="2026-12-05T12:01:30+00:00")
    lost.update(resumed_from_step=8, steps_lost=0, wall_lost_s=60.0, devices=4, device_minutes_lost=4.0,
                gpu_minutes_lost=4.0)
    # the watchdog may also call a worker's death a preemption (Ray's ``preempted`` flag): the same event
    flagged = incidents.incident(incidents.PREEMPTION, ranks=[2], nodes=["ip-10-0-0-7"], step=8, detail="preempted",
                                 time="2026-12-05T12:01:40+00:00")
    flagged.update(device_minutes_lost=4.0, gpu_minutes_lost=4.0)
    found = incidents.preemptions(notes, on_gpu=True)
    merged = incidents.absorb([earlier, lost, flagged], found, notes)
    assert [i["kind"] for i in merged] == [incidents.HANG, incidents.PREEMPTION]
    assert "node_lost" in merged[1]["detail"] and merged[1]["device_minutes_lost"] == pytest.approx(4.0)
    cost = incidents.cost_of(incidents.attempts_of(notes), end="2026-12-05T12:03:00+00:00", tokens=10,
                            incidents=merged, environ={})
    assert cost["device_minutes_lost"] == pytest.approx(5.0)  # 1 (hang) + 4 (the drain), not 1 + 4 + 4
