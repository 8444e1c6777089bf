"""Files in a run's storage, its inputs and its checkpoints: local paths, ``file://`` (a shared
mount) and ``s3://`` URIs behind ONE file-system factory and ONE retry policy.

:func:`filesystem_for` is the only place a pyarrow file system is built. S3 goes through
``pyarrow.fs.S3FileSystem`` (pyarrow ships with Ray, so it is in the DLC; Ray Train's own
storage is handed the same one by :func:`training.launch.storage_location`). pyarrow does not
read ``AWS_ENDPOINT_URL`` by itself, so :func:`s3_filesystem` passes it (or
``AWS_ENDPOINT_URL_S3``) as the endpoint: that is how tests point it at moto on 127.0.0.1 and
how a user points it at an S3-compatible store. Credentials come from the usual AWS chain (pod
identity / IRSA in EKS, environment variables in tests); the region from ``AWS_REGION`` (every
Ray pod has it, charts/cluster_spec.py).

The retry policy: each S3 request is retried by pyarrow's AWS client (:data:`S3_ATTEMPTS`
attempts, the SDK's standard strategy with its backoff); a read whose error must never be taken
for an absent file (the writer lease) is read again :data:`READ_TRIES` times on top
(:func:`read_retrying`), :data:`RETRY_PAUSE_S` longer before each further try.

The node-local download cache (:func:`fetch_prefix`): a prefix of the storage (a tokenizer, a
model) downloaded ONCE PER NODE. The first process on the node to take an exclusive file lock downloads into a cache directory
and marks it complete; every other process (the other local ranks) blocks on the same lock and
then finds the completed copy. This gives "local rank 0 downloads, the others wait" without
needing a process group or knowing local ranks.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training import contract
from training.storage import S3_SCHEME, SHARED_SCHEME

log = logging.getLogger(__name__)

S3_ATTEMPTS = 3
"""Attempts of one S3 request inside pyarrow's AWS client (``AwsStandardS3RetryStrategy``; 3 is
also its default, named here so the policy is read in one place)."""
READ_CHUNK_BYTES = 64 << 20
"""The most one GET of a stored file fetches. Read otherwise, pyarrow 26's S3 input stream
fetches 256 KiB per GET under ``read()`` (80 GETs for a 20 MiB object, counted at the store) and
``copy_files`` 1 MiB per chunk: each GET is a request to S3 with its own latency and price, and
a multi-GB model file became thousands of them."""
READ_TRIES = 3
"""Reads by :func:`read_retrying` before an error counts (each after the client's own retries)."""
RETRY_PAUSE_S = 2.0
"""The pause before the second such read; it grows by as much for each further one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteFile:
    """One file found under a path: ``uri`` (local path or ``s3://bucket/key``), size, mtime."""

    uri: str
    size: int
    mtime: float


def is_s3(path: str) -> bool:
    return path.startswith(S3_SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (``bucket``, ``key``)."""
    rest = uri[len(S3_SCHEME):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{uri}: not an s3://bucket/key URI")
    return bucket, key.strip("/")


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_filesystem(bucket: str = ""):
    """A pyarrow S3 file system honouring ``AWS_ENDPOINT_URL(_S3)``, the region variables and
    the retry policy (:data:`S3_ATTEMPTS`). Without a region variable (an operator's shell; every
    Ray pod has one) and on AWS itself, ``bucket``'s own region is asked for, as
    ``FileSystem.from_uri`` does: a request signed for another region is refused."""
    from pyarrow import fs

    kwargs: dict[str, Any] = {"retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS)}
    endpoint = _endpoint()
    if endpoint:
        kwargs["endpoint_override"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and bucket and not endpoint:
        region = fs.resolve_s3_region(bucket)
    if region:
        kwargs["region"] = region
    return fs.S3FileSystem(**kwargs)


def s3_client():
    """A boto3 S3 client for what pyarrow cannot do (a conditional put, object versions), on the
    same endpoint and retry policy as :func:`s3_filesystem` (botocore's ``standard`` retries,
    :data:`S3_ATTEMPTS` attempts; boto3 is in the DLC: Ray's runtime-env agent downloads
    working_dir with it). Credentials and region come from the usual chain."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=_endpoint(),
                        config=Config(retries={"mode": "standard", "max_attempts": S3_ATTEMPTS}))


def filesystem_for(uri: str):
    """The pyarrow file system and the path on it for an ``s3://`` URI, a ``file://`` URI or a
    local path (made absolute)."""
    from pyarrow import fs

    if is_s3(uri):
        bucket, key = split_s3(uri)
        return s3_filesystem(bucket), f"{bucket}/{key}" if key else bucket
    if "://" in uri and not uri.startswith(SHARED_SCHEME):
        raise ValueError(f"{uri}: not s3://bucket/key, file:///<path> nor a path")
    return fs.LocalFileSystem(), os.path.abspath(uri.removeprefix(SHARED_SCHEME))


def is_local(filesystem) -> bool:
    """Whether ``filesystem`` is a local (or mounted shared) one, where folders must exist."""
    from pyarrow import fs

    return isinstance(filesystem, fs.LocalFileSystem)


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

        s3, where = filesystem_for(path)
        info = s3.get_file_info(where)
        if info.type == fs.FileType.File:
            return [RemoteFile(uri=path, size=info.size, mtime=_mtime(info))]
        if info.type != fs.FileType.Directory:
            raise FileNotFoundError(f"{path}: no such object or prefix")
        found = s3.get_file_info(fs.FileSelector(where, recursive=True))
        files = [RemoteFile(uri=f"{S3_SCHEME}{i.path}", size=i.size, mtime=_mtime(i))
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


LOST_RACE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "409", "412"})
"""S3's answers to a conditional write whose condition no longer holds: 412 (the object exists, or
its ETag changed), 409 (another conditional write to the key is in flight), 404 (``If-Match`` on a
key deleted meanwhile)."""


def _s3_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


class ConditionalFile:
    """One small file written only by compare-and-swap (the writer lease), per storage kind:

    - S3: conditional writes (S3 User Guide, "Add preconditions to S3 operations with conditional
      requests"): ``PutObject`` with ``If-None-Match: *`` creates only if there is none,
      ``If-Match: <ETag>`` replaces or deletes only the version that was read; a lost race answers
      412 PreconditionFailed (or 409 ConditionalRequestConflict while a concurrent write is in
      flight). pyarrow's S3 file system has no conditional put, so these go through
      :func:`s3_client`.
    - a directory or a shared ``file://`` mount: the read-compare-write runs under an exclusive
      ``flock`` of ``<file>.lock`` (EFS and FSx for Lustre honour it across nodes) and the new
      bytes land by ``os.replace`` of a complete temporary file, so no reader sees half of it.
      The "ETag" is the sha256 of the bytes read.
    """

    def __init__(self, uri: str):
        self.uri = uri
        self.s3 = is_s3(uri)
        if self.s3:
            self.bucket, _, self.key = uri[len(S3_SCHEME):].partition("/")
        else:
            self.path = os.path.abspath(uri.removeprefix(SHARED_SCHEME))

    def get(self) -> tuple[bytes, str] | None:
        """The stored bytes and their ETag; None when absent. A read error is retried
        :data:`READ_TRIES` times, then raised as an OSError (never taken for an absent file)."""
        if not self.s3:
            raw = read_retrying(self.uri)
            return None if raw is None else (raw, hashlib.sha256(raw).hexdigest())
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(READ_TRIES):
            try:
                got = s3_client().get_object(Bucket=self.bucket, Key=self.key)
                return got["Body"].read(), got["ETag"]
            except ClientError as err:
                if _s3_code(err) in ("NoSuchKey", "404"):
                    return None
                problem: Exception = err
            except BotoCoreError as err:
                problem = err
            if attempt + 1 == READ_TRIES:
                raise OSError(f"S3 GetObject: {problem}") from problem
            log.warning("%s: read failed, retrying: %s", self.uri, problem)
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
        return None

    def put(self, body: bytes, *, etag: str | None) -> str | None:
        """Write ``body`` only if the stored file is still ``etag`` (None: only if there is none).
        Returns the new ETag, or None when the condition failed (another writer won)."""
        if self.s3:
            from botocore.exceptions import ClientError

            condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
            try:
                return s3_client().put_object(Bucket=self.bucket, Key=self.key, Body=body, **condition)["ETag"]
            except ClientError as err:
                if _s3_code(err) in LOST_RACE_CODES:
                    return None
                raise
        with self._locked():
            if self._local_etag() != etag:
                return None
            tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            return hashlib.sha256(body).hexdigest()

    def delete(self, etag: str) -> bool:
        """Delete the file only if it is still ``etag``."""
        if self.s3:
            from botocore.exceptions import ClientError

            try:
                s3_client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)
                return True
            except ClientError as err:
                if _s3_code(err) in LOST_RACE_CODES:
                    return False
                raise
        with self._locked():
            if self._local_etag() != etag:
                return False
            os.unlink(self.path)
            return True

    def _local_etag(self) -> str | None:
        try:
            with open(self.path, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        except FileNotFoundError:
            return None

    class _Lock:
        def __init__(self, path: str):
            self.path = path

        def __enter__(self) -> None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)

        def __exit__(self, *exc: Any) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)

    def _locked(self) -> "ConditionalFile._Lock":
        return self._Lock(f"{self.path}.lock")


