"""A slowed checkpoint store: moto's S3 server (moto 5.2.5, ``moto/moto_server/threaded_moto_server.py``:
the same WSGI app and werkzeug server ``ThreadedMotoServer`` runs) behind a WSGI layer that reads
the body of every checkpoint upload at :attr:`SlowStore.bytes_per_s` per request. Shared by the
tests (the chaos suite, the stop test, the resume proofs through tests/fixtures_s3.py's session
store), bench/bench_recovery.py and `make demo FAULT=1` (devtools/strike.py holds a checkpoint's
upload on it until the fault has struck).

What it models: the bandwidth of the upload of a large checkpoint (a sharded 1.5B checkpoint with
its AdamW state is ~18 GB, minutes to S3), nothing else: every other request, and every answer,
is moto's own. A checkpoint object of ``n`` bytes then takes at least ``n / bytes_per_s`` to
store, on any machine. Bytes keep flowing (a stalled request would trip the AWS SDK's
low-speed timeout, 1 byte/s over 3 s, as a real S3 never does). The limit is a property of the
store, so the job's code under test (the stop, the checkpoint, the upload through Ray Train and
pyarrow) runs unchanged.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

CHECKPOINT_KEY_PART = "/checkpoint_"
"""A checkpoint object's key holds ``/checkpoint_<step>/`` (training/checkpointing/manager.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SlowStore:
    endpoint_url: str
    bytes_per_s: int | None
    """None: at moto's own speed until :meth:`slowed` says otherwise."""
    _rate: list = field(default_factory=list, repr=False)
    """The rate in force and the checkpoint it applies to (``None``: every one), one element:
    :meth:`slowed` changes it for a while on a shared store."""
    _in_flight: dict[int, str] = field(default_factory=dict, repr=False)
    """The checkpoint uploads the store is reading now, by request: their paths."""
    _gets: collections.Counter = field(default_factory=collections.Counter, repr=False)
    """The GETs the store answered, by path (``/<bucket>/<key>``)."""

    def gets(self, part: str) -> int:
        """How many GETs of paths holding ``part`` the store answered (a reader's request count)."""
        return sum(n for path, n in list(self._gets.items()) if part in path)

    def uploading(self) -> list[str]:
        """The paths (``/<bucket>/<key>``) of the checkpoint uploads the store is reading now."""
        return list(self._in_flight.values())

    @contextlib.contextmanager
    def slowed(self, bytes_per_s: int, only: str | None = None) -> Iterator[None]:
        """Checkpoint uploads (with ``only``: the uploads whose path holds it, checkpoint or not,
        e.g. an export) at ``bytes_per_s`` inside the block, at :attr:`bytes_per_s` after it. A
        request in flight changes speed at its next chunk."""
        self._rate[0] = (bytes_per_s, only)
        try:
            yield
        finally:
            self._rate[0] = (self.bytes_per_s, None)

    @property
    def client_env(self) -> dict[str, str]:
        """What an S3 client (boto3, pyarrow, Ray) needs to use this store."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ENDPOINT_URL_S3": self.endpoint_url,
                "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class _Throttled:
    """``wsgi.input`` read at ``bytes_per_s`` (what werkzeug's request reads call), at most one
    second's worth per read: bytes keep flowing every second however low the rate."""

    CHUNK = 64 * 1024

    def __init__(self, stream, rate: list, default: int | None, path: str):
        self._stream, self._rate, self._default, self._path = stream, rate, default, path

    def _in_force(self) -> int | None:
        """The rate for this request now: the one :meth:`SlowStore.slowed` set if its ``only``
        holds the path (any upload then; without ``only``, checkpoint uploads), else the store's
        own (checkpoint uploads only)."""
        bytes_per_s, only = self._rate[0]
        if only is not None:
            return bytes_per_s if only in self._path else self._checkpoint(self._default)
        return self._checkpoint(bytes_per_s)

    def _checkpoint(self, bytes_per_s: int | None) -> int | None:
        return bytes_per_s if CHECKPOINT_KEY_PART in self._path else None

    def _pace(self, data: bytes, bytes_per_s: int | None) -> bytes:
        if bytes_per_s:
            time.sleep(len(data) / bytes_per_s)
        return data

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:  # everything, a chunk at a time
            return b"".join(iter(lambda: self.read(self.CHUNK), b""))
        bytes_per_s = self._in_force()
        return self._pace(self._stream.read(min(size, self.CHUNK, bytes_per_s or self.CHUNK)), bytes_per_s)

    def readline(self, size: int = -1) -> bytes:
        return self._pace(self._stream.readline(size), self._in_force())

    def __iter__(self):
        return iter(self.readline, b"")


_COUNTING = threading.Lock()


def _slowed(app, rate: list, default: int | None, in_flight: dict[int, str], gets: collections.Counter):
    def handle(environ, start_response):
        if environ.get("REQUEST_METHOD") == "GET":
            with _COUNTING:  # werkzeug's threaded server: a `+=` of two requests at once could lose one
                gets[environ.get("PATH_INFO", "")] += 1
        if environ.get("REQUEST_METHOD") != "PUT":
            return app(environ, start_response)
        path = environ.get("PATH_INFO", "")
        environ["wsgi.input"] = _Throttled(environ["wsgi.input"], rate, default, path)
        if CHECKPOINT_KEY_PART not in path:
            return app(environ, start_response)
        request = id(environ)
        in_flight[request] = path
        try:
            return app(environ, start_response)  # moto reads the whole body before it answers
        finally:
            in_flight.pop(request, None)
    return handle


@contextlib.contextmanager
def slow_store(bytes_per_s: int | None) -> Iterator[SlowStore]:
    """moto's S3 app on a free loopback port, checkpoint uploads read at ``bytes_per_s`` (None:
    unthrottled)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    from raytrain_eks.backends.local_services import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    rate, in_flight, gets = [(bytes_per_s, None)], {}, collections.Counter()
    app = _slowed(DomainDispatcherApplication(create_backend_app), rate, bytes_per_s, in_flight, gets)
    server = make_server("127.0.0.1", port, app,
                         True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SlowStore(endpoint_url=f"http://127.0.0.1:{port}", bytes_per_s=bytes_per_s, _rate=rate,
                        _in_flight=in_flight, _gets=gets)
    finally:
        server.shutdown()
        thread.join()
