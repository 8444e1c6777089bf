"""`raytrain-eks report RUN_DIR [RUN_DIR ...]`: a run as Markdown + PNG plots, or several side by side.

RUN_DIR is a run's directory in storage (local or s3://) holding run.json and metrics.jsonl.
The report leads with the verdict. With two runs it labels them by the factor that differs,
says in one paragraph what that did to throughput and held-out loss, and lists every difference
in their records (image, code, config, cluster, versions, transport). With three or more, one
row per run with the factors that differ as columns, its verdict, throughput and held-out loss.

Exit codes for one run: its verdict's (0 accepted, 3 rejected, 1 execution-failed, 4 no verdict
yet); 0 for a comparison; 2 when a run cannot be read.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (local or s3://)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: reports/<run> or reports/<run-a>-vs-<run-b>)")


def run(args: argparse.Namespace) -> int:
    from raytrain_eks.report import render_report

    names = [Path(r.rstrip("/")).name for r in args.runs]
    out = args.out or str(Path("reports") / "-vs-".join(names))
    try:
        path = render_report(args.runs, out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    if len(args.runs) > 1:
        return 0
    from raytrain_eks.report import load_run
    from training.verdict import exit_code, headline, of_record

    verdict = of_record(load_run(args.runs[0]).record)
    print(f"verdict: {headline(verdict)}")
    return exit_code(verdict)
