"""How a local Ray head is stopped (raytrain_eks/backends/local_services.py ``stop_ray``), on a table of
processes standing in for /proc and a recorder standing in for ``os.kill``: the order is the one
``ray stop`` uses (ray 2.58 ``ray/scripts/scripts.py`` ``stop``: raylet, the others, GCS last),
the renamed descendants are stopped too, a process born while stopping neither crashes the stop
nor stays, and a pid the kernel gave to another process is left alone. The real head's whole
tree going away is tests/raytrain_eks/backends/test_local_ray_auth.py's."""
from __future__ import annotations

import signal

import pytest

from raytrain_eks.backends import local_services as processes
from raytrain_eks.backends.local_services import _Process

TEMP = "/tmp/rtd-abc123"
GCS = "127.0.0.1:23456"


def _proc(parent: int, name: str, cmdline: str, started: int = 100) -> _Process:
    return _Process(parent=parent, state="S", name=name, started=started, cmdline=cmdline)


HEAD = {
    10: _proc(1, "gcs_server", f"/x/gcs_server --log_dir={TEMP}/session/logs"),
    11: _proc(1, "raylet", f"/x/raylet --raylet_socket_name={TEMP}/session/sockets/raylet"),
    12: _proc(11, "ray::IDLE", "ray::IDLE"),  # a worker: renamed, names neither the dir nor the GCS
    13: _proc(1, "python3", f"python3 -m ray.util.client.server --address={GCS} --port=23999"),
    14: _proc(1, "python3", "python3 -m ray.util.client.server --address=127.0.0.1:234567"),  # not ours
    15: _proc(1, "raylet", "/y/raylet --raylet_socket_name=/tmp/rtd-other/sockets/raylet"),  # another head
}


class Machine:
    """A process table that changes as signals arrive: a process exits on the first signal,
    except the GCS, which ignores SIGTERM (what makes "all at once" slow)."""

    def __init__(self, table: dict[int, _Process]):
        self.table = dict(table)
        self.signals: list[tuple[int, int]] = []
        self.reads = 0
        self.on_read = None

    def processes(self) -> dict[int, _Process]:
        self.reads += 1
        if self.on_read is not None:
            self.on_read(self)
        return dict(self.table)

    def kill(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))
        if pid not in self.table:
            raise ProcessLookupError(pid)
        if not (self.table[pid].name == "gcs_server" and sig == signal.SIGTERM and 11 in self.table):
            del self.table[pid]


@pytest.fixture
def machine(monkeypatch):
    m = Machine(HEAD)
    monkeypatch.setattr(processes, "_processes", m.processes)
    monkeypatch.setattr(processes.os, "kill", m.kill)
    monkeypatch.setattr(processes.time, "sleep", lambda s: None)
    return m


def test_the_head_is_its_named_processes_and_their_descendants():
    assert processes.head_processes(TEMP, GCS, HEAD) == [10, 11, 12, 13]


def test_raylet_first_then_the_others_then_the_gcs(machine):
    processes.stop_ray(TEMP, GCS, grace_s=0.3)
    assert [pid for pid, _ in machine.signals] == [11, 12, 13, 10]
    assert all(sig == signal.SIGTERM for _, sig in machine.signals)
    assert sorted(machine.table) == [14, 15]  # another head's and a look-alike's are untouched


def test_a_process_born_while_stopping_is_stopped_too(machine):
    def spawn_once(m):  # right after the first reading, the head starts one more daemon
        if m.reads == 2:
            m.table[20] = _proc(1, "python3", f"python3 log_monitor.py --logs-dir={TEMP}/session/logs")

    machine.on_read = spawn_once
    processes.stop_ray(TEMP, GCS, grace_s=0.3)
    assert (20, signal.SIGKILL) in machine.signals and sorted(machine.table) == [14, 15]


def test_a_reused_pid_is_not_signalled(machine):
    def reuse(m):  # pid 12 exits and the kernel gives its number to someone else's process
        if m.reads == 2 and 12 in m.table:
            m.table[12] = _proc(1, "bash", "bash", started=999)

    machine.on_read = reuse
    processes.stop_ray(TEMP, GCS, grace_s=0.3)
    assert 12 not in [pid for pid, _ in machine.signals] and machine.table[12].name == "bash"


def test_a_record_naming_a_process_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    # given a record a poller reads while it is rewritten (a submit's local.json, read by
    # `status` and a second submit; a warm head's FILE), a write that stops halfway leaves the
    # previous record whole and no second file beside it; a new one is the owner's only
    import json
    import stat

    path = tmp_path / "run" / "local.json"
    processes.write_record(path, {"run": "r", "pid": 1})
    assert json.loads(path.read_text()) == {"run": "r", "pid": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def halfway(record, handle, **_):
        handle.write('{"run": "r", "pi')
        raise OSError("disk full")

    monkeypatch.setattr(processes.json, "dump", halfway)
    with pytest.raises(OSError, match="disk full"):
        processes.write_record(path, {"run": "r", "pid": 2})
    assert json.loads(path.read_text()) == {"run": "r", "pid": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["local.json"]
    monkeypatch.undo()
    processes.write_record(path, {"run": "r"})
    assert json.loads(path.read_text()) == {"run": "r"} and sorted(p.name for p in path.parent.iterdir()) == ["local.json"]


def test_a_finished_submits_record_keeps_no_token_not_even_in_a_killed_writes_copy(tmp_path):
    # given a submit killed once while rewriting its local.json (its partial copy holds the
    # head's token), the record of the ended run keeps only what names the run, and no copy
    import json

    from raytrain_eks.backends.local import KEPT, LIVE, register, unregister

    register(tmp_path, run="r", submission_id="s", dashboard_url="http://127.0.0.1:1",
             auth_env={"RAY_AUTH_TOKEN": "secret"}, services={"ray_temp_dir": "/tmp/x"})
    (tmp_path / f".{LIVE}.4242").write_text('{"auth_env": {"RAY_AUTH_TOKEN": "secret"')
    unregister(tmp_path)
    kept = json.loads((tmp_path / LIVE).read_text())
    assert set(kept) <= set(KEPT) and kept["run"] == "r" and "secret" not in (tmp_path / LIVE).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LIVE]
