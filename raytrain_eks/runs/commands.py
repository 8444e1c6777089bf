"""The commands acting on a submitted run: ``status``, ``logs``, ``stop`` and ``list``, each a
class with the ``add_arguments(parser)`` and ``run(args)`` pair raytrain_eks/cli.py calls.

A local run (``submit --local``) is answered by its own Ray head while it runs, then by the
records it copied out. Its Ray head and storage live as long as its submit. While it runs,
``local.json`` in its results folder (``.work/runs/<run>/``, written once the head is up,
readable by this user only: it holds the head's token) names the submit's process and the head's
dashboard, so the commands ask the head itself (Ray's ``JobSubmissionClient``: status, logs,
``stop_job``). Once the submit has ended, the folder holds what it copied out: ``ray_job.json``
(the Ray job's final status), ``run.json`` (the verdict) and ``logs/driver.log``. No kubectl, no
cluster. An EKS run is answered by its RayJob (KubeRay's status) through kubectl.

Stopping an EKS run (``stop``, and a deadline's release in ``status`` and ``submit``): its Ray job
is stopped through its own head, and waited for until terminal, BEFORE its RayJob is deleted
(:func:`stop_ray_job_first`). Deleting the RayJob alone is not enough on a run's OWN cluster:
KubeRay v1.7.0's finalizer calls the dashboard's StopJob, which returns at once, and removes the
finalizer in the same reconcile (``ray-operator/controllers/ray/rayjob_controller.go:112-138``); the
RayCluster the RayJob owns is then deleted, and each Ray container's PID 1 (``ray start --block``)
drains for at most ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` = 30 s on SIGTERM (ray 2.58
``_private/ray_constants.py:40``, ``_private/node.py:629-664``) before the driver dies: the final
checkpoint would get ~30 s, not the job's stop wait. ``ray job stop`` in the head container asks the
job supervisor to stop the job and polls until it is STOPPED/SUCCEEDED/FAILED (ray 2.58
``dashboard/modules/job/cli.py:448-466``), so the job's own stop wait (``RAY_JOB_STOP_WAIT_TIME_S``,
charts/ray_charts.py) runs in full. A ``clusterSelector`` cluster outlives the RayJob: KubeRay's StopJob
suffices there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from raytrain_eks.backends.eks import DEADLINE_REASONS, EXIT_UNREACHABLE, TERMINAL_JOB_STATUSES, kubectl

ROOT = Path(__file__).resolve().parents[2]
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


def local_status(found: LocalRun) -> dict[str, str]:
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


def local_log(found: LocalRun, *, follow: bool) -> str | None:
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


def local_stop(found: LocalRun) -> bool:
    """Stop the run's Ray job through the head (``JobSubmissionClient.stop_job``: SIGTERM to the
    driver, SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``); its submit then copies what the run
    wrote and stops the head and the storage. False when the run had already ended."""
    if not found.live:
        return False
    with _client(found) as client:
        return bool(client.stop_job(found.live["submission_id"]))


# An EKS run's Ray job stopped through its head before its RayJob goes.

HEAD_CONTAINER = "ray-head"
"""The head pod's Ray container (charts/cluster_spec.py ``RAY_CONTAINER_HEAD``)."""
DASHBOARD = "http://127.0.0.1:8265"
"""The job API, from inside the head container."""
MARGIN_S = 60
"""Beyond the job's stop wait: kubectl exec's start and Ray's 1 s polls."""
DEFAULT_STOP_WAIT_S = 600
"""A RayJob whose runtime env names no stop wait (made by hand): a generous bound."""


