"""The runs under a storage prefix (local or ``s3://``): one row per run directory with a run.json.

The command (``add_arguments`` and ``run``, at the end of this module): `raytrain-eks runs PREFIX [--job J] [--digest D] [--verdict V]`: every run under a storage
prefix (local or s3://) as one table: run, start time, image digest, commit, job, verdict,
tokens/s, held-out loss before -> after. "Which runs used this image" is
``raytrain-eks runs s3://<bucket>/runs --digest sha256:...``. ``--to-mlflow URI`` also logs each
listed run to an MLflow tracking server after the fact (training/metric_sinks/mlflow.py, as the
driver does at the end of a run when ``MLFLOW_TRACKING_URI`` is set).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from environment.contract import RECORD_IMAGE_RAN
from training import contract
from training import incidents
from training.storage.files import filesystem_for, read_json
from training.verdict import of_record

COLUMNS = ("run", "started", "image digest", "commit", "job", "verdict", "incidents", "tokens/s", "eval before -> after",
           "cost")


def cost_text(record: dict[str, Any], per_1m_tokens: bool = False) -> str:
    """run.json ``cost`` as one cell: ``$12.34`` (on-demand), ``~$4.94 est.`` (spot: an
    estimate), ``$0 (local)``; ``per_1m_tokens``: the cost per 1M tokens trained; ``-`` when
    the record has none (older records)."""
    cost = record.get(contract.COST) or {}
    value = cost.get("usd_per_1m_tokens") if per_1m_tokens else cost.get("usd")
    if not isinstance(value, (int, float)):
        return "-"
    if not any(r.get("usd_per_node_hour") for r in cost.get("node_hours") or []):
        return f"$0 ({cost.get('price_label') or 'no price'})"
    return f"~${value:,.2f} est." if cost.get("estimate") else f"${value:,.2f}"


def _run_dirs(prefix: str) -> list[str]:
    base = prefix.rstrip("/")
    if "://" not in base or base.startswith("file://"):
        root = Path(base.removeprefix("file://"))
        if not root.is_dir():
            raise FileNotFoundError("not a directory")
        return sorted(str(p.parent) for p in root.glob(f"*/{contract.RECORD_NAME}"))
    from pyarrow import fs

    filesystem, path = filesystem_for(base)
    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    found = [i.path for i in infos if i.type == fs.FileType.Directory]
    names = {i.path for i in filesystem.get_file_info([f"{p}/{contract.RECORD_NAME}" for p in found])
             if i.type == fs.FileType.File}
    scheme = base.split("://", 1)[0]
    return sorted(f"{scheme}://{p}" for p in found if f"{p}/{contract.RECORD_NAME}" in names)


def _loss(figures: Any) -> float | None:
    return figures.get(contract.EVAL_LOSS) if isinstance(figures, dict) else None


def digest_that_ran(record: dict[str, Any]) -> str:
    """The image digest the pods reported (``image_ran``, written by the pipeline's smoke step)
    when there is exactly one; else the digest the manifest asked for."""
    pods = (record.get(RECORD_IMAGE_RAN) or {}).get("pods") or {}
    ran = {image_id.rsplit("@", 1)[-1] for image_id in pods.values() if "@" in image_id}
    return ran.pop() if len(ran) == 1 else record.get("image_digest") or ""


def row(run_dir: str, record: dict[str, Any]) -> dict[str, Any]:
    verdict = of_record(record) or {}
    source = record.get("source") or {}
    commit = source.get("git_commit") if isinstance(source.get("git_commit"), str) else ""
    evals = record.get("eval") or {}
    return {
        "run": run_dir.rstrip("/").rsplit("/", 1)[-1],
        "started": record.get("start_time") or "",
        "image digest": digest_that_ran(record) or "(tag/local)",
        "commit": (commit[:12] + ("+dirty" if source.get("git_dirty") is True else "")) if commit else "-",
        "job": (record.get("job_config") or {}).get("name", ""),
        "verdict": verdict.get("verdict") or "none",
        "incidents": len(incidents.of_record(record)),  # training/incidents.py: hangs, losses, preemptions
        "tokens/s": (record.get("throughput") or {}).get(contract.TOKENS_PER_S),
        "eval before -> after": (_loss(evals.get("before")), _loss(evals.get("after"))),
        "cost": cost_text(record),
        "run_dir": run_dir,  # not a column: where the run is (runs --to-mlflow reads it)
    }


def list_runs(prefix: str) -> list[dict[str, Any]]:
    rows = []
    for run_dir in _run_dirs(prefix):
        try:
            rows.append(row(run_dir, read_json(f"{run_dir}/{contract.RECORD_NAME}")))
        except (OSError, ValueError):
            continue  # a half-written record: listed runs are readable ones
    return sorted(rows, key=lambda r: r["started"])


def filter_rows(rows: list[dict], *, job: str | None = None, digest: str | None = None,
                verdict: str | None = None) -> list[dict]:
    return [r for r in rows if (not job or r["job"] == job) and (not digest or r["image digest"].startswith(digest))
            and (not verdict or r["verdict"] == verdict)]


def _cell(value: Any) -> str:
    if isinstance(value, tuple):
        before, after = value
        return f"{before:.3f} -> {after:.3f}" if before is not None and after is not None else "-"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return str(value) if value not in (None, "") else "-"


def render_table(rows: list[dict]) -> str:
    cells = [[_cell(r[c]) for c in COLUMNS] for r in rows]
    digest = COLUMNS.index("image digest")
    for line in cells:  # a full digest would crowd out the rest; 19 characters identify it
        line[digest] = line[digest][:19] + ("..." if len(line[digest]) > 19 else "")
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(COLUMNS)]
    out = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths))]
    out += ["  ".join(v.ljust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join(out)


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
