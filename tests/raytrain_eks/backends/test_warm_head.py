"""`submit --local` onto a warm local head (``RAYTRAIN_LOCAL_HEAD``, raytrain_eks/backends/warm_head.py):
a file that names no warm head, or a head that does not answer, is one line before anything
starts. The warm head in use: tests/conftest.py ``warm_head`` (the e2e runs that share it)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytrain_eks.backends.warm_head import LOCAL_HEAD_ENV

pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[3]


def _submit(tmp_path: Path, named: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, LOCAL_HEAD_ENV: str(named)})


def test_no_warm_head_at_the_named_file_is_one_line_before_anything_starts(tmp_path):
    fix = f"start one with `python -m raytrain_eks.backends.warm_head {tmp_path / 'head.json'}`, or unset {LOCAL_HEAD_ENV}"
    missing = _submit(tmp_path, tmp_path / "head.json")
    assert missing.returncode == 2, missing.stderr[-3000:]
    assert missing.stderr.strip() == f"error: {LOCAL_HEAD_ENV}={tmp_path / 'head.json'}: no such file: {fix}"

    # a file whose head is gone (its port closed): exit 5, as for a cluster kubectl cannot reach
    (tmp_path / "head.json").write_text(json.dumps({
        "gcs_address": "127.0.0.1:9", "dashboard_url": "http://127.0.0.1:9", "temp_dir": str(tmp_path),
        "metrics_url": "", "auth_token": "0" * 64, "storage_endpoint": "http://127.0.0.1:9"}))
    gone = _submit(tmp_path, tmp_path / "head.json")
    assert gone.returncode == 5, gone.stderr[-3000:]
    [line] = gone.stderr.strip().splitlines()
    assert line.startswith(f"error: {LOCAL_HEAD_ENV}={tmp_path / 'head.json'}: its Ray head at "
                           "http://127.0.0.1:9/api/version does not answer (") and line.endswith(fix)
    # nothing started: no storage, no head, no job handed over
    assert "storage http" not in gone.stdout and not (tmp_path / "out" / "local.json").exists()


def _warm(path: Path, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raytrain_eks.backends.warm_head", str(path)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_named(path: Path, proc: subprocess.Popen) -> dict:
    """FILE once it names ``proc`` (its head's own start retries bound the wait)."""
    while proc.poll() is None:
        named = json.loads(path.read_text()) if path.is_file() else {}
        if named.get("pid") == proc.pid:
            return named
        time.sleep(0.2)
    raise AssertionError(f"warm head pid {proc.pid} exited {proc.returncode} before naming itself in {path}")


def test_one_warm_head_per_file_and_a_killed_ones_file_is_refused_then_cleaned_up(tmp_path, monkeypatch):
    """``kill -9`` of ``python -m raytrain_eks.backends.warm_head FILE`` runs no clean-up, and what it
    started outlives it: ``ray start --head`` daemonizes (ray 2.58 ``scripts/scripts.py`` ``start``
    without ``--block`` returns once the head's processes run) and moto runs in its own session.
    FILE then names a head that still answers but that nobody owns: the next submit must not run
    its job there unseen (exit 5, one line), and starting the warm head again on FILE stops those
    orphans first. A second warm head on a FILE whose head runs is refused, not started over it
    (on exit either one would delete the other's file)."""
    from raytrain_eks.backends.local_services import HeadUnreachable
    from raytrain_eks.backends.warm_head import given_warm_head
    from raytrain_eks.backends.local_services import head_processes, processes_matching, running

    path, procs = tmp_path / "head.json", []
    log = (tmp_path / "heads.log").open("w")
    try:
        first = _warm(path, log)
        procs.append(first)
        named = _wait_named(path, first)
        second = _warm(path, log)
        procs.append(second)
        assert second.wait(timeout=120) == 1, "a second warm head started on a file whose head runs"
        assert json.loads(path.read_text())["pid"] == first.pid  # still the first one's
        first.kill()  # SIGKILL: no clean-up runs
        first.wait(timeout=60)
        orphans = head_processes(named["temp_dir"], named["gcs_address"])
        assert orphans, "the killed warm head's Ray head did not outlive it (what this test is about)"
        monkeypatch.setenv(LOCAL_HEAD_ENV, str(path))
        with pytest.raises(HeadUnreachable, match=rf"its warm head's process \(pid {first.pid}\) is gone"):
            given_warm_head()
        third = _warm(path, log)
        procs.append(third)
        _wait_named(path, third)
        port = named["storage_endpoint"].rsplit(":", 1)[1]
        assert (running(orphans), processes_matching(f"moto_server -H 127.0.0.1 -p {port} ")) == ([], [])
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=300) == 130
        assert not path.exists()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=300)
        log.close()
    print((tmp_path / "heads.log").read_text()[-2000:])


def _warm_client(warm_head_env: dict[str, str]):
    """Ray's JobSubmissionClient and the S3 client of the session's warm head (its FILE)."""
    from ray.job_submission import JobSubmissionClient

    from raytrain_eks.backends.local_services import S3Server
    from raytrain_eks.runs.results import s3_client

    named = json.loads(Path(warm_head_env[LOCAL_HEAD_ENV]).read_text())
    jobs = JobSubmissionClient(named["dashboard_url"], headers={"authorization": f"Bearer {named['auth_token']}"})
    return jobs, s3_client(S3Server(endpoint_url=named["storage_endpoint"]).client_env)


