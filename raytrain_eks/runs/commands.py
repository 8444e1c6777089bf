"""The commands acting on a submitted run: ``status``, ``logs``, ``stop`` and ``list``, each a
class with the ``add_arguments(parser)`` and ``run(args)`` pair raytrain_eks/cli.py calls.

A local run is answered by its own Ray head while its submit runs, then by the records it
copied out (raytrain_eks/backends/local.py); an EKS run by its RayJob (KubeRay's status) through
kubectl, its Ray job stopped through its head before its RayJob goes
(raytrain_eks/backends/eks.py :func:`~raytrain_eks.backends.eks.stop_ray_job_first`).
"""
from __future__ import annotations

import argparse
import json
import sys

from raytrain_eks.backends import local as local_runs
from raytrain_eks.backends.eks import release_after_deadline, stop_ray_job_first
from raytrain_eks.backends.local import all_runs, find, local_log, local_status, local_stop


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
    """(the driver log from the run's storage or None, why not): its own cluster's folder, else
    the folder it has on the long-lived cluster (the RayJob that said which may be gone)."""
    from environment.contract import run_folder
    from raytrain_eks.runs.results import read_file, s3_client
    from training.run_logs import RUN_LOGS_DIR
    from training.storage import RunStorage

    whys = []
    for on_cluster in (False, True):
        uri = f"{RunStorage(env.storage_uri).run(run_folder(run, on_cluster=on_cluster))}/{RUN_LOGS_DIR}/driver.log"
        try:
            return read_file(s3_client(region=env.cluster.region), uri).decode("utf-8", errors="replace"), ""
        except Exception as err:  # noqa: BLE001 - botocore's errors (no such key, no credentials, no network) alike
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            whys.append(f"{uri} ({first[:200]})")
    return None, "; ".join(whys)


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
            copy = local_runs.RUNS_DIR / args.run / "logs" / "driver.log"
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
        # People who only submit may not delete a policy (SUBMITTER_RULES): theirs stays, selecting
        # this RayJob's pods only, none once it is gone; a resume under the same name reuses it.
        if eks.kubectl("delete", "networkpolicy", policy, "-n", namespace, "--ignore-not-found",
                       check=False).returncode != 0:
            print(f"    network policy {policy} kept (deleting it is for the cluster's admins)")
        from environment.contract import ON_CLUSTER_SUFFIX

        if not found[0].endswith(ON_CLUSTER_SUFFIX):  # its own service account's association goes too
            eks.release_run_identity(eks.eks_api(env.cluster.region), cluster=env.cluster.eks_name,
                                     namespace=namespace, run=args.run,
                                     role=eks.caller_run_role(env.cluster.eks_name, env.cluster.region))
        from environment.contract import run_folder

        folder = run_folder(args.run, on_cluster=found[0].endswith(ON_CLUSTER_SUFFIX))
        print(f"stopped {args.run}: RayJob deleted (KubeRay stops the Ray job); storage kept: "
              f"{env.storage_uri}/{folder} (raytrain-eks submit JOB --resume {args.run})")
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
