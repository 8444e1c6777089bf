"""Finding and stopping the local processes a local run started (raytrain_eks/backends/local_services.py),
from /proc: by what their command line names, with their descendants, and a local Ray head in
the order ``ray stop`` uses. Linux only, as the local services are."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple


class _Process(NamedTuple):
    parent: int
    state: str
    name: str
    """The kernel's name of the process (``comm``: the executable's, or the one Ray set)."""
    started: int
    """Start time in clock ticks since boot: a pid the kernel reused has another."""
    cmdline: str


def _processes() -> dict[int, _Process]:
    """Every process but ours, from /proc (``stat`` fields as proc(5) lists them)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text(errors="replace")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 1:].split()  # state, parent pid, ..., start time (22nd field)
        table[int(entry.name)] = _Process(int(fields[1]), fields[0], name, int(fields[19]), cmdline)
    return table


def processes_matching(marker: str) -> list[int]:
    """PIDs (other than ours) of the running processes whose command line contains ``marker``."""
    return [pid for pid, proc in _processes().items() if proc.state != "Z" and marker in proc.cmdline]


def running(pids) -> list[int]:
    """Those of ``pids`` that still run (a zombie has exited: it only waits to be reaped)."""
    table = _processes()
    return [pid for pid in pids if pid in table and table[pid].state != "Z"]


def head_processes(temp_dir: str, gcs_address: str, table: dict[int, _Process] | None = None) -> list[int]:
    """Every running process of one local Ray head (in ``table``, default: now): those whose
    command line names its temp dir or its GCS address, and all their descendants. The
    descendants matter: Ray's workers and agents rename themselves (``ray::IDLE``,
    ``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``: ray 2.58 ``_private/worker.py``,
    ``dashboard/agent.py``, ``_private/runtime_env/agent/main.py``) and so name neither; the Ray
    Client server names only the GCS address (``_private/services.py`` ``start_ray_client_server``)."""
    table = _processes() if table is None else table
    address = re.compile(re.escape(gcs_address) + r"(?!\d)")
    roots = [pid for pid, proc in table.items()
             if proc.state != "Z" and (temp_dir in proc.cmdline or address.search(proc.cmdline))]
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(pid for pid in found if table[pid].state != "Z")


def _alive(snapshot: dict[int, _Process]) -> dict[int, _Process]:
    """Those of ``snapshot`` still running as the same process (not a reused pid, not a zombie)."""
    table = _processes()
    return {pid: proc for pid, proc in snapshot.items()
            if pid in table and table[pid].started == proc.started and table[pid].state != "Z"}


def _signal_and_wait(processes: dict[int, _Process], term_s: float) -> None:
    """SIGTERM (skipped when ``term_s`` is 0), up to ``term_s`` for them to exit, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGTERM and term_s <= 0:
            continue
        alive = _alive(processes)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = _alive(alive)
        if not alive:
            return


def stop_ray(temp_dir: str, gcs_address: str, grace_s: float = 10.0) -> None:
    """Stop every process of a local Ray head (:func:`head_processes`) in the order ``ray stop``
    does (ray 2.58 ``ray/scripts/scripts.py`` ``stop``: the raylet first, then the other
    processes, the GCS last; each bucket SIGTERM, then SIGKILL after its share of the grace
    period), then SIGKILL whatever the head started meanwhile. All at once, the GCS outlives its
    SIGTERM and the head takes the whole grace period to stop."""
    table = _processes()  # ONE reading: the buckets and the tree are of the same moment
    head = {pid: table[pid] for pid in head_processes(temp_dir, gcs_address, table)}
    buckets = ({p: v for p, v in head.items() if v.name == "raylet"},
               {p: v for p, v in head.items() if v.name not in ("raylet", "gcs_server")},
               {p: v for p, v in head.items() if v.name == "gcs_server"})
    for bucket in buckets:
        _signal_and_wait(bucket, grace_s / len(buckets))
    late = _processes()
    _signal_and_wait({pid: late[pid] for pid in head_processes(temp_dir, gcs_address, late)}, 0.0)


def kill_group(proc: subprocess.Popen, marker: str | None = None, grace_s: float = 10.0) -> None:
    """Terminate ``proc``'s process group, then every process that still names ``marker``
    (SIGTERM, a grace period, then SIGKILL)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    if marker:
        _signal_and_wait({pid: p for pid, p in _processes().items() if p.state != "Z" and marker in p.cmdline},
                         grace_s)
