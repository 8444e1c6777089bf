"""Incidents: what went wrong during a run, where, what was saved and what it cost.

Standard library only (but :func:`death_reasons`, which reads Ray's record when called): the
driver appends them to run.json (its only writer), the verdict (training/verdict.py) counts them
and the operator CLI (``report``, ``runs``) shows them with this very code.

One incident per fault, appended once when it is seen and completed when the run is training
again (:func:`resolved`)::

    from training import incidents
    entry = incidents.incident(incidents.HANG, ranks=[1], nodes=["ip-10-0-0-7"], step=30,
                               detail="no step for 61 s (bound 60 s = max(3 x 0.9 s, floor 60 s))",
                               saved=["s3://bucket/runs/x/incidents/1-hang/rank-1.txt"])
    incidents.add(record, entry)                    # appended to run.json, written now
    incidents.resolved(record, entry, resumed_from_step=20, progress_again_s=74.2,
                       wall_lost_s=95.0, devices=8, on_gpu=True)

``add`` is the one way in (the spot helper's preemptions come in through training/incidents.py
``absorb``, which folds the node loss that follows a drain notice into that one preemption): a
record never holds an incident the verdict does not count, nor one event twice.

The run's worker groups and its cost come from the same place.
The driver is run.json's only writer, but it does not see Ray Train's restarts (a lost node, a
drain, an elastic resize happen inside the controller). So rank 0 of every worker group leaves a
small note in the run's storage, ``<run>/attempts/``:

- ``start``: when the group started, its size, which Ray node holds which ranks, the step it
  resumed from, and the last step the run had logged before it (from ``metrics.jsonl``);
- ``notice``: a node drain's notice, the step checkpointed on it and how long that took.

At the end the driver turns the notes into run.json's ``attempts``, one ``preemption`` incident
per notice (through :func:`add`'s shape) and ``cost`` (:func:`cost_of`).
Every other fault (a lost node, a hang, a dead worker, a node failing the health gate) is the
progress watchdog's (training/watchdog.py): it gathers the evidence, and :func:`name_fault` here
names the fault from it (why a worker died: the errors Ray Train saw, Ray's own record of the
death). Standard library only at import: :func:`death_reasons` asks Ray's state API when called
(the driver's watchdog only), so the CLI and the verdict import this module without Ray.

"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Mapping

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
HEALTH_GATE = "health_gate"
"""A node failed the health gate at an attempt's start (training/health_gate.py ``judge_gate``: a
slow GEMM or GPU memory errors): named, and kept out of the next attempt."""
KINDS = (HANG, NODE_LOST, WORKER_LOST, HEALTH_CHECK, WORKER_ERROR, PREEMPTION, HEALTH_GATE)
"""Every kind, the one that explains a fault best first (training/watchdog.py names a fault by
the first kind its evidence shows): a worker that died with the node under it was lost with
that node, so ``node_lost`` outranks ``worker_lost``."""
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


# --- naming a fault: why a worker died, from what Ray recorded --------------------------------
# The progress watchdog (training/watchdog.py) gathers the evidence (the errors Ray Train saw,
# Ray's node list, the worker actors' death causes); these name the fault it is.

def describe_error(err: BaseException) -> dict[str, Any]:
    """What a worker error says: its class chain, first line, and Ray's ``preempted`` flag
    (ray 2.58 ``worker_group/poll.py`` ``_is_preempted_actor``)."""
    inner = getattr(err, "health_check_failure", None)
    chain = [type(err).__name__] + ([type(inner).__name__] if inner is not None else [])
    text = str(err).strip().splitlines()
    return {"classes": chain, "text": text[0][:400] if text else "",
            "preempted": bool(getattr(inner if inner is not None else err, "preempted", False))}


DEATH_KINDS = {"NODE_DIED": NODE_LOST, "WORKER_DIED": WORKER_LOST}
"""Ray's own reason a worker actor died (ray 2.58 ``common.proto`` ``ActorDiedErrorContext.Reason``,
read through the state API's ``death_cause``): the evidence that outranks the errors the other
ranks raised (a rank whose peer vanished fails its collective at once, often before Ray's poll
has seen the vanished one). ``RAY_KILL`` is Ray Train tearing the group down: no evidence."""


def death_reasons(ranks: dict[int, dict[str, Any]]) -> dict[int, str]:
    """``{rank: reason}`` of the ranks whose worker actor Ray records as dead, where it says why."""
    from ray.util.state import get_actor

    found = {}
    for rank, info in ranks.items():
        if not info.get("actor_id"):
            continue
        try:
            actor = get_actor(info["actor_id"], timeout=10)
            cause = (getattr(actor, "death_cause", None) or {}) if actor is not None else {}
        except Exception:  # noqa: BLE001 - no state API here: the errors alone decide
            continue
        reason = (cause.get("actor_died_error_context") or {}).get("reason")
        if reason in DEATH_KINDS:
            found[int(rank)] = reason
    return found


def classify(error: dict[str, Any], node_alive: bool) -> str:
    """The incident kind of one error Ray Train saw on a rank."""
    classes = " ".join(error.get("classes", []))
    if "WorkerHealthCheckTimeoutError" in classes:
        return HEALTH_CHECK
    if error.get("preempted"):
        return PREEMPTION
    if not node_alive:
        return NODE_LOST
    if "ActorDied" in classes or "RayActorError" in classes or "WorkerHealthCheckFailedError" in classes:
        return WORKER_LOST
    return WORKER_ERROR


def name_fault(ranks: dict[int, dict[str, Any]], errors: dict[int, dict[str, Any]], *, alive: dict[str, bool],
               deaths: dict[int, str]) -> tuple[str, list[int]]:
    """The kind of one fault and the ranks it names: Ray's record of a worker's death first
    (``deaths``, :func:`death_reasons`), then the errors Ray Train saw (:func:`classify`, a rank on
    a node ``alive`` does not list as alive lost with its node); the kind that explains it best
    (:data:`KINDS`' order) wins."""
    kinds = {int(r): classify(e, alive.get(ranks.get(int(r), {}).get("node_id"), True)) for r, e in errors.items()}
    kinds.update({r: DEATH_KINDS[reason] for r, reason in deaths.items()})
    kind = min(kinds.values(), key=KINDS.index)
    return kind, sorted(r for r, k in kinds.items() if k == kind)


def ray_nodes(kind: str, ranks: dict[int, dict[str, Any]], named: list[int]) -> str:
    """For a lost node: ``" (Ray node <id> dead)"``, the Ray node id(s) of the ranks named. The
    incident's ``nodes`` are Kubernetes node names (the host name off Kubernetes, where several
    Ray nodes can share one host); the Ray node id is what Ray's own logs name."""
    ids = sorted({str(ranks[r].get("node_id")) for r in named if r in ranks and ranks[r].get("node_id")})
    return f" (Ray node {', '.join(ids)} dead)" if kind == NODE_LOST and ids else ""


def saved_when_ray_saw(kind: str) -> list[str]:
    """What a fault Ray Train found first left for diagnosis. A health-check timeout (ray 2.58
    ``worker_group/worker_group.py`` ``_poll_workers_and_collect_errors``: a poll hung past
    ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``) names a process that was ALIVE but did not answer;
    Ray Train ``ray.kill``s it at once (``worker_group/state.py`` ``_shutdown_workers``)."""
    if kind == WORKER_ERROR:
        return []
    if kind == HEALTH_CHECK:
        return ["nothing: the process was alive but did not answer; Ray Train killed it before a stack was taken"]
    return ["nothing: the process was gone"]


# --- the worker groups' notes, attempts and cost ----------------------------------------------
NOTE_START = "start"
NOTE_NOTICE = "notice"
LOCAL_CAPACITY = "local"
LOCAL_PRICE_LABEL = "stated: a local machine, no price"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _seconds(when: str | float) -> float:
    """ISO text (the notes) or epoch seconds (``metrics.jsonl``'s ``time``)."""
    return float(when) if isinstance(when, (int, float)) else datetime.fromisoformat(when).timestamp()


def notes_dir(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/{contract.ATTEMPTS_DIR}"


def write_note(run_dir: str, kind: str, data: dict[str, Any]) -> None:
    """Rank 0: one note (never overwritten: named by its time)."""
    from training.storage.files import write_json

    write_json(f"{notes_dir(run_dir)}/{time.time_ns()}-{kind}.json", {"note": kind, "time": _iso(time.time()), **data})


def read_notes(run_dir: str) -> list[dict[str, Any]]:
    """Every note of the run, oldest first ([] when none)."""
    from training.storage import SHARED_SCHEME
    from training.storage.files import list_files, read_bytes

    try:
        found = list_files(notes_dir(run_dir).removeprefix(SHARED_SCHEME), (".json",))
    except FileNotFoundError:
        return []
    notes = []
    for entry in sorted(found, key=lambda f: int(f.uri.rsplit("/", 1)[-1].split("-", 1)[0])):
        try:
            notes.append(json.loads(read_bytes(entry.uri)))
        except (OSError, ValueError):
            continue  # a note cut off by the node's loss says nothing
    return notes


def last_logged_step(run_dir: str) -> tuple[int, str | None]:
    """(the highest train step ``metrics.jsonl`` in storage holds, that row's time); (0, None)."""
    try:
        text = _read_text(f"{run_dir.rstrip('/')}/{contract.METRICS_NAME}")
    except OSError:
        return 0, None
    best, when = 0, None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get(contract.KIND) == contract.KIND_TRAIN and int(row.get(contract.STEP, 0)) >= best:
            best, when = int(row[contract.STEP]), row.get(contract.WALL_TIME)
    return best, when


def _read_text(uri: str) -> str:
    from training.storage.files import read_bytes

    return read_bytes(uri).decode("utf-8")


def start_note(*, world_size: int, node_ranks: Mapping[str, list[int]], resumed_from_step: int, run_dir: str,
               environ: Mapping[str, str]) -> dict[str, Any]:
    """Rank 0's note at a worker group's start: its size and place, and where it starts from."""
    reached, reached_time = last_logged_step(run_dir)
    return {"world_size": world_size, "nodes": {node: sorted(ranks) for node, ranks in node_ranks.items()},
            "resumed_from_step": resumed_from_step, "reached_step": reached, "reached_time": reached_time,
            "instance_type": environ.get(contract.ENV_INSTANCE_TYPE) or "local",
            "capacity_type": environ.get(contract.ENV_CAPACITY_TYPE) or LOCAL_CAPACITY}


def node_ranks(rank: int, world_size: int, in_ray: bool) -> dict[str, list[int]] | None:
    """Every rank: which Ray node (its id; the host name outside Ray) holds which ranks, to rank 0
    (one collective); None on the other ranks."""
    import socket

    import torch.distributed as dist

    if in_ray:
        import ray

        mine = ray.get_runtime_context().get_node_id()
    else:
        mine = socket.gethostname()
    everyone: list[Any] = [mine]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    out: dict[str, list[int]] = {}
    for r, node in enumerate(everyone):
        out.setdefault(str(node), []).append(r)
    return out


def notice_note(*, step: int, info: Any, seconds: float, world_size: int) -> dict[str, Any]:
    """Rank 0's note once the checkpoint on a drain notice is committed."""
    nodes = {str(k): list(v) for k, v in (getattr(info, "preempted_node_to_ranks", None) or {}).items()}
    return {"saved": step, "nodes": nodes, "deadline_ms": getattr(info, "deadline_ms", None),
            "checkpoint_s": round(seconds, 3), "world_size": world_size}


def preemptions(notes: list[dict[str, Any]], *, on_gpu: bool) -> list[dict[str, Any]]:
    """One ``preemption`` incident (training/py) per notice, completed from the next
    worker group's start: the step it resumed from (the checkpoint on notice: 0 steps lost when
    they match) and the devices idle from the notice to that start."""

    starts = [n for n in notes if n.get("note") == NOTE_START]
    out = []
    for notice in (n for n in notes if n.get("note") == NOTE_NOTICE):
        when = _seconds(notice["time"])
        before = [s for s in starts if _seconds(s["time"]) <= when]
        after = next((s for s in starts if _seconds(s["time"]) > when), None)
        nodes = notice.get("nodes") or {}
        entry = incident(PREEMPTION, ranks=sorted({r for v in nodes.values() for r in v}),
                                   nodes=list(nodes), step=notice.get("saved"), time=notice["time"],
                                   detail=f"node drain notice: checkpoint at step {notice.get('saved')} committed in "
                                          f"{notice.get('checkpoint_s')} s, then held")
        devices = int((before[-1] if before else notice).get("world_size") or 0)
        if after is not None:
            entry["resumed_from_step"] = after.get("resumed_from_step")
            if isinstance(entry["step"], int) and isinstance(entry["resumed_from_step"], int):
                entry["steps_lost"] = max(entry["step"] - entry["resumed_from_step"], 0)
            wall = max(0.0, _seconds(after["time"]) - when)
            entry.update(wall_lost_s=round(wall, 1), devices=devices,
                         device_minutes_lost=round(devices * wall / 60, 2))
            entry["gpu_minutes_lost"] = entry["device_minutes_lost"] if on_gpu else 0.0
        out.append(entry)
    return out


def absorb(existing: list[dict[str, Any]], found: list[dict[str, Any]], notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json's incidents with each preemption in ``found`` added ONCE: the watchdog's incidents
    seen from a notice until the next worker group starts (the drained node's loss, a hang while
    the group is held, the watchdog's own ``preemption`` from Ray's ``preempted`` flag) are that drain's consequence, not faults of their own, so the preemption
    absorbs them (their kind and detail go into its detail; its cost stays the one measured from
    the notice) and they leave the list: one event, one incident, its device-minutes counted once.
    Matched by time, not node name: the notice names Ray node ids, the watchdog Kubernetes node
    names."""
    starts = sorted(_seconds(n["time"]) for n in notes if n.get("note") == NOTE_START)
    kept = list(existing)
    for entry in found:
        when = _seconds(entry["time"])
        until = next((t for t in starts if t > when), None)
        caused = [i for i in kept if not any(i is f for f in found) and i.get("time")
                  and when <= _seconds(i["time"]) and (until is None or _seconds(i["time"]) <= until)]
        for other in caused:
            entry["detail"] += f"; then seen as {other.get('kind')}: {other.get('detail')}"
            if entry.get("device_minutes_lost") is None:  # no later group: the watchdog's measure is all there is
                for key in ("resumed_from_step", "steps_lost", "progress_again_s", "wall_lost_s", "devices",
                            "gpu_minutes_lost", "device_minutes_lost"):
                    entry[key] = other.get(key) if other.get(key) is not None else entry.get(key)
            kept.remove(other)
        kept.append(entry)
    return kept


def attempts_of(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json ``attempts``: each worker group's start."""
    return [{k: n.get(k) for k in ("time", "world_size", "nodes", "resumed_from_step", "instance_type",
                                   "capacity_type")} for n in notes if n.get("note") == NOTE_START]


def cost_of(attempts: list[dict], *, end: str, tokens: int, incidents: list[dict],
            environ: Mapping[str, str]) -> dict[str, Any]:
    """run.json ``cost``: node-hours by instance type and capacity type (each worker group's
    nodes from its start until the next one's, or the run's end), at the node price the
    manifest carries (:data:`training.contract.ENV_NODE_PRICE`, the preflight's; a spot price is
    an estimate) or 0 for a local run, and the cost per 1M tokens trained."""
    price_text = environ.get(contract.ENV_NODE_PRICE, "")
    try:
        price = float(price_text) if price_text else 0.0
    except ValueError:
        price = 0.0
    label = environ.get(contract.ENV_PRICE_LABEL) or (LOCAL_PRICE_LABEL if not price_text else "list price")
    rows: dict[tuple[str, str], float] = {}
    ends = [a["time"] for a in attempts[1:]] + [end]
    for attempt, until in zip(attempts, ends):
        hours = max(0.0, _seconds(until) - _seconds(attempt["time"])) / 3600 * len(attempt.get("nodes") or {})
        key = (attempt.get("instance_type") or "local", attempt.get("capacity_type") or LOCAL_CAPACITY)
        rows[key] = rows.get(key, 0.0) + hours
    by_type = [{"instance_type": it, "capacity_type": cap, "node_hours": round(h, 6), "usd_per_node_hour": price,
                "usd": round(h * price, 4), "price": label + (" (estimate)" if cap == "spot" and "estimate" not in label
                                                             else "")}
               for (it, cap), h in sorted(rows.items())]
    total = sum(r["usd"] for r in by_type)
    return {"node_hours": by_type, "usd": round(total, 4), "tokens": tokens,
            "usd_per_1m_tokens": round(total / tokens * 1e6, 6) if tokens else None,
            "estimate": any(r["capacity_type"] == "spot" for r in by_type),
            "gpu_minutes_lost": round(sum(i.get("gpu_minutes_lost") or 0.0 for i in incidents), 3),
            "device_minutes_lost": round(sum(i.get("device_minutes_lost") or 0.0 for i in incidents), 3),
            "price_label": label}


def summarize(run_dir: str, *, end: str, on_gpu: bool) -> dict[str, Any]:
    """The driver, at the end: run.json's ``attempts`` and the preemptions to add."""
    notes = read_notes(run_dir)
    return {"attempts": attempts_of(notes), "preemptions": preemptions(notes, on_gpu=on_gpu), "notes": notes}
