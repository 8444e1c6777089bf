"""Two trainers racing for one run's lease, against moto's S3 server, interleaved from OUTSIDE
the processes: a gate between the trainers and the store (a slowed store, as a congested S3
endpoint is) holds each trainer's lease write until BOTH have read the lease and are about to
write, then lets the writes through one at a time, the second only after the first writer has
read again. That is the interleaving that made both of the old write-then-read-back trainers win.

Upstream behaviour modelled: S3 conditional writes (S3 User Guide, "conditional requests":
``PutObject`` with ``If-None-Match: *`` answers 412 when the key exists, ``If-Match: <etag>`` 412
when the ETag differs), as moto 5.2.5's server implements them (``moto/s3/responses.py``
``put_object``/``delete_object``); the gate only delays requests, it answers none itself.
"""
from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import boto3

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (session fixtures)

ROOT = Path(__file__).resolve().parents[2]
LEASE_KEY = "LEASE.json"
HOLD_BOUND_S = 300.0
"""The longest a write is held for the other trainer's: only ends a hang (the test then fails:
the interleaving it exists for did not happen)."""
SECOND_WRITE_AFTER_S = 3.0
"""How long the gate waits for the first writer's next read before it lets the second write go
(the new code does not read back after a won write)."""

TRAINER = """
import sys
from training.checkpointing.lease import Lease, LeaseHeld
lease = Lease(run=sys.argv[1], attempt=sys.argv[2], holder=f"trainer {sys.argv[2]}")
try:
    lease.acquire()
except LeaseHeld as err:
    print("REFUSED", err, flush=True)
    sys.exit(2)
print("WON", flush=True)
"""


class _Gate:
    """Holds each trainer's FIRST lease write (a PutObject, or pyarrow's CreateMultipartUpload)
    until both trainers are waiting on one, then lets trainer a's through, then trainer b's once
    a has read the lease again (or after :data:`SECOND_WRITE_AFTER_S`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting: set[str] = set()
        self.released: set[str] = set()
        self.reads_after_a = 0
        self.log: list[str] = []

    def read(self, who: str) -> None:
        with self.cond:
            self.log.append(f"read {who}")
            if "a" in self.released:
                self.reads_after_a += 1
                self.cond.notify_all()

    def write(self, who: str) -> None:
        with self.cond:
            if who in self.waiting:  # the rest of that write (multipart parts, completion)
                return
            self.waiting.add(who)
            self.log.append(f"write {who} held")
            self.cond.notify_all()
            # the bounds only end a hang: a trainer's start (imports) can take a minute on a loaded machine
            self.cond.wait_for(lambda: len(self.waiting) == 2, timeout=HOLD_BOUND_S)
            if who == "b":
                self.cond.wait_for(lambda: "a" in self.released, timeout=HOLD_BOUND_S)
                self.cond.wait_for(lambda: self.reads_after_a >= 1, timeout=SECOND_WRITE_AFTER_S)
            self.released.add(who)
            self.log.append(f"write {who} let through")
            self.cond.notify_all()


def _gate_server(upstream: str, gate: _Gate, who: str) -> ThreadingHTTPServer:
    """One gate port per trainer: the gate knows whose request it holds."""
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _relay(self) -> None:
            body = self._body()
            on_lease = self.path.split("?", 1)[0].endswith("/" + LEASE_KEY)
            if on_lease and self.command in ("GET", "HEAD"):
                gate.read(who)
            if on_lease and self.command in ("PUT", "POST"):
                gate.write(who)
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("connection", "transfer-encoding", "content-length")}
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                    self.send_header(key, value)
            # a HEAD's length is the object's (pyarrow sizes its read by it), not the empty body's
            self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                             else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():  # pyarrow's writes
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline().strip():  # trailers
                    pass
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_of_two_trainers_racing_for_one_run_exactly_one_wins(s3_server, s3_bucket, tmp_path):  # noqa: F811
    gate = _Gate()
    proxies = {name: _gate_server(s3_server.endpoint_url, gate, name) for name in ("a", "b")}
    run = f"{s3_bucket}/{tmp_path.name}/run"
    try:
        trainers = [subprocess.Popen(
            [sys.executable, "-c", TRAINER, run, name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_address[1]}",
                            "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
            for name, proxy in proxies.items()]
        outputs = [t.communicate(timeout=900)[0] for t in trainers]
    finally:
        for proxy in proxies.values():
            proxy.shutdown()
    print("gate:", gate.log)
    for output in outputs:
        print(output)
    # the interleaving happened: both writes were held before either went through
    through = next((i for i, line in enumerate(gate.log) if line.endswith("let through")), len(gate.log))
    assert {"write a held", "write b held"} <= set(gate.log[:through]), gate.log
    won = [o for o in outputs if o.strip().endswith("WON")]
    refused = [o for o in outputs if "REFUSED" in o]
    assert len(won) == 1 and len(refused) == 1, f"both trainers won the run: {outputs} (gate: {gate.log})"
    assert [t.returncode for t in trainers].count(2) == 1
    line = refused[0].strip()
    assert "\n" not in line and "trainer " in line and "refused (exit 2)" in line
    # the loser wrote nothing of the run: the run prefix holds the winner's lease alone
    bucket, _, prefix = run[len("s3://"):].partition("/")
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server.endpoint_url).list_objects_v2(
        Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
    assert keys == [f"{prefix}/{LEASE_KEY}"]


def _lost_reply_server(upstream: str) -> tuple[ThreadingHTTPServer, list[str]]:
    """Relays to moto's server, except that the FIRST lease PutObject reaches the store and its
    reply is lost: the connection closes before any answer, as a connection reset after the
    request was sent does. botocore retries a request whose connection closed before a reply
    (``ConnectionClosedError`` is retryable: botocore ``retryhandler``/``retries/standard``), so
    the same conditional write arrives a second time and S3 answers it 412."""
    target, log = urlsplit(upstream), []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            conn.close()
            on_lease = self.path.split("?", 1)[0].endswith("/" + LEASE_KEY)
            log.append(f"{self.command} {answer.status}")
            if on_lease and self.command == "PUT" and log.count("lost") == 0:
                log.append("lost")
                self.close_connection = True
                self.connection.shutdown(2)  # the write landed; its reply never arrives
                return
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                    self.send_header(key, value)
            self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                             else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, log


def test_a_trainer_whose_winning_write_lost_its_reply_keeps_its_lease(s3_server, s3_bucket, tmp_path):  # noqa: F811
    """S3 conditional writes: the retried ``If-None-Match: *`` PutObject answers 412 because the
    first one created the lease. Before the fix the trainer took that for another's win, read back
    its own lease and refused itself (exit 2), leaving a lease nobody holds for ``ttl_s``."""
    server, log = _lost_reply_server(s3_server.endpoint_url)
    run = f"{s3_bucket}/{tmp_path.name}/run"
    try:
        trainer = subprocess.run(
            [sys.executable, "-c", TRAINER, run, "a"], cwd=ROOT, capture_output=True, text=True, timeout=90,
            env={**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
                 "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
    finally:
        server.shutdown()
    output = trainer.stdout + trainer.stderr
    assert "lost" in log and log.count("PUT 412") >= 1, log  # the reply was lost and the retry refused
    assert trainer.returncode == 0 and output.strip().endswith("WON"), output