def test_a_submit_ray_refuses_stops_no_other_job_on_the_warm_head(warm_head, tmp_path, monkeypatch, capsys):
    """Ray's job API refuses a submission id it holds already (ray 2.58
    ``dashboard/modules/job/job_manager.py`` ``submit_job``: ``put_info(..., overwrite=False)``,
    "Job with submission_id ... already exists"). A submit whose ``ray job submit`` was refused
    so has nothing running, and the job of that id is another submit's: it must not be stopped
    (stop_job by id would end it), and the refusal is one line (exit 1), not a traceback. The
    submission id is ``<run>-<epoch s>``: two submits of one run name in one second collide; the
    clock is pinned here so that they do, deterministically (the head, the job API and the other
    job are real)."""
    import types

    from raytrain_eks.backends import local
    from raytrain_eks.cli import main

    jobs, _ = _warm_client(warm_head)
    now = 1_800_000_000
    other = jobs.submit_job(entrypoint="sleep 600", submission_id=f"rev-collide-{now}")
    monkeypatch.setenv(LOCAL_HEAD_ENV, warm_head[LOCAL_HEAD_ENV])
    monkeypatch.setattr(local, "time", types.SimpleNamespace(time=lambda: float(now), sleep=time.sleep,
                                                             monotonic=time.monotonic))
    try:
        try:
            code = main(["submit", "jobs/local.toml", "--local", "--name", "rev-collide", "--out",
                         str(tmp_path / "out")])
        except Exception as err:  # noqa: BLE001 - a traceback is itself a finding: reported below
            code = f"raised {type(err).__name__}: {err}"
        status = jobs.get_job_status(other).value
    finally:
        jobs.stop_job(other)
    err = capsys.readouterr().err
    assert status in ("PENDING", "RUNNING"), f"the other submit's job was {status}: {err[-2000:]}"
    assert code == 1, err[-2000:]
    [line] = [l for l in err.splitlines() if l.startswith("error:")]
    assert "already exists" in line, err[-2000:]


def test_a_run_name_the_warm_storage_holds_is_refused_before_its_job(warm_head, tmp_path):
    """A warm head's storage outlives each submit: a run name it already holds (an earlier
    submit of it, another results folder) would find that run's checkpoints and resume them
    (training/launch.py ``plan_resume``) while submit calls it new; two submits of one name
    would write one folder. One line, exit 2, no Ray job submitted."""
    from environment import load_environment
    from environment.contract import run_folder
    from raytrain_eks.runs.results import split_uri
    from training.storage import RunStorage

    _, s3 = _warm_client(warm_head)
    run_uri = RunStorage(load_environment(str(ROOT / "environment.toml")).storage_uri).run(
        run_folder("rev-held", on_cluster=False))
    bucket, prefix = split_uri(run_uri)
    s3.create_bucket(Bucket=bucket) if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]] else None
    s3.put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/checkpoint_00000002/.metadata", Body=b"{}")
    held = subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local", "--name",
                           "rev-held", "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=warm_head)
    assert held.returncode == 2, held.stderr[-3000:]
    [line] = held.stderr.strip().splitlines()
    assert "run rev-held" in line and run_uri in line and "--name" in line, line
    assert not (tmp_path / "out" / "local.json").exists()  # no job handed to the head


def test_a_stopped_jobs_wait_on_the_warm_head_outlasts_its_supervisors_stop_wait():
    """Ray's job supervisor SIGTERMs a stopped driver and SIGKILLs it only after the job's
    ``RAY_JOB_STOP_WAIT_TIME_S`` (ray 2.58 ``dashboard/modules/job/job_supervisor.py``, read from
    the supervisor actor's environment, which the job's runtime env sets: charts/ray_charts.py,
    ``checkpoint.sigterm_grace_seconds`` + a margin). An interrupted submit on a warm head waits for
    its job to end; a bound below that wait (a fixed 180 s) returned while a job of a 300 s grace
    still wrote its final checkpoint on the head's CPUs, after the submit had ended."""
    from raytrain_eks.backends.local import stop_bound_s
    from training.contract import stop_wait_seconds

    wait = stop_wait_seconds(300)
    assert stop_bound_s(f"env_vars:\n  RAY_JOB_STOP_WAIT_TIME_S: '{wait}'\n") > wait


def test_a_head_that_dies_while_its_job_runs_ends_the_submit_in_one_line(tmp_path):
    """The warm head's Ray processes killed whole while a submit follows its job (a crash, an OOM
    kill; from outside, SIGKILL): ``ray job logs --follow`` ends with the dashboard's socket, and
    Ray's client then raises the builtin ConnectionError at construction (ray 2.58
    ``dashboard/modules/dashboard_sdk.py`` ``_check_connection_and_version``). The submit ends in
    one line, exit 5 (as for a cluster kubectl cannot reach), not a traceback."""
    from raytrain_eks.backends.local_services import head_processes

    path, log = tmp_path / "head.json", (tmp_path / "head.log").open("w")
    owner = _warm(path, log)
    try:
        named = _wait_named(path, owner)
        out = tmp_path / "out"
        submit = subprocess.Popen([sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local",
                                   "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, LOCAL_HEAD_ENV: str(path)})
        # the job handed over (local.json names the submit while it follows the job), bounded
        while submit.poll() is None and "pid" not in (json.loads((out / "local.json").read_text())
                                                      if (out / "local.json").is_file() else {}):
            time.sleep(0.2)
        assert submit.poll() is None, submit.communicate()[1][-3000:]
        for pid in head_processes(named["temp_dir"], named["gcs_address"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, err = submit.communicate(timeout=600)
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(timeout=300)
        log.close()
    assert submit.returncode == 5, err[-3000:]
    [line] = [l for l in err.splitlines() if l.startswith("error:")]
    assert "stopped answering while the job ran" in line and named["dashboard_url"] in line, line
    assert "Traceback" not in err[err.index(line):], err[-3000:]  # nothing after the line
