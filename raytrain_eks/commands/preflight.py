"""`raytrain-eks preflight`: check a job against the environment before any spend.

A job is sized to the environment by the charts' own function (charts/jobs.py: plan_job).
Checks world size vs GPUs, the image's Ray version vs the manifests' rayVersion (and the
installed Ray for local jobs), EFA requested vs available, a per-GPU memory estimate with its
breakdown, and the time per step, tokens per hour and cost of the run at a stated MFU. Prints
the report; a refused plan ends with one line on stderr saying why and exits 2.
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")
    parser.add_argument("job", nargs="?", metavar="JOB", help="job config, e.g. jobs/finetune-qwen2.5-1.5b.toml "
                        "(as submit takes it)")
    parser.add_argument("--job", dest="job_flag", metavar="JOB", help="the same, as a flag")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a job config field, e.g. --set train.seq_len=4096 (repeatable)")
    parser.add_argument("--dist", default="dist",
                        help="synthesized manifests to compare rayVersion with (default: %(default)s; skipped if absent)")
    parser.add_argument("--cdk-out", default="cdk.out",
                        help="synthesized CDK app whose node groups the scheduling-fit check uses "
                             "(default: %(default)s; skipped if absent)")
    parser.add_argument("--mfu", type=float, default=None,
                        help="model FLOPs utilisation assumed for the time and cost estimate (default: 0.30)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from charts.errors import ChartError
    from charts.jobs import plan_job
    from environment import load_environment
    from raytrain_eks.preflight import DEFAULT_MFU, render, run_preflight

    if bool(args.job) == bool(args.job_flag):
        print("error: preflight: name one job config: raytrain-eks preflight JOB (or --job JOB)", file=sys.stderr)
        return 2
    args.job = args.job or args.job_flag
    env = load_environment(args.env)
    try:  # the charts' own sizing: preflight checks exactly the shape they synthesize
        job = plan_job(env, Path(args.job), Path.cwd(), user_overrides=args.overrides).config
    except ChartError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        plan = run_preflight(env, job, dist_dir=args.dist, cdk_out=args.cdk_out,
                             mfu=DEFAULT_MFU if args.mfu is None else args.mfu)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(plan))
    if plan.refusal:
        print(plan.refusal, file=sys.stderr)
        return 2
    return 0
