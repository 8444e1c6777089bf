"""Your files travel with the run: a job's local ``data.path``, ``model.path`` or
``model.tokenizer`` outside the code archive goes to the run's storage before the run starts.

The code archive carries only ``training/``, ``jobs/`` and ``spec_schema/``
(:data:`training.contract.CODE_DIRS`); a local path anywhere else passed every check on this
machine and then did not exist inside the job. ``submit`` therefore uploads each such file or
folder to ``<storage>/_inputs/<hash>/<name>`` (``<hash>``: :func:`training.contract.tree_hash`
of its content, so an unchanged file is uploaded once and a changed one never hides behind an
old name) and points the job at that copy with a ``--set`` of its own. ``_inputs`` cannot be a
run's name (run names start with a letter), and the pods may read the storage prefix, whatever
``storage.read_only_prefixes`` says. ``<storage>/_inputs/<run>.json`` and ``.work/runs/<run>/inputs.json``
record each field's local origin and its stored copy (not inside ``<storage>/<run>/``: anything
there makes the job take the run for an existing one).

Only data travels, and no more than :data:`MAX_UPLOAD_BYTES`: a file whose suffix is not one
a job reads for that field (:data:`DATA_SUFFIXES`), or a symbolic link inside a folder that
leads out of it (the link's target would be uploaded: ``/etc/passwd`` travelled that way), is
refused in one line naming it, before anything is uploaded. The copies are content-addressed
and only people who submit write ``_inputs/`` (the pods' roles may read it, never write it:
infra/constructs/pod_identity.py), so a copy found under its hash is that content.

Relative paths are relative to the repository root, where the job file's other paths (the
tokenizer in ``training/assets``) are resolved, as the job resolves them in the unpacked archive.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from training import contract

INPUTS_DIR = contract.INPUTS_DIR
INPUTS_RECORD = "inputs.json"
"""In the run's results folder (``.work/runs/<run>/``): each uploaded field, its origin and its copy."""
FIELDS = ("data.path", "model.path", "model.tokenizer")
"""The job fields that may name a local file or folder."""
MODEL_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".tiktoken", ".jinja", ".md")
DATA_SUFFIXES = {
    "data.path": (".jsonl", ".json", ".txt", ".md", ".csv", ".parquet", ".arrow"),
    "model.path": MODEL_SUFFIXES,
    "model.tokenizer": MODEL_SUFFIXES,
}
"""What travels for each field: the data and model formats a job reads (weights as safetensors,
configs and tokenizers as JSON/text, chat templates); nothing executable, no keys or archives."""
PLAIN_NAMES = ("LICENSE", "NOTICE", "README")
"""Suffix-less files a model folder carries that may travel."""
MAX_UPLOAD_BYTES = 64 << 30
"""The most one submit uploads (64 GiB: a 30B-parameter model in bf16); larger inputs go to S3
first (``aws s3 cp``) and the job names their ``s3://`` path."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Upload:
    """One local input and where it travels to."""
    field: str
    origin: Path
    uri: str
    """What the job reads instead: ``<storage>/_inputs/<hash>/<name>`` (a file) or its folder."""
    files: tuple[tuple[Path, str], ...]
    """Each local file and its object URI."""


def _value(job: Any, field: str) -> str:
    section, name = field.split(".")
    return getattr(getattr(job, section), name) or ""


def _travels_in_archive(path: Path, root: Path) -> bool:
    return any(path.is_relative_to(root / top) for top in contract.CODE_DIRS)


def plan_uploads(job: Any, storage_uri: str, root: Path) -> list[Upload]:
    """The uploads ``job`` needs: every field of :data:`FIELDS` that names an existing local
    file or folder outside the code archive. A path that does not exist here is left to the
    checks (a hub id, or a one-line refusal)."""
    uploads = []
    for field in FIELDS:
        value = _value(job, field)
        if not value or "://" in value:
            continue
        path = (root / value).resolve()
        if not path.exists() or _travels_in_archive(path, root.resolve()):
            continue
        files = ([(path.name, path)] if path.is_file() else
                 [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*"))
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)])
        check_travellers(field, value, path, files)
        base = f"{storage_uri.rstrip('/')}/{INPUTS_DIR}/{contract.tree_hash(files)}"
        uri = f"{base}/{path.name}" if path.is_file() else f"{base}/{path.name}/"
        objects = tuple((p, f"{base}/{name}" if path.is_file() else f"{base}/{path.name}/{name}") for name, p in files)
        uploads.append(Upload(field=field, origin=path, uri=uri, files=objects))
    return uploads


def check_travellers(field: str, value: str, folder: Path, files: list[tuple[str, Path]]) -> None:
    """One line (a :class:`charts.ChartError`) for the first file that may not travel: a link
    leading out of the folder, a file no job reads for ``field``, or more than :data:`MAX_UPLOAD_BYTES`."""
    from charts import ChartError

    inside = folder.resolve() if folder.is_dir() else folder.resolve().parent
    total = 0
    for name, local in files:
        if folder.is_dir() and not local.resolve().is_relative_to(inside):
            raise ChartError(f"submit: {field}: {value!r}: {name} is a symbolic link to {local.resolve()}, outside "
                             "the folder: only the folder's own files travel (copy the file in, or remove the link)")
        if not (local.name.endswith(DATA_SUFFIXES[field]) or local.name in PLAIN_NAMES):
            raise ChartError(f"submit: {field}: {value!r}: {name} is not a file a job reads for {field} "
                             f"(allowed: {', '.join(DATA_SUFFIXES[field])}, {', '.join(PLAIN_NAMES)}): move it out")
        total += local.stat().st_size
    if total > MAX_UPLOAD_BYTES:
        raise ChartError(f"submit: {field}: {value!r}: {total / 2**30:.1f} GiB is more than a submit uploads "
                         f"({MAX_UPLOAD_BYTES >> 30} GiB): copy it to S3 first and name its s3:// path")


def overrides(uploads: list[Upload]) -> list[str]:
    """The ``--set`` items that point the job at the stored copies."""
    return [f"{u.field}={json.dumps(u.uri)}" for u in uploads]


def record(uploads: list[Upload]) -> dict[str, dict[str, str]]:
    """Each uploaded field's local origin and stored copy."""
    return {u.field: {"origin": str(u.origin), "stored": u.uri} for u in uploads}


