"""The run commands (``status``, ``logs``, ``stop``, ``list``) for runs of ``submit --local``.

A local run's Ray head and storage live as long as its submit. While it runs, ``local.json`` in
its results folder (``.work/runs/<run>/``, written once the head is up, readable by this user
only: it holds the head's token) names the submit's process and the head's dashboard, so the
commands ask the head itself (Ray's ``JobSubmissionClient``: status, logs, ``stop_job``). Once
the submit has ended, the folder holds what it copied out: ``ray_job.json`` (the Ray job's final
status), ``run.json`` (the verdict) and ``logs/driver.log``. No kubectl, no cluster.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from raytrain_eks.eks_backend import EXIT_UNREACHABLE

ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = ROOT / ".work" / "runs"
"""Where ``submit`` puts each run's results by default (``--out`` elsewhere: not found by name)."""
LIVE = "local.json"
FINAL = "ray_job.json"


def register(out_dir: Path, *, run: str, submission_id: str, dashboard_url: str, auth_env: dict[str, str],
             services: dict[str, str]) -> None:
    """Write ``<out_dir>/local.json`` for the run commands (mode 0600: the head's token is in it).
    ``services``: where the run's head and storage ran (their temp dir and address name every
    process they started), kept after the run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LIVE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"run": run, "pid": os.getpid(), "pid_started": _started(os.getpid()), "submission_id": submission_id, "dashboard_url": dashboard_url,
                   "auth_env": auth_env, **services}, handle, indent=2)


KEPT = ("run", "submission_id", "ray_temp_dir", "storage_endpoint")
"""What ``local.json`` keeps once the submit has ended (no process, no token)."""


def unregister(out_dir: Path) -> None:
    """The submit has ended: ``local.json`` keeps :data:`KEPT` only."""
    path = out_dir / LIVE
    if path.is_file():
        live = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({k: live[k] for k in KEPT if k in live}, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalRun:
    """One local run's folder, and its live head while its submit runs."""
    run: str
    folder: Path
    live: dict[str, Any] | None
    """``local.json`` while the submit that owns the head is alive; else None."""

    @property
    def final(self) -> dict[str, Any]:
        path = self.folder / FINAL
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    @property
    def record(self) -> dict[str, Any]:
        path = self.folder / "run.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _started(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (proc(5): ``/proc/PID/stat``
    field 22, counted after the parenthesised command name); None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    """``pid`` is the submit that wrote ``local.json``: alive, and (where /proc tells) started
    when it was; a reused pid is another process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or _started(pid) in (None, started)


def find(run: str, runs_dir: Path | None = None) -> LocalRun | None:
    """The local run ``run`` (its folder holds ``local.json``), or None: not a local run."""
    folder = (runs_dir or RUNS_DIR) / run
    path = folder / LIVE
    if not path.is_file():
        return None
    live = json.loads(path.read_text(encoding="utf-8"))
    pid = int(live.get("pid", 0))
    return LocalRun(run=run, folder=folder, live=live if pid and _alive(pid, live.get("pid_started")) else None)


def all_runs(runs_dir: Path | None = None) -> Iterator[LocalRun]:
    """Every local run under ``runs_dir`` (default :data:`RUNS_DIR`), by name."""
    runs_dir = runs_dir or RUNS_DIR
    for path in sorted(runs_dir.glob(f"*/{LIVE}")):
        found = find(path.parent.name, runs_dir)
        if found is not None:
            yield found


class HeadUnreachable(RuntimeError):
    """A live local run's Ray head does not answer (it died before its submit): one line, and
    the CLI exits :attr:`exit_code`, as for a cluster kubectl cannot reach."""

    exit_code = EXIT_UNREACHABLE


@contextmanager
def _client(found: LocalRun) -> Iterator[Any]:
    """Ray's ``JobSubmissionClient`` for the run's head. A head that does not answer raises the
    builtin ConnectionError at construction (ray 2.58 ``dashboard/modules/dashboard_sdk.py``
    ``_check_connection_and_version``: it re-raises requests' ConnectionError so), and requests'
    own ConnectionError on a later call: both become :class:`HeadUnreachable`."""
    import requests
    from ray.job_submission import JobSubmissionClient

    live = found.live or {}
    # The token goes in the request's header (Ray's client caches RAY_AUTH_MODE per process).
    token = live["auth_env"].get("RAY_AUTH_TOKEN", "")
    try:
        yield JobSubmissionClient(live["dashboard_url"],
                                  headers={"authorization": f"Bearer {token}"} if token else None)
    except requests.exceptions.ConnectionError as err:
        raise HeadUnreachable(_unreachable(found, err)) from None
    except ConnectionError as err:
        if isinstance(err, BrokenPipeError):  # our own stdout's reader left: cli.py answers that
            raise
        raise HeadUnreachable(_unreachable(found, err)) from None


def _unreachable(found: LocalRun, err: Exception) -> str:
    live = found.live or {}
    return (f"local run {found.run}: its Ray head at {live.get('dashboard_url')} does not answer "
            f"({str(err).splitlines()[0] if str(err) else type(err).__name__}), though its submit "
            f"(pid {live.get('pid')}) runs: wait for that submit to end, or stop it (kill -INT {live.get('pid')})")


def status(found: LocalRun) -> dict[str, str]:
    """``{"run", "backend", "status", "verdict", "folder"}``: the head's word while it runs, the
    copied records after."""
    from training.verdict import headline, of_record

    if found.live:
        with _client(found) as client:
            info = client.get_job_info(found.live["submission_id"])
        state = f"RUNNING on the local Ray head: Ray job {getattr(info.status, 'value', info.status)}"
        return {"run": found.run, "backend": "local", "status": state, "verdict": "", "folder": str(found.folder)}
    final, record = found.final, found.record
    state = f"ended: Ray job {final['status']}" if final else "ended (its submit stopped before the job did)"
    return {"run": found.run, "backend": "local", "status": state,
            "verdict": headline(of_record(record)) if record else "", "folder": str(found.folder)}


def log(found: LocalRun, *, follow: bool) -> str | None:
    """The driver's log: from the head while it runs (``follow``: streamed to stdout, returns
    ""), else the copy in the folder; None when neither exists."""
    if found.live:
        with _client(found) as client:
            if not follow:
                return client.get_job_logs(found.live["submission_id"])
            import asyncio
            import sys

            async def stream() -> None:
                async for chunk in client.tail_job_logs(found.live["submission_id"]):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()

            asyncio.run(stream())
            return ""
    path = found.folder / "logs" / "driver.log"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def stop(found: LocalRun) -> bool:
    """Stop the run's Ray job through the head (``JobSubmissionClient.stop_job``: SIGTERM to the
    driver, SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``); its submit then copies what the run
    wrote and stops the head and the storage. False when the run had already ended."""
    if not found.live:
        return False
    with _client(found) as client:
        return bool(client.stop_job(found.live["submission_id"]))
