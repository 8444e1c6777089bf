"""run.json's ``attempts``, ``incidents`` and ``cost`` from the notes rank 0 leaves in storage
(training/incidents.py): the notes are written and read back through the real file layer."""
from __future__ import annotations

import json

import pytest

from training import contract, incidents

A, B, C = "node-a", "node-b", "node-c"


def _note(run_dir, kind, **data):
    incidents.write_note(str(run_dir), kind, data)


def _start(time, world, nodes, resumed, reached, reached_time=None):
    return {"note": "start", "time": time, "world_size": world, "nodes": nodes, "resumed_from_step": resumed,
            "reached_step": reached, "reached_time": reached_time, "instance_type": "g6.12xlarge",
            "capacity_type": "spot"}


def test_notes_round_trip_in_order(tmp_path):
    _note(tmp_path, "start", world_size=4)
    _note(tmp_path, "notice", saved=8)
    assert [n["note"] for n in incidents.read_notes(str(tmp_path))] == ["start", "notice"]
    assert incidents.read_notes(str(tmp_path / "none")) == []


def test_a_notice_a_growth_and_a_node_lost_without_notice():
    notes = [
        _start("2026-12-05T12:00:00+00:00", 4, {A: [0, 1], B: [2, 3]}, 0, 0),
        {"note": "notice", "time": "2026-12-05T12:01:00+00:00", "saved": 8, "nodes": {B: [2, 3]}},
        _start("2026-12-05T12:02:00+00:00", 2, {A: [0, 1]}, 8, 8),
        _start("2026-12-05T12:03:00+00:00", 4, {A: [0, 1], C: [2, 3]}, 12, 13),
        _start("2026-12-05T12:05:00+00:00", 2, {A: [0, 1]}, 15, 17, reached_time=1796472240.0),
    ]
    attempts, found = incidents.incidents_from(notes, step_s=3.0)
    assert [a["world_size"] for a in attempts] == [4, 2, 4, 2]
    assert [tuple(i[k] for k in ("kind", "node", "rank", "saved", "resumed_from_step", "steps_lost")) for i in found] == [
        ("preemption", B, 2, 8, 8, 0), ("resize", None, None, None, 12, 1), ("node_lost", C, 2, None, 15, 2)]
    assert list(found[0]) == list(contract.INCIDENT_FIELDS)
    # 4 devices idle from the notice (12:01) to the next start (12:02), nothing done again
    assert found[0]["gpu_minutes_lost"] == pytest.approx(4.0)
    # 2 devices x (1 min gap + 1 step of 3 s done again)
    assert found[1]["gpu_minutes_lost"] == pytest.approx(2 * (60 + 3) / 60)


def test_cost_by_type_and_capacity_with_spot_labelled_an_estimate():
    attempts = [{"time": "2026-12-05T12:00:00+00:00", "nodes": {A: [0], B: [1]}, "instance_type": "g6.12xlarge",
                 "capacity_type": "spot"},
                {"time": "2026-12-05T13:00:00+00:00", "nodes": {A: [0]}, "instance_type": "g6.12xlarge",
                 "capacity_type": "spot"}]
    env = {contract.ENV_NODE_PRICE: "1.84", contract.ENV_PRICE_LABEL: "spot estimate (0.4 x, assumed)"}
    cost = incidents.cost_of(attempts, end="2026-12-05T13:30:00+00:00", tokens=2_000_000,
                             incidents=[{"gpu_minutes_lost": 4.0}], environ=env)
    [row] = cost["node_hours"]
    assert row["node_hours"] == pytest.approx(2.5) and row["usd"] == pytest.approx(4.6)
    assert cost["estimate"] and "estimate" in row["price"]
    assert cost["usd_per_1m_tokens"] == pytest.approx(2.3) and cost["gpu_minutes_lost"] == 4.0
    local = incidents.cost_of(attempts[:1], end="2026-12-05T12:30:00+00:00", tokens=10, incidents=[], environ={})
    assert local["usd"] == 0.0 and local["price_label"] == incidents.LOCAL_PRICE_LABEL


def test_the_driver_summary_reads_the_notes_and_the_metrics(tmp_path):
    (tmp_path / contract.METRICS_NAME).write_text("\n".join(json.dumps(r) for r in (
        {"kind": "train", "step": 1, "time": 1.0}, {"kind": "train", "step": 2, "time": 2.0},
        {"kind": "eval", "step": 3})) + "\n")
    assert incidents.last_logged_step(str(tmp_path)) == (2, 2.0)
    _note(tmp_path, "start", **{k: v for k, v in _start("x", 2, {A: [0, 1]}, 0, 0).items() if k not in ("note", "time")})
    summary = incidents.summarize(str(tmp_path), end="2099-01-01T00:00:00+00:00", tokens=100, step_s=None, environ={})
    assert summary[contract.INCIDENTS] == [] and len(summary["attempts"]) == 1
