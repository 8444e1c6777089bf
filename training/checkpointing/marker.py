"""The completeness marker: a checkpoint counts only when ``COMPLETE.json`` vouches for it.

Rank 0 writes ``COMPLETE.json`` LAST, after every rank has finished writing its shards and
DCP's ``.metadata`` exists. It lists every file of the checkpoint (all ranks) with its size and
sha256, so a copy in storage can be verified file by file: a marker that arrived before a shard
(ranks upload their folders independently), a truncated shard or a missing ``.metadata`` all
make the checkpoint incomplete. Without a marker a checkpoint is incomplete, full stop.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

MARKER_NAME = "COMPLETE.json"
DCP_METADATA = ".metadata"
FORMAT = "raytrain-eks/checkpoint/v1"
_CHUNK = 8 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class FileEntry:
    """One file of a checkpoint: path relative to the checkpoint folder, size, sha256."""

    path: str
    size: int
    sha256: str


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(folder: str | os.PathLike) -> list[FileEntry]:
    """Every file under ``folder`` (except a marker) with size and sha256, sorted by path."""
    root = Path(folder)
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MARKER_NAME):
        entries.append(FileEntry(path=path.relative_to(root).as_posix(), size=path.stat().st_size,
                                 sha256=sha256_of(path)))
    return entries


def write_marker(folder: str | os.PathLike, *, step: int, world_size: int,
                 files: Iterable[FileEntry], extra: Mapping[str, Any] | None = None) -> Path:
    """Write the marker into ``folder`` atomically (temp file + rename), as the last act.

    ``files`` covers every rank's files; the caller gathers them. Refuses to vouch for a
    checkpoint without DCP's ``.metadata``.
    """
    files = sorted(files, key=lambda f: f.path)
    if DCP_METADATA not in {f.path for f in files}:
        raise RuntimeError(f"{folder}: no {DCP_METADATA} among the checkpoint's files: not marking it complete")
    body = {
        "format": FORMAT, "step": step, "world_size": world_size,
        "shards": sum(1 for f in files if f.path.endswith(".distcp")),
        "total_bytes": sum(f.size for f in files),
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files],
        **dict(extra or {}),
    }
    target = Path(folder) / MARKER_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, target)
    return target


def read_marker(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The marker's content, or None when it is missing or unreadable."""
    try:
        body = json.loads((Path(folder) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("files"), list):
        return None
    return body


def completeness_problem(folder: str | os.PathLike, *, verify_hashes: bool = True) -> str | None:
    """Why the local checkpoint ``folder`` is not complete, or None when it is."""
    marker = read_marker(folder)
    if marker is None:
        return f"no readable {MARKER_NAME}"
    for entry in marker["files"]:
        path = Path(folder) / entry["path"]
        if not path.is_file():
            return f"{entry['path']} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{entry['path']} has {size} bytes, the marker says {entry['size']}"
        if verify_hashes and sha256_of(path) != entry["sha256"]:
            return f"{entry['path']} has a different sha256 than the marker records"
    return None


def is_complete(folder: str | os.PathLike, *, verify_hashes: bool = True) -> bool:
    """True when ``folder`` holds a marker and every file it lists, with the same size/sha256."""
    return completeness_problem(folder, verify_hashes=verify_hashes) is None
