"""Services a local run needs (`make demo`, `raytrain-eks submit --local`), started on 127.0.0.1 only and always stopped again.

- :func:`s3_server`: moto's S3-compatible server (in memory) standing in for the checkpoint
  bucket. It speaks the real S3 HTTP protocol, so boto3, pyarrow and Ray's own S3 download of
  the code archive are the real clients.
- :func:`ray_head`: a real local Ray head (`ray start --head`) with the dashboard and the
  metrics endpoint on loopback and Ray's token authentication ON, as on EKS: a fresh random
  token per head, given to Ray in ``RAY_AUTH_TOKEN`` (never written to ``~/.ray``), and to
  clients in :attr:`RayHead.client_env`, so jobs go through the real authenticated
  `ray job submit` path, exactly as KubeRay's submitter does with the token KubeRay injects,
  and export their metrics as they do there.

A start that fails (its process exits, or it does not answer within its wait, as on a loaded
machine) is stopped and started again, with fresh ports and a longer wait
(:func:`start_with_retries`); only repeated failures are reported.

Both run in their own process group under a unique temp dir; on exit (normal, error, Ctrl-C)
the head's processes (what names its temp dir or GCS address, and all their descendants, which
Ray renames) are stopped in ``ray stop``'s order, then the group is terminated and any process
still naming that temp dir is killed, so nothing is left running (:func:`stop_ray`,
:func:`kill_group`).

Finding and stopping the processes a local run started is read from /proc: by what their
command line names, with their descendants, and a local Ray head in the order ``ray stop``
uses. Linux only, as the local services are.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, TypeVar

from raytrain_eks.backends.eks import EXIT_UNREACHABLE

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


def process_started(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (proc(5): ``/proc/PID/stat``
    field 22, counted after the parenthesised command name); None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def same_process(pid: int, started: str | None) -> bool:
    """``pid`` is the process that wrote a record naming it (a submit's ``local.json``, a warm
    head's FILE): alive, and (where /proc tells) started when it was; a reused pid is another process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or process_started(pid) in (None, started)


def write_record(path: Path, record: dict) -> None:
    """Write a record naming a process (a submit's ``local.json``, a warm head's FILE) whole or
    not at all, mode 0600 (a head's token may be in it): the run commands and a second submit
    poll these files while they are written, and a half-written one reads as broken JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)  # created afresh: O_CREAT's mode applies to a new file only
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
            handle.write("\n")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


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


LOOPBACK = "127.0.0.1"


PICKED_PORTS = range(20000, 32768)
"""Where :func:`free_port` picks: between Ray's default worker range (10002-19999, which Ray
refuses a metrics port in) and Linux's ephemeral range (32768-60999), from which the OS gives
every ``bind(0)`` and outgoing connection its port, Ray's workers' own among them. A port picked
here and bound seconds later (``ray start`` on a busy machine) is not taken meanwhile by one of
those; only another explicit pick could take it."""


def free_port() -> int:
    """A loopback port of :data:`PICKED_PORTS` that is free now, chosen at random so two
    processes picking at once rarely choose the same one."""
    import random

    for _ in range(200):
        port = random.randrange(PICKED_PORTS.start, PICKED_PORTS.stop)
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {PICKED_PORTS.start}-{PICKED_PORTS.stop - 1} on {LOOPBACK}")


LOCAL_CPUS = 4
"""Logical CPUs of the local head: the local job's 2 workers and its driver."""


class HeadUnreachable(RuntimeError):
    """A local Ray head does not answer (a live run's, dead before its submit; a warm one's):
    one line, and the CLI exits :attr:`exit_code`, as for a cluster kubectl cannot reach."""

    exit_code = EXIT_UNREACHABLE


class ServiceStartError(RuntimeError):
    """A local service did not start: its process exited, or it did not answer within its wait."""