def stop_wait_s(rayjob: dict[str, Any]) -> int:
    """The job's ``RAY_JOB_STOP_WAIT_TIME_S`` from its runtime env (charts/ray_charts.py sets it)."""
    import yaml

    env = (yaml.safe_load((rayjob.get("spec") or {}).get("runtimeEnvYAML") or "") or {}).get("env_vars") or {}
    try:
        return int(env["RAY_JOB_STOP_WAIT_TIME_S"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_STOP_WAIT_S


def stop_ray_job_first(rayjob: dict[str, Any], namespace: str, say: Callable[[str], None]) -> None:
    """On a run's own cluster, once ready, with its Ray job not terminal: ``ray job stop`` in the head
    container (through KubeRay's head service, ``<cluster>-head-svc``), returning when the job
    is terminal or its stop wait and :data:`MARGIN_S` have passed. Failing here only says so:
    the RayJob's deletion (KubeRay's StopJob) still follows."""
    status, spec = rayjob.get("status") or {}, rayjob.get("spec") or {}
    # dashboardURL: KubeRay sets it once the cluster is ready (before it, no head to ask); an
    # empty jobStatus is a job KubeRay has not read yet, which may run all the same
    if spec.get("clusterSelector") or not status.get("dashboardURL") or status.get("jobStatus") in TERMINAL_JOB_STATUSES:
        return
    cluster, job_id = status.get("rayClusterName"), status.get("jobId")
    if not cluster or not job_id:
        return
    bound = stop_wait_s(rayjob) + MARGIN_S
    say(f"    stopping Ray job {job_id} through its head (final checkpoint; at most {bound} s)")
    try:
        proc = kubectl("exec", f"svc/{cluster}-head-svc", "-n", namespace, "-c", HEAD_CONTAINER, "--",
                       "ray", "job", "stop", "--address", DASHBOARD, job_id, check=False, timeout=bound)
    except subprocess.TimeoutExpired:
        say(f"    Ray job {job_id} not stopped within {bound} s: deleting its RayJob anyway")
        return
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        say(f"    ray job stop failed ({lines[-1] if lines else f'exit {proc.returncode}'}): deleting its RayJob anyway")


def release_after_deadline(name: str, namespace: str, rayjob: dict[str, Any], say: Callable[[str], None]) -> bool:
    """Delete a RayJob that failed on a deadline (:data:`DEADLINE_REASONS`); True if it did."""
    status = rayjob.get("status") or {}
    if status.get("jobDeploymentStatus") != "Failed" or status.get("reason") not in DEADLINE_REASONS:
        return False
    stop_ray_job_first(rayjob, namespace, say)  # its own cluster: a full stop wait, not ~30 s
    kubectl("delete", "rayjob", name, "-n", namespace, "--wait=false", "--ignore-not-found")
    say(f"    {status['reason']}: RayJob {name} deleted, so KubeRay stops its Ray job (final checkpoint) "
        "and its GPUs are freed; its checkpoints stay")
    return True


def _print(fields: dict[str, str], output: str) -> None:
    if output == "json":
        print(json.dumps(fields, indent=2))
        return
    for key, value in fields.items():
        if value:
            print(f"{key:<10} {value}")


class Status:
    """`raytrain-eks status RUN [-o json]`: where a submitted run stands. A local run is
    answered by its own Ray head while it runs, then by the records it copied out; an EKS run by
    its RayJob (KubeRay's status).

    Exit codes: 0 found, 2 no such run, 5 the cluster could not be reached."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from raytrain_eks.backends.eks import add_run_arguments

        add_run_arguments(parser)
        parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        local = find(args.run)
        if local is not None:
            _print(local_status(local), args.output)
            return 0
        from environment import load_environment
        from raytrain_eks.backends import eks

        env = load_environment(args.env)
        found = eks.find_rayjob(args.run, env.ray.namespace)
        rayjob = found[1] if found else None
        if rayjob is None:
            print(f"error: status: no RayJob {args.run!r} in namespace {env.ray.namespace} and no local run "
                  f"{args.run!r} (raytrain-eks list)", file=sys.stderr)
            return 2
        deployment, job_status = eks.phase(rayjob)
        status = rayjob.get("status") or {}
        fields = {"run": args.run, "backend": "eks",
                  "status": f"{deployment}{' / ' + job_status if job_status else ''}"}
        for label, key in (("cluster", "rayClusterName"), ("started", "startTime"), ("ended", "endTime"),
                           ("reason", "reason"), ("message", "message"), ("dashboard", "dashboardURL")):
            fields[label] = status.get(key, "")
        waits = (eks.pod_waits(status.get("rayClusterName", ""), env.ray.namespace)
                 if deployment == "Initializing" else [])
        fields["waiting"] = "; ".join(waits)
        if (rayjob.get("spec") or {}).get("suspend"):  # held by Kueue: where it waits in the queue
            from raytrain_eks.backends.kueue_queue import describe, place_of

            place = place_of(found[0], env.ray.namespace)
            fields["queue"] = describe(place) if place else "suspended, with no Kueue Workload"
        fields["storage"] = f"{env.storage_uri}/{args.run}"
        _print(fields, args.output)
        # a RayJob past its deadline is deleted so its Ray job stops (KubeRay only marks it Failed)
        release_after_deadline(found[0], env.ray.namespace, rayjob,
                               print if args.output == "text" else (lambda line: print(line, file=sys.stderr)))
        return 0


def _stored_log(env, run: str) -> tuple[str | None, str]:
    """(the driver log from the run's storage or None, why not)."""
    from raytrain_eks.runs.results import read_file, s3_client
    from training.run_logs import RUN_LOGS_DIR
    from training.storage import RunStorage

    uri = f"{RunStorage(env.storage_uri).run(run)}/{RUN_LOGS_DIR}/driver.log"
    try:
        return read_file(s3_client(region=env.cluster.region), uri).decode("utf-8", errors="replace"), ""
    except Exception as err:  # noqa: BLE001 - botocore's errors (no such key, no credentials, no network) alike
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None, f"{uri} ({first[:200]})"


class Logs:
    """`raytrain-eks logs RUN [--follow]`: the run's driver log.

    A local run: from its Ray head while it runs, then the copy in its results folder. An EKS
    run: kubectl streams the RayJob's submitter while its pod exists; after that, or when no
    cluster answers (destroyed, expired credentials, no kubectl), the copy the job left in the
    run's storage (``<run>/logs/driver.log``, written before the cluster goes), and when storage
    cannot be read either, the copy ``submit`` made in ``.work/runs/<run>/logs/``.

    Exit codes: 0 printed, 2 no log anywhere, 5 neither the cluster nor storage could be reached."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from raytrain_eks.backends.eks import add_run_arguments

        add_run_arguments(parser)
        parser.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        local = find(args.run)
        if local is not None:
            text = local_log(local, follow=args.follow)
            if text is None:
                print(f"error: logs: local run {args.run!r} left no log in {local.folder / 'logs'}", file=sys.stderr)
                return 2
            sys.stdout.write(text)
            return 0
        from environment import load_environment
        from raytrain_eks.backends import eks

        env = load_environment(args.env)
        try:
            found = eks.find_rayjob(args.run, env.ray.namespace)
            unreachable = ""
        except eks.KubectlError as err:
            found, unreachable = None, str(err)
        if found is not None:
            proc = eks.kubectl("logs", *(["-f"] if args.follow else []), f"job/{found[0]}", "-n", env.ray.namespace,
                               check=False, capture=False)
            if proc.returncode == 0:
                return 0
        if unreachable:
            print(f"logs: the cluster does not answer ({unreachable}); reading the stored copy", file=sys.stderr)
        text, why = _stored_log(env, args.run)
        if text is None:
            copy = RUNS_DIR / args.run / "logs" / "driver.log"
            if copy.is_file():
                print(f"logs: storage not readable ({why}); the copy submit made: {copy}", file=sys.stderr)
                text = copy.read_text(encoding="utf-8", errors="replace")
        if text is not None:
            sys.stdout.write(text)
            return 0
        if found is not None:
            # KubeRay creates the submitter Job (named after the RayJob) only once the cluster is
            # ready (rayjob_controller.go:230-232, 724): before that there is no log anywhere yet.
            deployment, job_status = eks.phase(found[1])
            print(f"error: logs: run {args.run!r} is {deployment}{' / ' + job_status if job_status else ''}: "
                  f"no log yet (raytrain-eks status {args.run})", file=sys.stderr)
            return 2
        print(f"error: logs: run {args.run!r} has no submitter pod"
              f"{' (the cluster does not answer)' if unreachable else ''} and no {why}", file=sys.stderr)
        return eks.EXIT_UNREACHABLE if unreachable and "NoSuchKey" not in why else 2


class Stop:
    """`raytrain-eks stop RUN`: stop a run.

    A local run is stopped through its own Ray head (``JobSubmissionClient.stop_job``); its
    submit then copies what the run wrote and stops the head and the storage. On EKS, the run's
    RayJob is deleted: KubeRay v1.7.0 stops the Ray job first when it is not finished
    (``rayjob_controller.go``: the RayJobStopJobFinalizer calls the dashboard's StopJob), also on
    the long-lived RayCluster, which stays; a run's own cluster (owned by its RayJob,
    rayjob_controller.go:1021) goes after it (background deletion, so the finalizer's StopJob
    runs before the collector deletes the cluster). The run's storage (checkpoints, run.json)
    stays: ``submit --resume RUN`` continues it.

    Exit codes: 0 stopped, 2 no such run (or a local run that has already ended), 5 the cluster
    could not be reached."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from raytrain_eks.backends.eks import add_run_arguments

        add_run_arguments(parser)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        local = find(args.run)
        if local is not None:
            if not local_stop(local):
                print(f"error: stop: local run {args.run!r} has already ended ({local.folder})", file=sys.stderr)
                return 2
            print(f"stopped {args.run}: its Ray job was asked to stop; its submit copies what it wrote to {local.folder}")
            return 0
        from environment import load_environment
        from environment.network_policy import ray_cluster_policy, rayjob_label
        from raytrain_eks.backends import eks

        env = load_environment(args.env)
        namespace = env.ray.namespace
        found = eks.find_rayjob(args.run, namespace)
        if found is None:
            print(f"error: stop: no RayJob {args.run!r} in namespace {namespace} (raytrain-eks list)", file=sys.stderr)
            return 2
        # Background, not foreground: with foreground the garbage collector deletes what the RayJob
        # owns (its own RayCluster, the submitter Job; rayjob_controller.go:1021, 743) while the
        # RayJob waits, racing KubeRay's finalizer, whose StopJob then finds no head
        # (rayjob_controller.go:112-138). Background: StopJob first, the RayJob goes, then the
        # collector deletes its cluster. A clusterSelector cluster is not owned: it stays.
        stop_ray_job_first(found[1], namespace, print)  # its own cluster: a full stop wait, not ~30 s
        eks.kubectl("delete", "rayjob", found[0], "-n", namespace, "--cascade=background", "--wait=true")
        policy = ray_cluster_policy(rayjob_label(args.run), namespace)["metadata"]["name"]
        eks.kubectl("delete", "networkpolicy", policy, "-n", namespace, "--ignore-not-found")
        print(f"stopped {args.run}: RayJob deleted (KubeRay stops the Ray job); storage kept: "
              f"{env.storage_uri}/{args.run} (raytrain-eks submit JOB --resume {args.run})")
        return 0


COLUMNS = ("run", "job config", "status", "job status", "queue", "started")
"""The columns of ``list``."""


def rayjob_rows(items: list[dict], workloads: list[dict] | None) -> list[tuple[str, ...]]:
    """One :data:`COLUMNS` row per RayJob, newest first; ``workloads``: Kueue's, for the queue column."""
    from environment.contract import JOB_CONFIG_ANNOTATION
    from raytrain_eks.backends.eks import phase
    from raytrain_eks.backends.kueue_queue import column, places

    queue = places(workloads or [])
    out = []
    for item in items:
        meta = item.get("metadata") or {}
        deployment, job_status = phase(item)
        out.append((meta.get("name", ""), (meta.get("annotations") or {}).get(JOB_CONFIG_ANNOTATION, ""), deployment,
                    job_status or "-", column(queue.get(meta.get("name", "")), deployment),
                    (item.get("status") or {}).get("startTime") or "-"))
    return sorted(out, key=lambda r: r[-1], reverse=True)


def local_rows() -> list[tuple[str, ...]]:
    """One :data:`COLUMNS` row per local run."""
    out = []
    for found in all_runs():
        final = found.final
        state = "Running (local)" if found.live else "Ended (local)"
        job_status = final.get("status", "-") if not found.live else "RUNNING"
        started = str(found.record.get("start_time") or "-")
        out.append((found.run, final.get("entrypoint", "").split("--config ", 1)[-1].split(" ", 1)[0] or "-",
                    state, job_status, "-", started))
    return out


class List:
    """`raytrain-eks list [-o json]`: the submitted runs, newest first: the local runs (from
    ``.work/runs/``) and the RayJobs the cluster knows: run, job config, status, place in Kueue's
    queue (``queued N/M``: N-th to be admitted of M queued; ``admitted``;
    raytrain_eks/backends/kueue_queue.py), start time (KubeRay's: reset when the queue admits the run).
    Finished runs whose RayJob is gone are in storage: ``raytrain-eks runs s3://<bucket>/<prefix>``.

    Exit codes: 0 listed; 5 the cluster could not be reached and there is no local run to list."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--env", default="environment.toml", help="environment spec (default environment.toml)")
        parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from environment import load_environment
        from raytrain_eks.backends.eks import KubectlError, list_rayjobs
        from raytrain_eks.backends.kueue_queue import list_workloads

        env = load_environment(args.env)
        table = local_rows()
        try:
            table += rayjob_rows(list_rayjobs(env.ray.namespace), list_workloads(env.ray.namespace))
        except KubectlError as err:
            print(f"list: the cluster's runs are not listed ({err})", file=sys.stderr)
            if not table:
                return err.exit_code
        if args.output == "json":
            print(json.dumps([dict(zip(COLUMNS, r)) for r in table], indent=2))
            return 0
        table = [COLUMNS, *table]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        for line in table:
            print("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
        return 0
