"""`raytrain-eks logs RUN [--follow]`: the run's driver log. While the RayJob's submitter pod
exists, kubectl streams it; after that, the copy the job left in the run's storage
(``<run>/logs/``, written before the cluster goes).

Exit codes: 0 printed, 2 neither the pod nor a stored log exists."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from raytrain_eks.eks_backend import add_run_arguments

    add_run_arguments(parser)
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")


def run(args: argparse.Namespace) -> int:
    from environment import load_environment
    from raytrain_eks import eks_backend as eks
    from raytrain_eks.run_results import s3_client, split_uri
    from training.run_logs import RUN_LOGS_DIR

    env = load_environment(args.env)
    found = eks.find_rayjob(args.run, env.ray.namespace)
    if found is not None:
        proc = eks.kubectl("logs", *(["-f"] if args.follow else []), f"job/{found[0]}", "-n", env.ray.namespace,
                           check=False, capture=False)
        if proc.returncode == 0:
            return 0
    bucket, key = split_uri(f"{env.storage_uri}/{args.run}/{RUN_LOGS_DIR}/driver.log")
    client = s3_client(region=env.cluster.region)
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        if found is not None:
            # KubeRay creates the submitter Job (named after the RayJob) only once the cluster is
            # ready (rayjob_controller.go:230-232, 724): before that there is no log anywhere yet.
            deployment, job_status = eks.phase(found[1])
            print(f"error: logs: run {args.run!r} is {deployment}{' / ' + job_status if job_status else ''}: "
                  f"no log yet (raytrain-eks status {args.run})", file=sys.stderr)
            return 2
        print(f"error: logs: run {args.run!r} has no submitter pod and no s3://{bucket}/{key}", file=sys.stderr)
        return 2
    sys.stdout.write(body.decode("utf-8", errors="replace"))
    return 0
