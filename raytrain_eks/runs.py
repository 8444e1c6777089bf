"""The runs under a storage prefix (local or ``s3://``): one row per run directory with a run.json."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from environment.contract import RECORD_IMAGE_RAN
from training import contract
from training.run_record import read_json
from training.verdict import of_record

COLUMNS = ("run", "started", "image digest", "commit", "job", "verdict", "tokens/s", "eval before -> after")


def _run_dirs(prefix: str) -> list[str]:
    base = prefix.rstrip("/")
    if "://" not in base or base.startswith("file://"):
        root = Path(base.removeprefix("file://"))
        if not root.is_dir():
            raise FileNotFoundError("not a directory")
        return sorted(str(p.parent) for p in root.glob(f"*/{contract.RECORD_NAME}"))
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(base)
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
        "tokens/s": (record.get("throughput") or {}).get(contract.TOKENS_PER_S),
        "eval before -> after": (_loss(evals.get("before")), _loss(evals.get("after"))),
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