def object_versions(uri: str) -> list[dict[str, Any]]:
    """Key, ETag, size and version id of every latest object under an ``s3://`` prefix, by key.
    boto3 (:func:`s3_client`), as pyarrow lists no versions; ListObjectVersions may be denied, then ETags alone (``list_objects_v2``).
    Raises OSError naming both errors when neither listing answers."""
    bucket, _, prefix = uri[len(S3_SCHEME):].partition("/")  # the prefix as given (a trailing / kept)
    client = s3_client()
    objects = []
    try:
        for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
            objects += [{"key": v["Key"], "etag": v["ETag"].strip('"'), "version_id": v.get("VersionId"),
                         "size": v["Size"]} for v in page.get("Versions", []) if v.get("IsLatest")]
    except Exception as err:  # noqa: BLE001 - denied or unsupported: fall back to ETags alone
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                objects += [{"key": o["Key"], "etag": o["ETag"].strip('"'), "size": o["Size"]}
                            for o in page.get("Contents", [])]
        except Exception as err2:  # noqa: BLE001
            raise OSError(f"{type(err).__name__}; {type(err2).__name__}: {err2}") from err2
    return sorted(objects, key=lambda o: o["key"])


def read_stored(filesystem, path: str, limit: int | None = None) -> bytes:
    """A stored file's bytes (its first ``limit``) in one GET: a random-access file reads what it
    is asked for at once, where an input stream's ``read()`` fetches 256 KiB a GET (pyarrow 26)."""
    with filesystem.open_input_file(path) as handle:
        return handle.read() if limit is None else handle.read(limit)


