"""The run commands on a local run whose ``local.json`` outlived its head, or its submit
(raytrain_eks/runs/commands.py): one line and exit 5, or the run read as ended; no traceback."""
from __future__ import annotations

import json
import os
import socket

import pytest

from raytrain_eks.backends import local as local_runs
from raytrain_eks.backends.local_services import process_started
from raytrain_eks.cli import main


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening, then closed: connections are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(local_runs, "RUNS_DIR", tmp_path)
    return tmp_path


def _write(runs, run: str, **live) -> None:
    (runs / run).mkdir()
    (runs / run / local_runs.LIVE).write_text(json.dumps(
        {"run": run, "submission_id": f"{run}-1", "dashboard_url": f"http://127.0.0.1:{_closed_port()}",
         "auth_env": {"RAY_AUTH_TOKEN": "t"}, **live}))


@pytest.mark.parametrize("command", [["status"], ["logs"], ["stop"], ["status", "-o", "json"]])
def test_a_dead_head_of_a_live_submit_is_one_line_and_exit_5(runs, capfd, command):
    """The submit (here: this process, its start time recorded) runs, its head does not answer:
    Ray's JobSubmissionClient raises the builtin ConnectionError (ray 2.58
    dashboard/modules/dashboard_sdk.py:299-302); the command says so in one line, exit 5."""
    _write(runs, "deadhead", pid=os.getpid(), pid_started=process_started(os.getpid()))
    assert main([command[0], "deadhead", *command[1:]]) == 5
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "local run deadhead: its Ray head at http://127.0.0.1:" in err and "does not answer" in err


def test_a_reused_pid_is_not_the_submit(runs, capfd):
    """local.json names a pid now used by another process (this one, started at another time):
    the run's submit has ended, so the run is read from its folder, the head not asked."""
    _write(runs, "reused", pid=os.getpid(), pid_started="1")
    found = local_runs.find("reused")
    assert found is not None and found.live is None
    assert main(["status", "reused", "-o", "json"]) == 0
    assert json.loads(capfd.readouterr().out)["status"] == "ended (its submit stopped before the job did)"