def write_record(uploads: list[Upload], out_dir: Path) -> None:
    """``<out_dir>/inputs.json`` (nothing when no input travelled)."""
    if uploads:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / INPUTS_RECORD).write_text(json.dumps(record(uploads), indent=2) + "\n", encoding="utf-8")


def upload(client: Any, uploads: list[Upload], storage_uri: str, run: str, say: Callable[[str], None] = print,
           prediction: dict | None = None, run_storage: str = "") -> None:
    """Upload each input unless storage has it (content-addressed: an object of that name is
    this file), then write ``<run storage>/_inputs/<run>.json`` with the step model's ``prediction``
    of the run's exposed communication (:data:`training.contract.STEP_PREDICTION`; the driver
    records it in run.json). ``run_storage``: where the job's runs are when not in the bucket
    (a shared file system, training/storage/__init__.py), which is where the job reads that file."""
    from raytrain_eks.runs.results import upload_if_missing, write_file

    for u in uploads:
        sent = sum(upload_if_missing(client, local, uri) for local, uri in u.files)
        size = sum(os.path.getsize(local) for local, _ in u.files)
        say(f"    {u.field}: {u.origin} -> {u.uri} ({'uploaded' if sent else 'already stored'}, "
            f"{len(u.files)} file(s), {size} bytes)")
    if uploads or prediction:
        body = {**record(uploads), **({contract.STEP_PREDICTION: prediction} if prediction else {})}
        write_file(client, contract.run_inputs_uri(run_storage or storage_uri, run), (json.dumps(body, indent=2) + "\n").encode())
