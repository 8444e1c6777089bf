"""A warm local head: one Ray head and its storage kept running across ``submit --local``s.

``python -m raytrain_eks.backends.warm_head FILE`` starts the services a submit would start
(raytrain_eks/backends/local_services.py: a token-authenticated Ray head of
:data:`~raytrain_eks.backends.local_services.LOCAL_CPUS` CPUs and moto's S3 server) and names them
in FILE (mode 0600: the head's token) until Ctrl-C, SIGTERM or SIGHUP. With
:data:`LOCAL_HEAD_ENV` ``=FILE`` each ``submit --local`` and ``netcheck --local``
(raytrain_eks/backends/local.py) runs its job there, its own Ray job through the head's job
supervisor, as KubeRay's long-lived RayCluster takes each ``submit --on-cluster``, and leaves
both running. A head's start (ray start, its dashboard's modules, the agents) is most of a short
local run's overhead. Its jobs queue for its CPUs.

One warm head per FILE (a lock beside it); a FILE whose owner was killed names services nobody
owns: a submit refuses it (exit 5), and the next warm head on that FILE stops them first.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from raytrain_eks.backends.local_services import LOCAL_CPUS, HeadUnreachable, process_started, same_process, write_record

LOCAL_HEAD_ENV = "RAYTRAIN_LOCAL_HEAD"
"""The file of a warm local head (:func:`warm_head`): set, ``submit --local`` runs its job on that
head and storage instead of starting its own, and leaves them running."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmHead:
    """A running head and its storage, as :func:`warm_head` named them in ``path``."""
    path: Path
    head: Any
    """local_services.RayHead"""
    storage: Any
    """local_services.S3Server"""


def _write_warm(path: Path, head: Any, storage_endpoint: str) -> None:
    write_record(path, {"pid": os.getpid(), "pid_started": process_started(os.getpid()),
                        "dashboard_url": head.dashboard_url, "gcs_address": head.gcs_address,
                        "temp_dir": head.temp_dir, "metrics_url": head.metrics_url, "auth_token": head.auth_token,
                        "storage_endpoint": storage_endpoint})


class WarmHeadBusy(RuntimeError):
    """FILE names a warm head whose process runs: a second head would take its file over."""


def _claim_warm_file(path: Path) -> int:
    """Hold ``path``'s lock (``.<name>.lock`` beside it, an exclusive ``flock`` the kernel
    releases however the holder ends) for a warm head's life: a second ``python -m
    raytrain_eks.backends.warm_head FILE`` is refused instead of taking the running head's file over
    (and, on either one's exit, deleting the other's). A file left by a head whose process was
    killed (``kill -9`` runs no clean-up: ``ray start`` daemonizes and moto runs in its own
    session, so both outlive it) names services nobody owns: they are stopped here first."""
    import fcntl

    from raytrain_eks.backends.local_services import processes_matching, stop_ray

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        named = _read_warm(path) or {}
        raise WarmHeadBusy(f"{path} names a running warm head (pid {named.get('pid', '?')}, dashboard "
                           f"{named.get('dashboard_url', '?')}): stop it first (kill -INT {named.get('pid', '?')}) "
                           "or name another file") from None
    stale = _read_warm(path)
    if stale and stale.get("temp_dir") and stale.get("gcs_address"):
        stop_ray(stale["temp_dir"], stale["gcs_address"])
        port = str(stale.get("storage_endpoint", "")).rsplit(":", 1)[-1]
        if port.isdigit():
            _stop_pids(processes_matching(f"moto_server -H 127.0.0.1 -p {port} "))
        if Path(stale["temp_dir"]).name.startswith("rtd-"):  # ray_head's own mkdtemp, nothing else
            import shutil

            shutil.rmtree(stale["temp_dir"], ignore_errors=True)
    return fd


def _stop_pids(pids: list[int]) -> None:
    import signal

    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _read_warm(path: Path) -> dict[str, Any] | None:
    try:
        named = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return named if isinstance(named, dict) else None


