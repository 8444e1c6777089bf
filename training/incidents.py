"""Incidents: what went wrong during a run, where, what was saved and what it cost.

Standard library only: the driver appends them to run.json (its only writer), the verdict
(training/verdict.py) counts them and the operator CLI (``report``, ``runs``) shows them with
this very code.

One incident per fault, appended once when it is seen and completed when the run is training
again (:func:`resolved`)::

    from training import incidents
    entry = incidents.incident(incidents.HANG, ranks=[1], nodes=["ip-10-0-0-7"], step=30,
                               detail="no step for 61 s (bound 60 s = max(3 x 0.9 s, floor 60 s))",
                               saved=["s3://bucket/runs/x/incidents/1-hang/rank-1.txt"])
    incidents.add(record, entry)                    # appended to run.json, written now
    incidents.resolved(record, entry, resumed_from_step=20, progress_again_s=74.2,
                       wall_lost_s=95.0, devices=8, on_gpu=True)

``add`` is the one way in (the spot helper appends its preemptions with it): a record never
holds an incident the verdict does not count.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from training import contract

HANG = "hang"
"""No rank made progress within the watchdog's bound (training/watchdog.py)."""
WORKER_LOST = "worker_lost"
"""A rank's process died (killed, OOM-killed, crashed in native code) on a node that is still up."""
NODE_LOST = "node_lost"
"""The node a rank ran on left the cluster (Ray marked it dead)."""
HEALTH_CHECK = "health_check"
"""Ray Train's own worker health check timed out (``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``)."""
WORKER_ERROR = "worker_error"
"""A rank raised an exception; Ray Train restarted the group."""
PREEMPTION = "preemption"
"""The node was drained or reclaimed (spot interruption, eviction)."""
KINDS = (HANG, WORKER_LOST, NODE_LOST, HEALTH_CHECK, WORKER_ERROR, PREEMPTION)
FIELDS = ("kind", "time", "ranks", "nodes", "step", "detail", "saved", "resumed_from_step", "steps_lost",
          "progress_again_s", "wall_lost_s", "devices", "gpu_minutes_lost", "device_minutes_lost")
"""Every key of an incident: ``time`` (ISO, UTC) when it was seen; ``ranks``/``nodes`` that
failed; ``step`` the furthest step any rank had finished; ``saved`` what was kept for diagnosis
(URIs); ``resumed_from_step`` the checkpoint step the next attempt restored (None: the run did
not go on); ``steps_lost`` = ``step`` - ``resumed_from_step``; ``progress_again_s`` from the fault
being seen to the next attempt's first finished step; ``wall_lost_s`` from the moment the
resumed step was first finished to that first step again, less one step (the run's time thrown
away); ``device_minutes_lost`` = ``devices`` x ``wall_lost_s`` / 60, and ``gpu_minutes_lost`` the
same on a GPU run (0 on CPU: no GPU was held)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def incident(kind: str, *, ranks: list[int] | None = None, nodes: list[str] | None = None, step: int | None = None,
             detail: str = "", saved: list[str] | None = None, time: str = "") -> dict[str, Any]:
    """A new incident (not yet resolved: its cost is known once the run trains again)."""
    if kind not in KINDS:
        raise ValueError(f"incident kind: {kind!r} is not allowed (allowed: {', '.join(KINDS)})")
    return {"kind": kind, "time": time or _now(), "ranks": sorted(ranks or []), "nodes": sorted(set(nodes or [])),
            "step": step, "detail": detail, "saved": list(saved or []), "resumed_from_step": None,
            "steps_lost": None, "progress_again_s": None, "wall_lost_s": None, "devices": None,
            "gpu_minutes_lost": None, "device_minutes_lost": None}


def add(record: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """Append ``entry`` to the record's incidents and write run.json now; returns the entry."""
    record.update(**{contract.INCIDENTS: [*(record.data.get(contract.INCIDENTS) or []), entry]})
    return entry


def resolved(record: Any, entry: dict[str, Any], *, resumed_from_step: int | None, progress_again_s: float | None,
             wall_lost_s: float | None, devices: int, on_gpu: bool) -> dict[str, Any]:
    """Complete ``entry`` (already added) with where the run went on and what the fault cost; rewrite run.json."""
    entry["resumed_from_step"] = resumed_from_step
    if resumed_from_step is not None and isinstance(entry.get("step"), int):
        entry["steps_lost"] = max(entry["step"] - resumed_from_step, 0)
    entry["progress_again_s"] = None if progress_again_s is None else round(progress_again_s, 1)
    entry["wall_lost_s"] = None if wall_lost_s is None else round(max(wall_lost_s, 0.0), 1)
    entry["devices"] = devices
    if wall_lost_s is not None:
        minutes = round(devices * max(wall_lost_s, 0.0) / 60, 2)
        entry["device_minutes_lost"] = minutes
        entry["gpu_minutes_lost"] = minutes if on_gpu else 0.0
    record.update(**{contract.INCIDENTS: list(record.data.get(contract.INCIDENTS) or [])})
    return entry


def of_record(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's incidents ([] for a record written before incidents existed)."""
    found = record.get(contract.INCIDENTS)
    return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []


def line(entry: dict[str, Any]) -> str:
    """One incident in one line: ``hang of rank 1 on node-a at step 30: ...; resumed from step 20,
    10 steps and 1.5 GPU-minutes lost, training again 74 s after``."""
    who = f"rank {', '.join(str(r) for r in entry.get('ranks') or []) or '?'}"
    where = f" on {', '.join(entry['nodes'])}" if entry.get("nodes") else ""
    at = f" at step {entry['step']}" if entry.get("step") is not None else ""
    text = f"{entry.get('kind', '?')} of {who}{where}{at}"
    if entry.get("detail"):
        text += f": {entry['detail']}"
    if entry.get("resumed_from_step") is not None:
        text += f"; resumed from step {entry['resumed_from_step']}"
        if entry.get("steps_lost") is not None:
            text += f", {entry['steps_lost']} steps lost"
        if entry.get("gpu_minutes_lost"):
            text += f", {entry['gpu_minutes_lost']} GPU-minutes lost"
        elif entry.get("device_minutes_lost") is not None:
            text += f", {entry['device_minutes_lost']} worker-minutes lost (CPU run)"
        if entry.get("progress_again_s") is not None:
            text += f", training again {entry['progress_again_s']:.0f} s after it was seen"
    else:
        text += "; the run did not go on after it"
    if entry.get("saved"):
        text += f"; saved: {', '.join(entry['saved'])}"
    return text


def summary(found: list[dict[str, Any]]) -> str:
    """``2 incidents (1 hang, 1 worker_lost)``; ``""`` for none."""
    if not found:
        return ""
    counts: dict[str, int] = {}
    for entry in found:
        counts[entry.get("kind", "?")] = counts.get(entry.get("kind", "?"), 0) + 1
    kinds = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    return f"{len(found)} incident{'s' if len(found) != 1 else ''} ({kinds})"
