"""The node-local download cache: a prefix of the storage (a tokenizer, a model) downloaded ONCE
PER NODE.

The first process on the node to take an exclusive file lock downloads into a cache directory
and marks it complete; every other process (the other local ranks) blocks on the same lock and
then finds the completed copy. This gives "local rank 0 downloads, the others wait" without
needing a process group or knowing local ranks.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from training import contract
from training.storage import files

COMPLETE_MARKER = ".raytrain-complete.json"


def cache_root() -> Path:
    """Node-local cache: ``RAYTRAIN_CACHE_DIR`` or ``$TMPDIR/raytrain-eks-cache``."""
    root = os.environ.get(contract.ENV_CACHE_DIR) or os.path.join(tempfile.gettempdir(), "raytrain-eks-cache")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


class node_lock:
    """An exclusive ``fcntl`` lock on ``<path>.lock``: one holder per node, others block."""

    def __init__(self, path: Path):
        self.path = Path(str(path) + ".lock")
        self._fd = -1

    def __enter__(self) -> "node_lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def fetch_prefix(uri: str, *, cache_dir: str | Path | None = None) -> Path:
    """Download every object under ``uri`` into a node-local directory (once per node); return it.

    A local path is returned as is. The cache entry is keyed by the URI; it is reused while the
    listing (keys, sizes, mtimes) is unchanged and downloaded again otherwise.
    """
    if not files.is_s3(uri):
        return Path(uri)
    found = files.list_files(uri)
    listing = [[f.uri, f.size, f.mtime] for f in found]
    root = Path(cache_dir) if cache_dir else cache_root()
    target = root / ("s3-" + hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:20])
    with node_lock(target):
        marker = target / COMPLETE_MARKER
        if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == listing:
            return target
        bucket, key = files.split_s3(uri)
        prefix = f"s3://{bucket}/{key}".rstrip("/")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}."))
        try:
            for f in found:
                rel = f.uri[len(prefix):].lstrip("/") or f.uri.rsplit("/", 1)[-1]
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(files.read_bytes(f.uri))
            (staging / COMPLETE_MARKER).write_text(json.dumps(listing), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