@contextmanager
def warm_head(path: Path) -> Iterator[WarmHead]:
    """A local Ray head (token auth, :data:`LOCAL_CPUS`) and moto's S3 server, the services a
    submit starts, named in ``path`` (mode 0600) while they run; both stop and the file goes on
    exit. One head per file (:func:`_claim_warm_file`)."""
    from raytrain_eks.backends.local_services import ray_head, s3_server

    lock = _claim_warm_file(path)
    try:
        with s3_server() as store:
            with ray_head(num_cpus=LOCAL_CPUS, env=store.client_env) as head:
                _write_warm(path, head, store.endpoint_url)
                try:
                    yield WarmHead(path=path, head=head, storage=store)
                finally:
                    path.unlink(missing_ok=True)
    finally:
        os.close(lock)


def given_warm_head() -> WarmHead | None:
    """The warm head :data:`LOCAL_HEAD_ENV` names, once it answers; None when the variable is
    unset. A file that names no warm head is one line (exit 2); a head or storage that does not
    answer is one line (exit 5): both before anything starts."""
    import urllib.request

    from charts import ChartError
    from raytrain_eks.backends.local_services import RayHead, S3Server

    value = os.environ.get(LOCAL_HEAD_ENV, "")
    if not value:
        return None
    path = Path(value).absolute()
    fix = f"start one with `python -m raytrain_eks.backends.warm_head {value}`, or unset {LOCAL_HEAD_ENV}"
    try:
        named = json.loads(path.read_text(encoding="utf-8"))
        head = RayHead(gcs_address=named["gcs_address"], dashboard_url=named["dashboard_url"],
                       temp_dir=named["temp_dir"], metrics_url=named["metrics_url"], auth_token=named["auth_token"])
        storage = S3Server(endpoint_url=named["storage_endpoint"])
    except FileNotFoundError:
        raise ChartError(f"{LOCAL_HEAD_ENV}={value}: no such file: {fix}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ChartError(f"{LOCAL_HEAD_ENV}={value}: not a warm local head's file "
                         f"({type(err).__name__}: {err}): {fix}") from None
    owner = named.get("pid")
    if isinstance(owner, int) and not same_process(owner, named.get("pid_started")):
        # kill -9 of the warm head's process: its head and storage outlive it (their own
        # sessions), answering, but nobody stops them and a job's end is nobody's to see.
        raise HeadUnreachable(f"{LOCAL_HEAD_ENV}={value}: its warm head's process (pid {owner}) is gone, its Ray "
                              f"head and storage left running without it: start it again with `python -m "
                              f"raytrain_eks.backends.warm_head {value}` (it stops them first), or unset {LOCAL_HEAD_ENV}")
    for what, url, headers in (("its Ray head", f"{head.dashboard_url}/api/version",
                                {"Authorization": f"Bearer {head.auth_token}"}),
                               ("its storage", f"{storage.endpoint_url}/moto-api/", {})):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
                pass
        except (OSError, ValueError) as err:
            raise HeadUnreachable(f"{LOCAL_HEAD_ENV}={value}: {what} at {url} does not answer ({err}): {fix}") from None
    return WarmHead(path=path, head=head, storage=storage)


def main(argv: list[str] | None = None) -> int:
    """``python -m raytrain_eks.backends.warm_head FILE``: a warm local head until Ctrl-C, SIGTERM or
    SIGHUP (the CLI's handling: the head and its storage stop, nothing is left running)."""
    import argparse
    import signal

    from raytrain_eks.backends.local_services import ServiceStartError

    stopping = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def stop(signum: int, frame: Any) -> None:  # as Ctrl-C; a second signal cannot cut the clean-up short
        for sig in stopping:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    parser = argparse.ArgumentParser(prog="python -m raytrain_eks.backends.warm_head",
                                     description="keep a local Ray head and its storage warm for submit --local")
    parser.add_argument("file", help=f"where to name them (mode 0600: the head's token); {LOCAL_HEAD_ENV}=FILE uses them")
    args = parser.parse_args(argv)
    for sig in stopping:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # one inherited as ignored (nohup) stays so
            signal.signal(sig, stop)
    try:
        with warm_head(Path(args.file).absolute()) as warm:
            print(f"warm local head: dashboard {warm.head.dashboard_url}, storage {warm.storage.endpoint_url}; "
                  f"submit with {LOCAL_HEAD_ENV}={warm.path} (Ctrl-C stops both)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("warm local head: stopped", file=sys.stderr)
        return 130
    except (ServiceStartError, WarmHeadBusy) as err:  # its own attempts stopped what they began
        print(f"error: warm local head: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
