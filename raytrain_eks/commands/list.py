"""`raytrain-eks list [-o json]`: the submitted runs, newest first: the local runs
(``submit --local``, from ``.work/runs/``) and the RayJobs the cluster knows: run, job config,
status, place in Kueue's queue (``queued N/M``: N-th to be admitted of M queued; ``admitted``;
raytrain_eks/kueue_queue.py), start time (KubeRay's: reset when the queue admits the run). Finished runs whose RayJob is gone are in storage:
``raytrain-eks runs s3://<bucket>/<prefix>``.

Exit codes: 0 listed; 5 the cluster could not be reached and there is no local run to list."""
from __future__ import annotations

import argparse
import json
import sys

COLUMNS = ("run", "job config", "status", "job status", "queue", "started")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default environment.toml)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")


def rows(items: list[dict], workloads: list[dict] | None) -> list[tuple[str, ...]]:
    from environment.contract import JOB_CONFIG_ANNOTATION
    from raytrain_eks.eks_backend import phase
    from raytrain_eks.kueue_queue import column, places

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
    from raytrain_eks import local_runs

    out = []
    for found in local_runs.all_runs():
        final = found.final
        state = "Running (local)" if found.live else "Ended (local)"
        job_status = final.get("status", "-") if not found.live else "RUNNING"
        started = str(found.record.get("start_time") or "-")
        out.append((found.run, final.get("entrypoint", "").split("--config ", 1)[-1].split(" ", 1)[0] or "-",
                    state, job_status, "-", started))
    return out


def run(args: argparse.Namespace) -> int:
    from environment import load_environment
    from raytrain_eks.eks_backend import KubectlError, list_rayjobs
    from raytrain_eks.kueue_queue import list_workloads

    env = load_environment(args.env)
    table = local_rows()
    try:
        table += rows(list_rayjobs(env.ray.namespace), list_workloads(env.ray.namespace))
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
