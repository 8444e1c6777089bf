"""`raytrain-eks capacity`: which AZs offer the GPU instance types, and which of the account's
capacity reservations and Capacity Blocks match a GPU group (read-only EC2 calls)."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from environment import load_environment
    from raytrain_eks.capacity import report

    env = load_environment(args.env)
    try:
        lines, ok = report(env, boto3.client("ec2", region_name=env.cluster.region))
    except (BotoCoreError, ClientError) as err:
        print(f"error: EC2: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if not ok:
        print(f"error: {env.source}: cluster.gpu_availability_zone: {env.cluster.gpu_availability_zone!r} "
              "does not offer every GPU group's instance type (see above)", file=sys.stderr)
        return 2
    return 0
