"""`raytrain-eks logs RUN [--follow]`: the run's driver log.

A local run (``submit --local``): from its Ray head while it runs, then the copy in its results
folder. An EKS run: kubectl streams the RayJob's submitter while its pod exists; after that, or
when no cluster answers (destroyed, expired credentials, no kubectl), the copy the job left in
the run's storage (``<run>/logs/driver.log``, written before the cluster goes), and when storage
cannot be read either, the copy ``submit`` made in ``.work/runs/<run>/logs/``.

Exit codes: 0 printed, 2 no log anywhere, 5 neither the cluster nor storage could be reached."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from raytrain_eks.eks_backend import add_run_arguments

    add_run_arguments(parser)
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")


def _stored(env, run: str) -> tuple[str | None, str]:
    """(the driver log from the run's storage or None, why not)."""
    from raytrain_eks.run_results import read_file, s3_client
    from training.run_record import RUN_LOGS_DIR
    from training.run_storage import RunStorage

    uri = f"{RunStorage(env.storage_uri).run(run)}/{RUN_LOGS_DIR}/driver.log"
    try:
        return read_file(s3_client(region=env.cluster.region), uri).decode("utf-8", errors="replace"), ""
    except Exception as err:  # noqa: BLE001 - botocore's errors (no such key, no credentials, no network) alike
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None, f"{uri} ({first[:200]})"


def run(args: argparse.Namespace) -> int:
    from raytrain_eks import local_runs

    local = local_runs.find(args.run)
    if local is not None:
        text = local_runs.log(local, follow=args.follow)
        if text is None:
            print(f"error: logs: local run {args.run!r} left no log in {local.folder / 'logs'}", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    from environment import load_environment
    from raytrain_eks import eks_backend as eks

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
    text, why = _stored(env, args.run)
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
    print(f"error: logs: run {args.run!r} has no submitter pod{' (the cluster does not answer)' if unreachable else ''} "
          f"and no {why}", file=sys.stderr)
    return eks.EXIT_UNREACHABLE if unreachable and "NoSuchKey" not in why else 2
