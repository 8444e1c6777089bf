"""`raytrain-eks runs PREFIX [--job J] [--digest D] [--verdict V]`: every run under a storage
prefix (local or s3://) as one table: run, start time, image digest, commit, job, verdict,
tokens/s, held-out loss before -> after. "Which runs used this image" is
``raytrain-eks runs s3://<bucket>/runs --digest sha256:...``. ``--to-mlflow URI`` also logs each
listed run to an MLflow tracking server after the fact (training/metric_sinks/mlflow.py, as the
driver does at the end of a run when ``MLFLOW_TRACKING_URI`` is set).
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
    parser.add_argument("--to-mlflow", metavar="URI",
                        help="log each listed run to this MLflow tracking server (http(s)://host:port or a "
                             "SageMaker MLflow tracking server ARN)")
    parser.add_argument("--experiment", default="", help="the MLflow experiment (default: each run's job name)")


def run(args: argparse.Namespace) -> int:
    from raytrain_eks.runs import filter_rows, list_runs, render_table
    from training.mlflow_rest import MlflowError, Tracking

    if args.to_mlflow:
        try:  # a bad URI is refused before any run is read
            Tracking(args.to_mlflow)
        except ValueError as err:
            print(f"error: runs: --to-mlflow: {err}", file=sys.stderr)
            return 2
    try:
        rows = list_runs(args.prefix)
    except (FileNotFoundError, OSError) as err:
        print(f"error: runs: {args.prefix}: {err}", file=sys.stderr)
        return 2
    shown = filter_rows(rows, job=args.job, digest=args.digest, verdict=args.verdict)
    say = print
    if args.output == "json":
        import json

        print(json.dumps(shown, indent=2))
        say = lambda line: print(line, file=sys.stderr)  # noqa: E731 - stdout holds the JSON only
    else:
        print(render_table(shown))
        print(f"{len(shown)} of {len(rows)} run(s) under {args.prefix}")
    return _to_mlflow(args.to_mlflow, args.experiment, shown, MlflowError, say) if args.to_mlflow else 0


def _to_mlflow(uri: str, experiment: str, rows: list[dict], refused: type[Exception], say=print) -> int:
    from training.metric_sinks.mlflow import export_run

    for shown in rows:
        try:
            logged = export_run(uri, shown["run_dir"], experiment=experiment)
        except (refused, OSError, ValueError) as err:
            print(f"error: runs: --to-mlflow {uri}: {shown['run']}: {err}", file=sys.stderr)
            return 1
        say(f"mlflow: {shown['run']} -> run {logged['run_id']} in experiment {logged['experiment_id']}")
    return 0
