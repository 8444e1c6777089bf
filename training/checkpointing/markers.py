"""Checkpoints in the run's storage (``s3://bucket/prefix``, a shared ``file://`` mount or a
directory: :mod:`training.storage`): the marker that makes one count, and finding them.

A run's checkpoints live at ``<storage>/<run_name>/checkpoint_<step>/`` (Ray Train merges every
rank's folder there). :func:`find_latest_complete` lists them newest first and returns the first
whose marker is present and whose files all exist with the sizes the marker records; every one
it passes over is named in a warning. Hashes are checked after download (:mod:`restore`).

Every file is reached through the storage room's one file-system factory
(:func:`training.storage.files.filesystem_for`).

The completeness marker: a checkpoint counts only when ``COMPLETE.json`` vouches for it.

Rank 0 writes ``COMPLETE.json`` LAST, after every rank has finished writing its shards and
DCP's ``.metadata`` exists. It lists every file of the checkpoint (all ranks) with its size and
sha256, so a copy in storage can be verified file by file: a marker that arrived before a shard
(ranks upload their folders independently), a truncated shard or a missing ``.metadata`` all
make the checkpoint incomplete. Without a marker a checkpoint is incomplete, full stop.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow.fs as pafs

from training.storage import RunStorage, join
from training.storage.files import filesystem_for, upload

log = logging.getLogger(__name__)

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


_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")
LEASE_NAME = "LEASE.json"
"""The run's writer lease (training/checkpointing/lease.py): on its own, no run yet (nor is its
``LEASE.json.lock``, the lock of a directory's or a shared mount's lease)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredCheckpoint:
    """A checkpoint folder in storage."""

    uri: str
    """``s3://bucket/prefix/run/checkpoint_00000010`` or a local path."""
    step: int
    marker: dict[str, Any] | None = None
    """The marker's content once verified (None when not looked at)."""


def run_uri(storage_path: str, run_name: str) -> str:
    """The run's directory under a storage (:meth:`training.storage.RunStorage.run`)."""
    return RunStorage(storage_path).run(run_name)


def _uri_of(base_uri: str, base_path: str, path: str) -> str:
    """Map a filesystem path under ``base_path`` back to a URI under ``base_uri``."""
    return join(base_uri, path[len(base_path):].lstrip("/")) if path != base_path else base_uri


def list_checkpoints(run: str) -> list[StoredCheckpoint]:
    """The run's ``checkpoint_<step>`` folders, newest first (none when the run does not exist)."""
    fs, path = filesystem_for(run)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=False))
    except (FileNotFoundError, OSError):
        return []
    found = []
    for info in infos:
        match = _CHECKPOINT_DIR.match(info.base_name)
        if match and info.type == pafs.FileType.Directory:
            found.append(StoredCheckpoint(uri=_uri_of(run, path, info.path), step=int(match.group(1))))
    return sorted(found, key=lambda c: c.step, reverse=True)


def run_exists(run: str) -> bool:
    """True when anything but a lease is stored under the run (checkpoints or Ray's run snapshot)."""
    fs, path = filesystem_for(run)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=False))
    except (FileNotFoundError, OSError):
        return False
    return any(not info.base_name.startswith(LEASE_NAME) for info in infos)  # the lease, its lock


def read_remote_marker(checkpoint_uri: str) -> dict[str, Any] | None:
    fs, path = filesystem_for(checkpoint_uri)
    try:
        with fs.open_input_stream(f"{path}/{MARKER_NAME}") as handle:
            body = json.loads(handle.read().decode("utf-8"))
    except (FileNotFoundError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("files"), list) else None


def remote_problem(checkpoint_uri: str) -> str | None:
    """Why a stored checkpoint is incomplete (marker missing, file missing or wrong size), or None."""
    marker = read_remote_marker(checkpoint_uri)
    if marker is None:
        return f"no readable {MARKER_NAME}"
    fs, path = filesystem_for(checkpoint_uri)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
    sizes = {info.path[len(path):].lstrip("/"): info.size for info in infos if info.type == pafs.FileType.File}
    for entry in marker["files"]:
        if entry["path"] not in sizes:
            return f"{entry['path']} is missing"
        if sizes[entry["path"]] != entry["size"]:
            return f"{entry['path']} has {sizes[entry['path']]} bytes, the marker says {entry['size']}"
    return None


def find_latest_complete(run: str, *, skip: set[str] | frozenset[str] = frozenset()) -> StoredCheckpoint | None:
    """The newest complete checkpoint of the run, warning about each incomplete one passed over."""
    for candidate in list_checkpoints(run):
        if candidate.uri in skip:
            continue
        problem = remote_problem(candidate.uri)
        if problem is None:
            return StoredCheckpoint(uri=candidate.uri, step=candidate.step,
                                    marker=read_remote_marker(candidate.uri))
        log.warning("skipping incomplete checkpoint %s: %s", candidate.uri, problem)
    return None


def copy_report(run: str):
    """A ``report`` for :class:`CheckpointManager` outside Ray: copy each rank's folder into
    ``<run>/<checkpoint dir>/`` the way Ray Train does (rank folders merge; the marker may land
    before other ranks' shards, which is why completeness is checked file by file)."""
    def report(metrics: dict[str, Any], folder: str, dir_name: str) -> None:
        upload(folder, join(run, dir_name))

    return report
