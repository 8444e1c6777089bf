"""`raytrain-eks report RUN_DIR [RUN_DIR_B]`: a run as Markdown + PNG plots, or two side by side.

RUN_DIR is a run's directory in storage (local or s3://) holding run.json and metrics.jsonl.
With two runs the report lists every difference in their records (image, code, config, cluster,
versions, transport) so a throughput difference can be attributed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or two run directories (local or s3://)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: reports/<run> or reports/<run-a>-vs-<run-b>)")


def run(args: argparse.Namespace) -> int:
    from raytrain_eks.report import render_report

    if len(args.runs) > 2:
        print(f"error: report: {len(args.runs)} run directories given; give one or two", file=sys.stderr)
        return 2
    names = [Path(r.rstrip("/")).name for r in args.runs]
    out = args.out or str(Path("reports") / "-vs-".join(names))
    try:
        path = render_report(args.runs, out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