START_ATTEMPTS = 3
"""How often a local service is started before its failure is reported. On a loaded machine a
start can miss a wait that is not ours to lengthen (ray 2.58 ``_private/node.py``
``Node.__init__``: the raylet must register with the GCS within a fixed 30 s), or a picked port
can be taken before it is bound; a fresh start, with fresh ports and a longer wait, succeeds."""

_Started = TypeVar("_Started")


def start_with_retries(start: Callable[[int], _Started], what: str, attempts: int = START_ATTEMPTS) -> _Started:
    """``start(attempt)`` (1, 2, ...) until one returns. A start raises :class:`ServiceStartError`
    after stopping what it began; that is retried, anything else (a bug) is raised at once. After
    ``attempts`` failures: one :class:`ServiceStartError` naming ``what`` and every attempt's error."""
    errors = []
    for attempt in range(1, attempts + 1):
        try:
            return start(attempt)
        except ServiceStartError as err:
            errors.append(f"attempt {attempt}: {err}")
    raise ServiceStartError(f"{what} did not start in {attempts} attempts: " + "; ".join(errors))


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None, what: str,
               headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceStartError(f"{what} exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise ServiceStartError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


USER_CREDENTIAL_VARIABLES = (
    "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
"""The user's AWS credentials (botocore's credential providers read these). A local run talks to
moto only (its keys come from :attr:`S3Server.client_env`), and Ray writes every worker's
environment into logs under its temp dir, readable by other users of the machine: they stay out."""


def without_user_credentials(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` less the user's AWS credentials (:data:`USER_CREDENTIAL_VARIABLES`) and keys."""
    drop = {*USER_CREDENTIAL_VARIABLES, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    return {k: v for k, v in environ.items() if k not in drop}


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    @property
    def client_env(self) -> dict[str, str]:
        """Environment for any S3 client (boto3, pyarrow, Ray) to use this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }


@contextlib.contextmanager
def s3_server(port: int | None = None) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (``port``, or one picked per attempt), stopped on exit."""
    moto = Path(sys.executable).with_name("moto_server")

    def start(attempt: int) -> tuple[subprocess.Popen, str]:
        chosen = port or free_port()
        # Without the user's AWS credentials, as the head: moto needs none, and its error answers
        # (a GetObject of a missing key) build a botocore session that resolves AWS_PROFILE (moto
        # 5.2.5 moto/core/serialize.py _serialize_error -> botocore session.py
        # get_scoped_config): a profile this machine does not define turns every one into a 500.
        proc = subprocess.Popen([str(moto), "-H", LOOPBACK, "-p", str(chosen)], start_new_session=True,
                                env=without_user_credentials(dict(os.environ)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://{LOOPBACK}:{chosen}"
        try:
            _wait_http(f"{url}/moto-api/", 60 * attempt, proc, "moto S3 server")
        except BaseException:
            kill_group(proc)
            raise
        return proc, url

    proc, url = start_with_retries(start, "moto S3 server")
    try:
        yield S3Server(endpoint_url=url)
    finally:
        kill_group(proc)


AUTH_MODE = "token"
"""Ray's authentication mode on the local head: the same as on EKS (the RayClusters' authOptions)."""


@dataclass(frozen=True)
class RayHead:
    gcs_address: str
    dashboard_url: str
    temp_dir: str
    metrics_url: str = ""
    """The node's Prometheus endpoint (Ray's metrics agent): Ray's metrics and the job's."""
    auth_token: str = field(default="", repr=False)

    @property
    def client_env(self) -> dict[str, str]:
        """What any Ray client (``ray job submit``, ``JobSubmissionClient``) needs to be let in."""
        return {"RAY_AUTH_MODE": AUTH_MODE, "RAY_AUTH_TOKEN": self.auth_token}


def dashboard_url(port: int) -> str:
    """The head's dashboard (job API and state API) on loopback."""
    return f"http://{LOOPBACK}:{port}"


NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
"""No idle Python workers started ahead of demand. Both are the raylet's config (``RayConfig``,
upstream ``src/ray/common/ray_config_def.h``, both default true; the names are in ray 2.58's
``core/src/ray/raylet/raylet`` binary): with ``enable_worker_prestart`` the raylet starts
default workers of its own accord and, per lease request, more for the request's backlog
(``node_manager.cc`` ``HandleRequestWorkerLease`` -> ``WorkerPool::PrestartWorkers``);
``prestart_worker_first_driver`` starts up to ``--num_prestart_python_workers`` (the node's CPUs:
ray 2.58 ``_private/services.py`` ``start_raylet``) when the first driver registers. A local
head's work all runs in its jobs' runtime envs (the job supervisor's and the job's own
``env_vars``), and an idle worker serves only a lease of its own runtime env, so those workers
mostly idle on for the head's life. Measured on ray 2.58 (the head's process tree sampled from
/proc): a one-line ``ray job submit`` on this head left 2 ``ray::IDLE`` processes never given work
(~1 CPU-s of start-up, ~1 more idling through the next minute), none with these. Without them a
worker starts when a lease needs it, as the lease would have waited for it anyway on a machine this
small. The caller's
environment (or ``env`` of :func:`ray_head`) may set either back."""


def _start_head(num_cpus: int, env: dict[str, str] | None, temp_dir: str, token: str, log) -> tuple:
    """``ray start --head`` with ports picked now: ``(gcs port, dashboard port, agent ports, the
    running ``ray start``)``."""
    gcs_port, dash_port = free_port(), free_port()
    # Our own ports for every listener, so a test's Ray cluster on the same machine never clashes.
    agent_ports = {flag: free_port() for flag in (
        "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port", "--ray-client-server-port")}
    # The node's metrics agent (what Prometheus scrapes on EKS), on loopback like everything else.
    agent_ports["--metrics-export-port"] = free_port()
    # Token auth as on EKS, with a token of this head's own. On a busy 2-core machine the
    # dashboard's module processes can take longer than Ray's default 30 s to come up.
    child_env = {
        # Workers push their metrics to the node's agent every 10 s by default (ray 2.58
        # ``metrics_report_interval_ms``); a local job is short: every second, unless set.
        "RAY_metrics_report_interval_ms": "1000",
        **NO_PRESTART,
        **without_user_credentials(os.environ), **(env or {}), "RAY_AUTH_MODE": AUTH_MODE, "RAY_AUTH_TOKEN": token,
                 "RAY_USAGE_STATS_ENABLED": "0",
                 "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "300",
                 # The dashboard's and the autoscaler's own metrics servers default to fixed
                 # ports (ray/dashboard/consts.py DASHBOARD_METRIC_PORT 44227,
                 # ray/autoscaler/_private/constants.py AUTOSCALER_METRIC_PORT 44217): a second
                 # head would fail to bind them and register the first head's address.
                 "DASHBOARD_METRIC_PORT": str(free_port()), "AUTOSCALER_METRIC_PORT": str(free_port()),
                 # Where Ray's state API is, for every process this head starts: asked with no
                 # address (Ray Train's PlacementGroupCleaner actor does), Ray 2.58 otherwise scans
                 # the machine's raylets (ray/dashboard/utils.py get_address_for_submission_client)
                 # and fails while another Ray instance runs on it.
                 "RAY_API_SERVER_ADDRESS": dashboard_url(dash_port),
                 # The job's `python` must be this environment's, as the image's is on EKS.
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    ray = Path(sys.executable).with_name("ray")
    # Not --block: with --block, ANY Ray subprocess that exits (the Ray Client server often
    # times out on a busy 2-core machine, and we never use it) takes the whole head down.
    # Everything Ray starts names our unique temp dir, which is how we stop it precisely.
    cmd = [str(ray), "start", "--head", f"--node-ip-address={LOOPBACK}", f"--port={gcs_port}",
           f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=true",
           f"--dashboard-host={LOOPBACK}", f"--dashboard-port={dash_port}", f"--temp-dir={temp_dir}",
           # Workers' own gRPC ports from the OS, as ray.init's local clusters get them: `ray start`
           # defaults to the fixed range 10002-19999, which a second head on the machine shares
           # (a process of one then fails to bind a port a worker of the other holds). With a
           # minimum of 0 the raylet keeps no port pool and workers bind OS-assigned ports
           # (ray-project/ray 2.58, src/ray/raylet/worker_pool.cc, WorkerPool(): the pool
           # free_ports_ is built only for a non-zero range or an explicit list).
           "--min-worker-port=0", "--max-worker-port=0",
           "--disable-usage-stats", *(f"{flag}={port}" for flag, port in agent_ports.items())]
    proc = subprocess.Popen(cmd, env=child_env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    return gcs_port, dash_port, agent_ports, proc


def _stop_head(temp_dir: str, gcs_port: int, proc: subprocess.Popen) -> None:
    stop_ray(temp_dir, f"{LOOPBACK}:{gcs_port}")
    kill_group(proc, marker=temp_dir)  # whatever is left: nothing of this head stays running


@contextlib.contextmanager
def ray_head(num_cpus: int, env: dict[str, str] | None = None, keep_logs: Path | None = None) -> Iterator[RayHead]:
    """A local Ray head with ``num_cpus`` logical CPUs; ``env`` reaches every Ray worker.
    ``keep_logs``: a directory that receives Ray's session logs when the head stops."""
    temp_dir = tempfile.mkdtemp(prefix="rtd-", dir="/tmp")  # short: Ray's socket paths are limited
    token = secrets.token_hex(32)
    log = open(Path(temp_dir) / "ray-start.log", "a")

    def start(attempt: int) -> tuple[RayHead, subprocess.Popen, int]:
        # Ports are picked here and bound by Ray seconds later: on a busy machine another process
        # can take one in between (`ray start` exits 1), or Ray's own fixed waits run out; the
        # next attempt picks its ports afresh and waits longer.
        gcs_port, dash_port, agent_ports, proc = _start_head(num_cpus, env, temp_dir, token, log)
        try:
            code = proc.wait(timeout=600 * attempt)
            if code != 0:
                log.flush()
                tail = " | ".join((Path(temp_dir) / "ray-start.log").read_text(errors="replace")
                                  .strip().splitlines()[-4:])
                raise ServiceStartError(f"ray start exited {code}: {tail}")
            dashboard = dashboard_url(dash_port)
            _wait_http(f"{dashboard}/api/version", 360 * attempt, None, "Ray head",
                       {"Authorization": f"Bearer {token}"})
        except subprocess.TimeoutExpired as err:
            _stop_head(temp_dir, gcs_port, proc)
            raise ServiceStartError(f"ray start did not return within {err.timeout:.0f} s") from err
        except BaseException:
            _stop_head(temp_dir, gcs_port, proc)  # what a half-started head left
            raise
        head = RayHead(gcs_address=f"{LOOPBACK}:{gcs_port}", dashboard_url=dashboard, temp_dir=temp_dir,
                       metrics_url=f"http://{LOOPBACK}:{agent_ports['--metrics-export-port']}/metrics",
                       auth_token=token)
        return head, proc, gcs_port

    try:
        head, proc, gcs_port = start_with_retries(start, "Ray head")
    except BaseException:
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    try:
        yield head
    finally:
        _stop_head(temp_dir, gcs_port, proc)
        log.close()
        if keep_logs is not None:
            logs = Path(temp_dir) / "session_latest" / "logs"
            with contextlib.suppress(OSError):
                shutil.copytree(logs if logs.is_dir() else temp_dir, keep_logs, dirs_exist_ok=True,
                                ignore_dangling_symlinks=True, symlinks=False)
            with contextlib.suppress(OSError):
                shutil.copy(Path(temp_dir) / "ray-start.log", keep_logs)
        shutil.rmtree(temp_dir, ignore_errors=True)