def read_bytes(uri: str) -> bytes:
    """The whole content of one local file or S3 object (FileNotFoundError when absent)."""
    if not is_s3(uri):
        return Path(uri.removeprefix(SHARED_SCHEME)).read_bytes()
    filesystem, path = filesystem_for(uri)
    return read_stored(filesystem, path)


def read_retrying(uri: str) -> bytes | None:
    """The content of ``uri``, None when it is absent. Any other read error is retried
    :data:`READ_TRIES` times, then raised (an OSError): an unreadable file is never taken for
    an absent one."""
    filesystem, path = filesystem_for(uri)
    for attempt in range(READ_TRIES):
        try:
            return read_stored(filesystem, path)
        except FileNotFoundError:
            return None
        except OSError as err:
            if attempt + 1 == READ_TRIES:
                raise
            log.warning("%s: read failed, retrying: %s", uri, err)
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
    return None


def write_bytes(uri: str, data: bytes, *, atomic: bool = False) -> None:
    """Write one file: a local (or shared) path gets its folder made, and with ``atomic`` is
    written to a temporary name and renamed (a reader never sees half of it); an S3 object is
    whole once its upload completes."""
    filesystem, path = filesystem_for(uri)
    if is_local(filesystem):
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if atomic:
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
    with filesystem.open_output_stream(path, compression=None) as stream:  # as given, whatever the name says
        stream.write(data)


