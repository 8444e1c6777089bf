"""The local backend of ``raytrain-eks submit --local`` (and ``make demo``): the RayJob's own
entrypoint and runtime env, submitted with ``ray job submit`` to a real Ray head on 127.0.0.1,
with moto's S3 server as the run's storage, as KubeRay's submitter does on EKS; and a local run's
folder, found by name and answered by its head while it runs.

Both services live as long as one submit (raytrain_eks/backends/local_services.py): the bucket is in
memory, so a local run cannot be resumed by a later submit, and Ctrl-C stops the run with them.
Or they are kept warm across submits (raytrain_eks/backends/warm_head.py): with
``RAYTRAIN_LOCAL_HEAD=FILE`` each submit runs its job there and leaves both running.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from raytrain_eks.backends.local_services import LOCAL_CPUS, HeadUnreachable, process_started, same_process, write_record
from raytrain_eks.backends.warm_head import LOCAL_HEAD_ENV, given_warm_head

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


# --- a local run's folder: found by name, and its live head asked while its submit runs -------
# A local run (``submit --local``) is answered by its own Ray head while it runs, then by the
# records it copied out. Its Ray head and storage live as long as its submit. While it runs,
# ``local.json`` in its results folder (``.work/runs/<run>/``, written once the head is up,
# readable by this user only: it holds the head's token) names the submit's process and the head's
# dashboard, so the commands ask the head itself (Ray's ``JobSubmissionClient``: status, logs,
# ``stop_job``). Once the submit has ended, the folder holds what it copied out: ``ray_job.json``
# (the Ray job's final status), ``run.json`` (the verdict) and ``logs/driver.log``. No kubectl, no
# cluster. An EKS run is answered by its RayJob (KubeRay's status) through kubectl.
RUNS_DIR = ROOT / ".work" / "runs"
"""Where ``submit`` puts each run's results by default (``--out`` elsewhere: not found by name)."""
LIVE = "local.json"
FINAL = "ray_job.json"


def register(out_dir: Path, *, run: str, submission_id: str, dashboard_url: str, auth_env: dict[str, str],
             services: dict[str, str]) -> None:
    """Write ``<out_dir>/local.json`` for the run commands (mode 0600: the head's token is in it).
    ``services``: where the run's head and storage ran (their temp dir and address name every
    process they started), kept after the run."""
    write_record(out_dir / LIVE, {"run": run, "pid": os.getpid(), "pid_started": process_started(os.getpid()),
                                  "submission_id": submission_id, "dashboard_url": dashboard_url,
                                  "auth_env": auth_env, **services})


KEPT = ("run", "submission_id", "ray_temp_dir", "storage_endpoint", "warm_head")
"""What ``local.json`` keeps once the submit has ended (no process, no token)."""


