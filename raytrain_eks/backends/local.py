"""The local backend of ``raytrain-eks submit --local`` (and ``make demo``): the RayJob's own
entrypoint and runtime env, submitted with ``ray job submit`` to a real Ray head on 127.0.0.1,
with moto's S3 server as the run's storage, as KubeRay's submitter does on EKS.

Both services live as long as one submit (raytrain_eks/backends/local_services.py): the bucket is in
memory, so a local run cannot be resumed by a later submit, and Ctrl-C stops the run with them.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
LOCAL_CPUS = 4
"""Logical CPUs of the local head: the local job's 2 workers and its driver."""


class LocalRunError(RuntimeError):
    """The local run could not be submitted; the message says why."""


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
            raise LocalRunError(f"ray job submit failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
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


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalRun:
    """What one local run left: the Ray job's status and where its results were copied."""
    status: str
    info: dict[str, Any]
    out_dir: Path
    copied: list[str]


def run_local(*, rayjob: Path, run_uri: str, code_path: Path, out_dir: Path, cluster_env: dict[str, str] | None = None,
              say: Callable[[str], None] = print, while_running: Any = None,
              prepare: Callable[[Any], None] | None = None) -> LocalRun:
    """Start the S3 server and a Ray head, upload the code archive, submit ``rayjob``'s own
    entrypoint and runtime env, follow it, and copy the run's results into ``out_dir``.
    ``cluster_env`` reaches the Ray cluster, not the job (the demo's fault injection);
    ``while_running(head)``: a context manager around the job (the demo's metrics scrape);
    ``prepare(s3 client)``: before the head starts (submit uploads the job's own files)."""
    import contextlib

    from charts.main import read_rayjob
    from raytrain_eks.backends.local_services import ray_head, s3_server
    from raytrain_eks.runs.results import download_run, s3_client, upload_if_missing

    job = read_rayjob(rayjob)
    with s3_server() as s3:
        client = s3_client(s3.client_env)
        upload_if_missing(client, code_path, job.working_dir, create_bucket=True)
        say(f"    storage {s3.endpoint_url} (moto, in memory): code {job.working_dir}")
        if prepare:
            prepare(client)
        with ray_head(num_cpus=LOCAL_CPUS, env={**s3.client_env, **(cluster_env or {})},
                      keep_logs=out_dir / "ray-logs") as head:
            say(f"    Ray head: dashboard {head.dashboard_url}, metrics {head.metrics_url}")
            say(f"    entrypoint: {job.entrypoint}")
            submission_id = f"{job.name}-{int(time.time())}"
            from raytrain_eks.runs.commands import register, unregister

            def submitted() -> None:  # from now on status/logs/stop RUN reach the job through the head
                register(out_dir, run=job.name, submission_id=submission_id, dashboard_url=head.dashboard_url,
                         auth_env=head.client_env, services={"ray_temp_dir": head.temp_dir,
                                                             "storage_endpoint": s3.endpoint_url})

            try:
                with (while_running(head) if while_running else contextlib.nullcontext()):
                    status = submit_and_follow(head.dashboard_url, submission_id, job.entrypoint, job.runtime_env_yaml,
                                               auth_env=head.client_env, on_submitted=submitted)
                info = job_info(head.dashboard_url, submission_id, head.client_env)
                out_dir.mkdir(parents=True, exist_ok=True)
                copied = download_run(client, run_uri, out_dir)
            finally:
                unregister(out_dir)
    # Where the run's own services ran: their temp dir and address name every process they
    # started, so "nothing of this run is left running" can be checked for this run alone.
    (out_dir / "ray_job.json").write_text(json.dumps(
        {**info, "manifest_entrypoint": job.entrypoint, "manifest_runtime_env_yaml": job.runtime_env_yaml,
         "ray_temp_dir": head.temp_dir, "storage_endpoint": s3.endpoint_url}, indent=2) + "\n")
    return LocalRun(status=status, info=info, out_dir=out_dir, copied=copied)
