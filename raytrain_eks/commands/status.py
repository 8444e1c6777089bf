"""`raytrain-eks status RUN`: where a submitted run stands, from its RayJob (KubeRay's status)
and, once it wrote one, its run.json (the verdict).

Exit codes: 0 found, 2 no such run."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from raytrain_eks.eks_backend import add_run_arguments

    add_run_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from environment import load_environment
    from raytrain_eks import eks_backend as eks

    env = load_environment(args.env)
    found = eks.find_rayjob(args.run, env.ray.namespace)
    rayjob = found[1] if found else None
    if rayjob is None:
        print(f"error: status: no RayJob {args.run!r} in namespace {env.ray.namespace} (raytrain-eks list)", file=sys.stderr)
        return 2
    deployment, job_status = eks.phase(rayjob)
    status = rayjob.get("status") or {}
    print(f"run        {args.run}")
    print(f"status     {deployment}{' / ' + job_status if job_status else ''}")
    for label, key in (("cluster", "rayClusterName"), ("started", "startTime"), ("ended", "endTime"),
                       ("reason", "reason"), ("message", "message"), ("dashboard", "dashboardURL")):
        if status.get(key):
            print(f"{label:<10} {status[key]}")
    for line in eks.pod_waits(status.get("rayClusterName", ""), env.ray.namespace) if deployment == "Initializing" else []:
        print(f"waiting    {line}")
    print(f"storage    {env.storage_uri}/{args.run}")
    eks.release_after_deadline(found[0], env.ray.namespace, rayjob, print)
    return 0