def unregister(out_dir: Path) -> None:
    """The submit has ended: ``local.json`` keeps :data:`KEPT` only, and no partial copy of it
    (one a killed write left, token included) stays beside it."""
    path = out_dir / LIVE
    if path.is_file():
        live = json.loads(path.read_text(encoding="utf-8"))
        write_record(path, {k: live[k] for k in KEPT if k in live})
    for partial in out_dir.glob(f".{LIVE}.*"):
        partial.unlink(missing_ok=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFolder:
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


def find(run: str, runs_dir: Path | None = None) -> RunFolder | None:
    """The local run ``run`` (its folder holds ``local.json``), or None: not a local run."""
    folder = (runs_dir or RUNS_DIR) / run
    path = folder / LIVE
    if not path.is_file():
        return None
    live = json.loads(path.read_text(encoding="utf-8"))
    pid = int(live.get("pid", 0))
    return RunFolder(run=run, folder=folder, live=live if pid and same_process(pid, live.get("pid_started")) else None)


def all_runs(runs_dir: Path | None = None) -> Iterator[RunFolder]:
    """Every local run under ``runs_dir`` (default :data:`RUNS_DIR`), by name."""
    runs_dir = runs_dir or RUNS_DIR
    for path in sorted(runs_dir.glob(f"*/{LIVE}")):
        found = find(path.parent.name, runs_dir)
        if found is not None:
            yield found


@contextmanager
def _client(found: RunFolder) -> Iterator[Any]:
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


def _unreachable(found: RunFolder, err: Exception) -> str:
    live = found.live or {}
    return (f"local run {found.run}: its Ray head at {live.get('dashboard_url')} does not answer "
            f"({str(err).splitlines()[0] if str(err) else type(err).__name__}), though its submit "
            f"(pid {live.get('pid')}) runs: wait for that submit to end, or stop it (kill -INT {live.get('pid')})")


def local_status(found: RunFolder) -> dict[str, str]:
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


def local_log(found: RunFolder, *, follow: bool) -> str | None:
    """The driver's log: from the head while it runs (``follow``: streamed to stdout, returns
    ""), else the copy in the folder; None when neither exists."""
    if found.live:
        with _client(found) as client:
            if not follow:
                return client.get_job_logs(found.live["submission_id"])
            import asyncio

            async def stream() -> None:
                async for chunk in client.tail_job_logs(found.live["submission_id"]):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()

            asyncio.run(stream())
            return ""
    path = found.folder / "logs" / "driver.log"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def local_stop(found: RunFolder) -> bool:
    """Stop the run's Ray job through the head (``JobSubmissionClient.stop_job``: SIGTERM to the
    driver, SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``); its submit then copies what the run
    wrote and stops the head and the storage. False when the run had already ended."""
    if not found.live:
        return False
    with _client(found) as client:
        return bool(client.stop_job(found.live["submission_id"]))


class LocalRunError(RuntimeError):
    """The local run could not be submitted (Ray's job API refused it); the message says why,
    and the CLI exits :attr:`exit_code` with that one line."""

    exit_code = 1


def submit_command(dashboard_url: str, submission_id: str, entrypoint: str, runtime_env_yaml: str) -> list[str]:
    """``ray job submit`` for a RayJob's own entrypoint and runtime env, as KubeRay's submitter
    builds it. Ray re-joins the arguments after ``--`` with shlex.join, so splitting the
    manifest's (shlex-joined) entrypoint gives back the very same string."""
    import yaml

    from training.contract import STORAGE_LIVES_FOR_ONE_SUBMIT_ENV

    runtime_env = yaml.safe_load(runtime_env_yaml) or {}
    # the run's storage and head end with this submit: a stop is no fault and not resumable
    runtime_env.setdefault("env_vars", {})[STORAGE_LIVES_FOR_ONE_SUBMIT_ENV] = "1"
    return [str(BIN / "ray"), "job", "submit", "--no-wait", "--address", dashboard_url, "--submission-id", submission_id,
            "--runtime-env-json", json.dumps(runtime_env), "--", *shlex.split(entrypoint)]


def tool_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    import os

    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(extra or {})}


def submit(dashboard_url: str, submission_id: str, entrypoint: str, runtime_env_yaml: str,
           *, auth_env: dict[str, str], attempts: int = 30) -> None:
    """``ray job submit --no-wait``, retrying while the head's job agent is still registering,
    as KubeRay's submitter does. ``auth_env``: the head's ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN``
    (KubeRay injects the same two into its submitter)."""
    cmd = submit_command(dashboard_url, submission_id, entrypoint, runtime_env_yaml)
    for attempt in range(attempts):
        proc = subprocess.run(cmd, cwd=ROOT, env=tool_env(auth_env), text=True, capture_output=True)
        if proc.returncode == 0:
            return
        if "No available agent" not in proc.stdout + proc.stderr or attempt == attempts - 1:
            said = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
            raise LocalRunError(f"ray job submit failed: {' | '.join(said[-3:])}")  # Ray's last line can be a bare '.'
        time.sleep(2)  # the agent registers within seconds; bounded by `attempts`


def submit_and_follow(dashboard_url: str, submission_id: str, entrypoint: str, runtime_env_yaml: str,
                      *, auth_env: dict[str, str], attempts: int = 30,
                      on_submitted: Callable[[], None] | None = None) -> str:
    """:func:`submit`, then stream the job's log until it ends. Returns the job's final status."""
    submit(dashboard_url, submission_id, entrypoint, runtime_env_yaml, auth_env=auth_env, attempts=attempts)
    if on_submitted:
        on_submitted()
    env = tool_env(auth_env)
    # Its own session: Ctrl-C at the terminal reaches this process only (no second traceback
    # from the follower); subprocess.run kills the follower when this process is interrupted.
    subprocess.run([str(BIN / "ray"), "job", "logs", "--follow", "--address", dashboard_url, submission_id],
                   cwd=ROOT, env=env, start_new_session=True)
    return job_info(dashboard_url, submission_id, auth_env)["status"]


