"""`raytrain-eks list`: the submitted runs the cluster knows (their RayJobs), newest first:
run, job config, KubeRay's deployment and job status, start time. Finished runs whose RayJob is gone
are in storage: ``raytrain-eks runs s3://<bucket>/<prefix>``."""
from __future__ import annotations

import argparse

COLUMNS = ("run", "job config", "status", "job status", "started")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default environment.toml)")


def rows(items: list[dict]) -> list[tuple[str, ...]]:
    from environment.contract import JOB_CONFIG_ANNOTATION
    from raytrain_eks.eks_backend import phase

    out = []
    for item in items:
        meta = item.get("metadata") or {}
        deployment, job_status = phase(item)
        out.append((meta.get("name", ""), (meta.get("annotations") or {}).get(JOB_CONFIG_ANNOTATION, ""), deployment,
                    job_status or "-", (item.get("status") or {}).get("startTime") or "-"))
    return sorted(out, key=lambda r: r[4], reverse=True)


def run(args: argparse.Namespace) -> int:
    from environment import load_environment
    from raytrain_eks.eks_backend import list_rayjobs

    env = load_environment(args.env)
    table = [COLUMNS, *rows(list_rayjobs(env.ray.namespace))]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
    return 0
