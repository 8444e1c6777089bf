"""A local run as a user lives with it: `raytrain-eks submit JOB --local` from a folder outside
the repository, on data outside it, then `status`, `logs`, `list` and `stop` on that run, and a
submit ended by SIGTERM (a closed terminal, a CI timeout).

Local runs on a real Ray head and moto's S3 server on 127.0.0.1 (the ``submit --local``
backend): one trains to the verdict on the user's own file (the session's shared run,
``local_run`` in tests/conftest.py: tests/shared_run.py submits it so); the others are given far
more steps than they could finish, so that they are certainly still running when they are
stopped: by ``raytrain-eks stop``, which goes through Ray's ``JobSubmissionClient.stop_job``,
and by SIGTERM to a submit on the session's warm head (``warm_head`` in tests/conftest.py), whose
job must end while the head runs on; and by SIGTERM to a submit that must stop the head and
storage it started. Each run's results folder is ``.work/runs/<run>/``, where the run commands
look for runs by name; the tests remove theirs.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from left_running import left_running, on_the_warm_head
from raytrain_eks.backends.local import RUNS_DIR

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NEVER_ENDS = ("train.max_steps=100000", "checkpoint.every_n_steps=0", "eval.every_n_steps=0")
"""Steps the test never waits for: the run is running whenever the test looks at it."""


def cli(*args: str, cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raytrain_eks.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, **kw)


def submit_cmd(run: str, *sets: str) -> list[str]:
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", str(ROOT / "jobs" / "local.toml"), "--local",
            "--env", str(ROOT / "environment.toml"), "--name", run]
    for item in sets:
        argv += ["--set", item]
    return argv


@contextlib.contextmanager
def submitted(run: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A local submit of a run that never ends by itself, once it has handed the job to its Ray
    head (it writes ``local.json`` then) or has ended (a failure the caller's assertions show);
    killed on the way out if the test left it running. ``env``: the submit's (a warm head's)."""
    proc = subprocess.Popen(submit_cmd(run, *NEVER_ENDS), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        while not (RUNS_DIR / run / "local.json").is_file() and proc.poll() is None:
            time.sleep(0.5)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def run_name(request):
    name = f"t{os.getpid()}-{request.node.name.rsplit('_', 1)[-1]}"[:40]  # a run name: lowercase, digits, '-'
    assert re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", name), name
    yield name
    shutil.rmtree(RUNS_DIR / name, ignore_errors=True)


@pytest.mark.xdist_group("local_run")
def test_own_data_outside_the_repository_travels_with_the_run_and_trains(local_run):
    out, proc = local_run
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    run_name = out.name
    sets = [proc.args[i + 1] for i, arg in enumerate(proc.args) if arg == "--set"]
    [data] = [Path(item.removeprefix("data.path=")) for item in sets if item.startswith("data.path=")]
    assert data.is_file() and not data.is_relative_to(ROOT)  # the user's own file, outside the repository
    record = json.loads((out / "run.json").read_text())
    stored = json.loads((out / "inputs.json").read_text())["data.path"]
    # the job read the stored copy of the user's file, and trained on it to the verdict
    assert stored["origin"] == str(data) and "/_inputs/" in stored["stored"] and stored["stored"].endswith("/notes.jsonl")
    assert record["job_config"]["data"]["path"] == stored["stored"]
    assert record["verdict"]["verdict"] == "accepted" and record["status"] == "succeeded"
    assert f"data.path: {data} -> {stored['stored']} (uploaded" in log

    # the run commands on the ended run: no kubectl, no cluster
    status = cli("status", run_name, "-o", "json")
    assert status.returncode == 0, status.stderr
    fields = json.loads(status.stdout)
    assert fields["backend"] == "local" and fields["status"] == "ended: Ray job SUCCEEDED"
    assert fields["verdict"].startswith("ACCEPTED")
    logs = cli("logs", run_name)
    assert logs.returncode == 0 and logs.stdout == (out / "logs" / "driver.log").read_text()
    listed = json.loads(cli("list", "-o", "json").stdout)
    assert {"run": run_name, "job config": "jobs/local.toml", "status": "Ended (local)", "job status": "SUCCEEDED"}.items() \
        <= next(r for r in listed if r["run"] == run_name).items()
    stop = cli("stop", run_name)
    assert stop.returncode == 2 and "has already ended" in stop.stderr
    assert left_running(out) == {}


def test_status_logs_list_and_stop_reach_a_running_local_run(run_name, warm_head):
    out = RUNS_DIR / run_name
    with submitted(run_name, warm_head) as proc:
        status = cli("status", run_name)
        assert status.returncode == 0 and "RUNNING on the local Ray head" in status.stdout, status.stdout + status.stderr
        listed = cli("list")
        assert any(line.split()[:1] == [run_name] and "Running (local)" in line for line in listed.stdout.splitlines())
        assert cli("logs", run_name).returncode == 0
        stop = cli("stop", run_name)
        assert stop.returncode == 0 and f"stopped {run_name}" in stop.stdout, stop.stderr
        output, _ = proc.communicate(timeout=600)
    assert "Traceback" not in output, output[-4000:]
    ended = cli("status", run_name, "-o", "json")
    assert json.loads(ended.stdout)["status"] == "ended: Ray job STOPPED", output[-3000:]
    assert on_the_warm_head(out) == "STOPPED"  # the head it ran on, left running, says so too


def test_sigterm_to_a_submit_on_a_warm_head_stops_its_job_and_leaves_the_head(run_name, warm_head):
    """The head runs on after the submit (raytrain_eks/backends/local.py ``_stop_and_wait``): its job must not."""
    out = RUNS_DIR / run_name
    with submitted(run_name, warm_head) as proc:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "Traceback" not in output, output[-4000:]
    assert on_the_warm_head(out) == "STOPPED"


def test_sigterm_to_a_local_submit_stops_everything_it_started(run_name):
    """SIGHUP takes the same handler (tests/raytrain_eks/test_cli_signals.py)."""
    out = RUNS_DIR / run_name
    with submitted(run_name) as proc:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, output[-4000:]
    assert "Traceback" not in output and "raytrain-eks submit: interrupted" in output, output[-4000:]
    assert left_running(out) == {}
