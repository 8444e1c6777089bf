"""Local paths and ``s3://`` URIs behind one small API, plus a node-local download cache.

S3 goes through ``pyarrow.fs.S3FileSystem`` (pyarrow ships with Ray, so it is in the DLC).
pyarrow does not read ``AWS_ENDPOINT_URL`` by itself, so :func:`s3_filesystem` passes it (or
``AWS_ENDPOINT_URL_S3``) as the endpoint: that is how tests point it at moto on 127.0.0.1 and
how a user points it at an S3-compatible store. Credentials come from the usual AWS chain (pod
identity / IRSA in EKS, environment variables in tests).

:func:`fetch_prefix` downloads a prefix ONCE PER NODE: the first process on the node to take an
exclusive file lock downloads into a cache directory and marks it complete; every other process
(the other local ranks) blocks on the same lock and then finds the completed copy. This gives
"local rank 0 downloads, the others wait" without needing a process group or knowing local ranks.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from training import contract

COMPLETE_MARKER = ".raytrain-complete.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteFile:
    """One file found under a path: ``uri`` (local path or ``s3://bucket/key``), size, mtime."""

    uri: str
    size: int
    mtime: float


def is_s3(path: str) -> bool:
    return path.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (``bucket``, ``key``)."""
    rest = uri[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{uri}: not an s3://bucket/key URI")
    return bucket, key.strip("/")


def s3_filesystem():
    """A pyarrow S3 file system honouring ``AWS_ENDPOINT_URL(_S3)`` and the region variables."""
    from pyarrow import fs

    kwargs = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        kwargs["endpoint_override"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return fs.S3FileSystem(**kwargs)


def list_files(path: str, suffixes: tuple[str, ...] = ()) -> list[RemoteFile]:
    """The files at ``path``: the file itself, or every file below a directory / prefix, sorted.

    ``suffixes`` filters files found under a directory (a path naming one file is always taken).
    Hidden files (a name starting with ``.``) are skipped. Raises FileNotFoundError if nothing is there.
    """
    def wanted(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return not base.startswith(".") and (not suffixes or base.endswith(suffixes))

    if is_s3(path):
        from pyarrow import fs

        s3 = s3_filesystem()
        bucket, key = split_s3(path)
        where = f"{bucket}/{key}" if key else bucket
        info = s3.get_file_info(where)
        if info.type == fs.FileType.File:
            return [RemoteFile(uri=path, size=info.size, mtime=_mtime(info))]
        if info.type != fs.FileType.Directory:
            raise FileNotFoundError(f"{path}: no such object or prefix")
        found = s3.get_file_info(fs.FileSelector(where, recursive=True))
        files = [RemoteFile(uri=f"s3://{i.path}", size=i.size, mtime=_mtime(i))
                 for i in found if i.type == fs.FileType.File and wanted(i.path)]
    else:
        root = Path(path)
        if root.is_file():
            st = root.stat()
            return [RemoteFile(uri=str(root), size=st.st_size, mtime=st.st_mtime)]
        if not root.is_dir():
            raise FileNotFoundError(f"{path}: no such file or directory")
        files = []
        for p in root.rglob("*"):
            if p.is_file() and wanted(str(p.relative_to(root))) and not any(
                    part.startswith(".") for part in p.relative_to(root).parts):
                st = p.stat()
                files.append(RemoteFile(uri=str(p), size=st.st_size, mtime=st.st_mtime))
    if not files:
        raise FileNotFoundError(f"{path}: no files{' ending in ' + '/'.join(suffixes) if suffixes else ''}")
    return sorted(files, key=lambda f: f.uri)


def _mtime(info) -> float:
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def read_bytes(uri: str) -> bytes:
    """The whole content of one local file or S3 object."""
    if not is_s3(uri):
        return Path(uri).read_bytes()
    bucket, key = split_s3(uri)
    with s3_filesystem().open_input_stream(f"{bucket}/{key}") as stream:
        return stream.read()


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
    if not is_s3(uri):
        return Path(uri)
    files = list_files(uri)
    listing = [[f.uri, f.size, f.mtime] for f in files]
    root = Path(cache_dir) if cache_dir else cache_root()
    target = root / ("s3-" + hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:20])
    with node_lock(target):
        marker = target / COMPLETE_MARKER
        if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == listing:
            return target
        bucket, key = split_s3(uri)
        prefix = f"s3://{bucket}/{key}".rstrip("/")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}."))
        try:
            for f in files:
                rel = f.uri[len(prefix):].lstrip("/") or f.uri.rsplit("/", 1)[-1]
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(read_bytes(f.uri))
            (staging / COMPLETE_MARKER).write_text(json.dumps(listing), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