def job_client(dashboard_url: str, auth_env: dict[str, str]) -> Any:
    """Ray's ``JobSubmissionClient`` for the head, with its token."""
    from ray.job_submission import JobSubmissionClient

    # The token goes in the request's own header: Ray's client reads RAY_AUTH_MODE once per
    # process and caches it, so an environment set after anything imported Ray is not seen.
    token = auth_env.get("RAY_AUTH_TOKEN", "")
    headers = {"authorization": f"Bearer {token}"} if token else None
    return JobSubmissionClient(dashboard_url, headers=headers)


def job_info(dashboard_url: str, submission_id: str, auth_env: dict[str, str]) -> dict[str, Any]:
    info = job_client(dashboard_url, auth_env).get_job_info(submission_id)
    return {"submission_id": submission_id, "status": getattr(info.status, "value", str(info.status)),
            "entrypoint": info.entrypoint}


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
"""Ray's terminal job states (ray 2.58 ``dashboard/modules/job/common.py`` ``JobStatus.is_terminal``)."""


def stop_bound_s(runtime_env_yaml: str) -> float:
    """How long a stopped job on a warm head may take to end: the job supervisor's own wait
    before its SIGKILL (``RAY_JOB_STOP_WAIT_TIME_S`` in the job's runtime env, ray 2.58
    ``dashboard/modules/job/job_supervisor.py``; the job's ``checkpoint.sigterm_grace_seconds``
    plus a margin, training/contract.py) and the margin of ``raytrain-eks stop`` on EKS."""
    from raytrain_eks.backends.eks import MARGIN_S, stop_wait_s

    return float(stop_wait_s({"spec": {"runtimeEnvYAML": runtime_env_yaml}}) + MARGIN_S)


def _stop_and_wait(head: Any, submission_id: str, bound_s: float) -> None:
    """Stop the submit's job on a warm head (Ctrl-C, SIGTERM, an error while following it) and wait
    for it to end: the job supervisor SIGKILLs its driver after the runtime env's
    ``RAY_JOB_STOP_WAIT_TIME_S``; ``bound_s`` (:func:`stop_bound_s`, beyond that wait) only ends a
    hung wait: a fixed 180 s returned while a job of a longer grace still wrote its final
    checkpoint, holding the warm head's CPUs after its submit ended. A job never submitted: nothing."""
    try:
        client = job_client(head.dashboard_url, head.client_env)
        client.stop_job(submission_id)
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            status = client.get_job_status(submission_id)
            if getattr(status, "value", str(status)) in TERMINAL:
                return
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 (no such job: it was never submitted; a head gone: nothing runs)
        return


def _connection_lost(err: BaseException) -> bool:
    import requests

    return isinstance(err, (ConnectionError, requests.exceptions.ConnectionError)) and not isinstance(err, BrokenPipeError)


def _head_gone(head: Any, submission_id: str, warm: Any, err: BaseException) -> HeadUnreachable:
    """A head that stopped answering while its job ran (it died, or its owner stopped it): one
    line (exit 5), not a traceback. Ray's client raises the builtin ConnectionError at
    construction (ray 2.58 ``dashboard/modules/dashboard_sdk.py`` ``_check_connection_and_version``)."""
    where = f"the warm head {warm.path}" if warm else "the run's Ray head"
    said = str(err).splitlines()[0] if str(err) else type(err).__name__
    return HeadUnreachable(f"Ray job {submission_id}: {where} at {head.dashboard_url} stopped answering while "
                           f"the job ran ({said}): its end is unknown, nothing was copied")


def _final_info(head: Any, submission_id: str, warm: Any) -> dict[str, Any]:
    """The job's final status, or :func:`_head_gone`."""
    try:
        return job_info(head.dashboard_url, submission_id, head.client_env)
    except Exception as err:
        if _connection_lost(err):
            raise _head_gone(head, submission_id, warm, err) from None
        raise


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalRun:
    """What one local run left: the Ray job's status and where its results were copied."""
    status: str
    info: dict[str, Any]
    out_dir: Path
    copied: list[str]


