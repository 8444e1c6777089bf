"""`raytrain-eks status RUN [-o json]`: where a submitted run stands. A local run
(``submit --local``) is answered by its own Ray head while it runs, then by the records it
copied out (raytrain_eks/local_runs.py); an EKS run by its RayJob (KubeRay's status).

Exit codes: 0 found, 2 no such run, 5 the cluster could not be reached."""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from raytrain_eks.eks_backend import add_run_arguments

    add_run_arguments(parser)
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")


def _print(fields: dict[str, str], output: str) -> None:
    if output == "json":
        print(json.dumps(fields, indent=2))
        return
    for key, value in fields.items():
        if value:
            print(f"{key:<10} {value}")


def run(args: argparse.Namespace) -> int:
    from raytrain_eks import local_runs

    local = local_runs.find(args.run)
    if local is not None:
        _print(local_runs.status(local), args.output)
        return 0
    from environment import load_environment
    from raytrain_eks import eks_backend as eks
    from raytrain_eks.ray_stop import release_after_deadline

    env = load_environment(args.env)
    found = eks.find_rayjob(args.run, env.ray.namespace)
    rayjob = found[1] if found else None
    if rayjob is None:
        print(f"error: status: no RayJob {args.run!r} in namespace {env.ray.namespace} and no local run "
              f"{args.run!r} (raytrain-eks list)", file=sys.stderr)
        return 2
    deployment, job_status = eks.phase(rayjob)
    status = rayjob.get("status") or {}
    fields = {"run": args.run, "backend": "eks", "status": f"{deployment}{' / ' + job_status if job_status else ''}"}
    for label, key in (("cluster", "rayClusterName"), ("started", "startTime"), ("ended", "endTime"),
                       ("reason", "reason"), ("message", "message"), ("dashboard", "dashboardURL")):
        fields[label] = status.get(key, "")
    waits = eks.pod_waits(status.get("rayClusterName", ""), env.ray.namespace) if deployment == "Initializing" else []
    fields["waiting"] = "; ".join(waits)
    if (rayjob.get("spec") or {}).get("suspend"):  # held by Kueue: where it waits in the queue
        from raytrain_eks.kueue_queue import describe, place_of

        place = place_of(found[0], env.ray.namespace)
        fields["queue"] = describe(place) if place else "suspended, with no Kueue Workload"
    fields["storage"] = f"{env.storage_uri}/{args.run}"
    _print(fields, args.output)
    # a RayJob past its deadline is deleted so its Ray job stops (KubeRay only marks it Failed)
    release_after_deadline(found[0], env.ray.namespace, rayjob,
                               print if args.output == "text" else (lambda line: print(line, file=sys.stderr)))
    return 0