def write_json(uri: str, data: dict) -> None:
    """Write JSON to a local path (atomically) or an ``s3://`` URI (pyarrow, as Ray Train does)."""
    write_bytes(uri, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8"), atomic=True)


def read_json(uri: str) -> dict:
    """Read run.json (or any JSON file) from a local path or an ``s3://`` URI."""
    return json.loads(read_bytes(uri).decode("utf-8"))


def download(uri: str, local_dir: str | os.PathLike) -> Path:
    """Copy a stored folder into ``local_dir`` (created)."""
    from pyarrow import fs

    filesystem, path = filesystem_for(uri)
    target = Path(local_dir)
    target.mkdir(parents=True, exist_ok=True)
    fs.copy_files(path, str(target), source_filesystem=filesystem, destination_filesystem=fs.LocalFileSystem(),
                  chunk_size=READ_CHUNK_BYTES)
    return target


def upload(local_dir: str | os.PathLike, uri: str) -> None:
    """Copy a local folder into ``uri`` (files of the same names are replaced, others kept)."""
    from pyarrow import fs

    filesystem, path = filesystem_for(uri)
    if is_local(filesystem):
        Path(path).mkdir(parents=True, exist_ok=True)
    fs.copy_files(str(local_dir), path, source_filesystem=fs.LocalFileSystem(), destination_filesystem=filesystem)


def download_files(uri: str, names: list[str], local_dir: str | os.PathLike) -> Path:
    """Copy only the named files of a stored folder into ``local_dir`` (created)."""
    filesystem, path = filesystem_for(uri)
    target = Path(local_dir)
    for name in names:
        _fetch_file(filesystem, f"{path}/{name}", target / name)
    return target


def _fetch_file(filesystem, path: str, out: Path) -> None:
    """One stored file into ``out``, :data:`READ_CHUNK_BYTES` a GET, never whole in memory."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # compression=None: the stored bytes as they are (an input stream otherwise guesses a codec from
    # the name and writes a `.gz` object decompressed, as copy_files and read_bytes never do)
    with filesystem.open_input_stream(path, compression=None) as source, open(out, "wb") as sink:
        while chunk := source.read(READ_CHUNK_BYTES):
            sink.write(chunk)


def download_ranges(uri: str, name: str, spans: list[tuple[int, int]], local_dir: str | os.PathLike,
                    *, size: int) -> Path:
    """Fetch only ``spans`` (offset, length) of one stored file into a sparse local file of its
    full ``size``, at the same offsets (what DCP's reader seeks to)."""
    filesystem, path = filesystem_for(uri)
    out = Path(local_dir) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with filesystem.open_input_file(f"{path}/{name}") as source, open(out, "wb") as sink:
        sink.truncate(size)
        for offset, length in spans:
            sink.seek(offset)
            sink.write(source.read_at(length, offset))
    return out


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
    if not is_s3(uri):
        return Path(uri)
    found = list_files(uri)
    listing = [[f.uri, f.size, f.mtime] for f in found]
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
            for f in found:
                rel = f.uri[len(prefix):].lstrip("/") or f.uri.rsplit("/", 1)[-1]
                _fetch_file(*filesystem_for(f.uri), staging / rel)
            (staging / COMPLETE_MARKER).write_text(json.dumps(listing), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