def run_local(*, rayjob: Path, run_uri: str, code_path: Path, out_dir: Path,
              say: Callable[[str], None] = print, while_running: Any = None,
              prepare: Callable[[Any], None] | None = None, storage: Any = None) -> LocalRun:
    """Start the S3 server and a Ray head (or use the warm head :data:`LOCAL_HEAD_ENV` names), upload
    the code archive, submit ``rayjob``'s own entrypoint and runtime env, follow it, and copy the
    run's results into ``out_dir``. ``while_running(head)``: a context manager around
    the job (the demo's metrics scrape and fault); ``prepare(s3 client)``: before the head starts (submit
    uploads the job's own files); ``storage``: a running S3 server (``endpoint_url``, ``client_env``)
    to use instead of a fresh moto (the demo's, which can hold a checkpoint's upload)."""
    from charts import ChartError
    from charts.main import read_rayjob
    from raytrain_eks.backends.local_services import ray_head, s3_server
    from raytrain_eks.runs.results import download_run, run_exists, s3_client, upload_if_missing

    job = read_rayjob(rayjob)
    warm = given_warm_head()
    if warm and storage is not None:
        raise ChartError(f"{LOCAL_HEAD_ENV}: this run brings its own storage, which the warm head was started "
                         f"without: unset {LOCAL_HEAD_ENV} for it")
    given = warm.storage if warm else storage
    with (contextlib.nullcontext(given) if given is not None else s3_server()) as s3:
        client = s3_client(s3.client_env)
        upload_if_missing(client, code_path, job.working_dir, create_bucket=True)
        if warm and run_exists(client, run_uri):
            # A warm head's storage outlives each submit: the job would find the earlier run's
            # checkpoints there and resume them (training/launch.py plan_resume) as a "new" run,
            # or two submits of one name would write one folder.
            raise ChartError(f"{LOCAL_HEAD_ENV}={warm.path}: run {job.name}: the warm head's storage already holds "
                             f"{run_uri} (an earlier submit of that name): pick another --name, or leave --name out")
        say(f"    storage {s3.endpoint_url} (moto, in memory): code {job.working_dir}")
        if prepare:
            prepare(client)
        with (contextlib.nullcontext(warm.head) if warm else
              ray_head(num_cpus=LOCAL_CPUS, env=s3.client_env, keep_logs=out_dir / "ray-logs")) as head:
            say(f"    Ray head: dashboard {head.dashboard_url}, metrics {head.metrics_url}"
                + (f" (warm: {warm.path}, left running; its logs in {head.temp_dir})" if warm else ""))
            services = {"ray_temp_dir": head.temp_dir, "storage_endpoint": s3.endpoint_url,
                        **({"warm_head": str(warm.path)} if warm else {})}
            say(f"    entrypoint: {job.entrypoint}")
            submission_id = f"{job.name}-{int(time.time())}"

            def submitted() -> None:  # from now on status/logs/stop RUN reach the job through the head
                register(out_dir, run=job.name, submission_id=submission_id, dashboard_url=head.dashboard_url,
                         auth_env=head.client_env, services=services)

            try:
                with (while_running(head) if while_running else contextlib.nullcontext()):
                    try:
                        status = submit_and_follow(head.dashboard_url, submission_id, job.entrypoint,
                                                   job.runtime_env_yaml, auth_env=head.client_env, on_submitted=submitted)
                    except LocalRunError:
                        # Ray refused the submission (ray 2.58 job_manager.py submit_job: "Job with
                        # submission_id ... already exists"): nothing of this submit runs, and a job
                        # of that id is another submit's, which a stop would end.
                        raise
                    except BaseException as err:
                        if warm:  # the head runs on after this submit: its job must not
                            _stop_and_wait(head, submission_id, stop_bound_s(job.runtime_env_yaml))
                        if _connection_lost(err):
                            raise _head_gone(head, submission_id, warm, err) from None
                        raise
                info = _final_info(head, submission_id, warm)
                out_dir.mkdir(parents=True, exist_ok=True)
                copied = download_run(client, run_uri, out_dir)
            finally:
                unregister(out_dir)
    # Where the run's services ran: their temp dir and address name every process they started,
    # so "nothing of this run is left running" can be checked for this run alone (``warm_head``:
    # they were not this run's, and run on).
    (out_dir / "ray_job.json").write_text(json.dumps(
        {**info, "manifest_entrypoint": job.entrypoint, "manifest_runtime_env_yaml": job.runtime_env_yaml,
         **services}, indent=2) + "\n")
    return LocalRun(status=status, info=info, out_dir=out_dir, copied=copied)
