"""`raytrain-eks runs PREFIX [--job J] [--digest D] [--verdict V]`: every run under a storage
prefix (local or s3://) as one table: run, start time, image digest, commit, job, verdict,
tokens/s, held-out loss before -> after. "Which runs used this image" is
``raytrain-eks runs s3://<bucket>/runs --digest sha256:...``.
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", metavar="PREFIX", help="storage prefix holding run directories (local or s3://)")
    parser.add_argument("--job", help="only runs of this job (the job config's name)")
    parser.add_argument("--digest", help="only runs of this image digest (a prefix of it is enough)")
    parser.add_argument("--verdict", choices=("accepted", "rejected", "execution-failed", "none"),
                        help="only runs with this verdict (none: unfinished or older records)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")


def run(args: argparse.Namespace) -> int:
    from raytrain_eks.runs import filter_rows, list_runs, render_table

    try:
        rows = list_runs(args.prefix)
    except (FileNotFoundError, OSError) as err:
        print(f"error: runs: {args.prefix}: {err}", file=sys.stderr)
        return 2
    shown = filter_rows(rows, job=args.job, digest=args.digest, verdict=args.verdict)
    if args.output == "json":
        import json

        print(json.dumps(shown, indent=2))
        return 0
    print(render_table(shown))
    print(f"{len(shown)} of {len(rows)} run(s) under {args.prefix}")
    return 0
