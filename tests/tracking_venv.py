"""The tracking tools' own environment (``.work/tracking-venv``, made by ``make install`` from
``tracking-requirements.txt``): TensorBoard's event reader and a real MLflow tracking server,
the oracles of the TensorBoard and MLflow sinks. Their own venv because their pins conflict
with the job's (mlflow 3.17.2 requires ``pyarrow<26``; the job's venv has pyarrow 26) and
because the DLC has neither (the job must not come to depend on them).

Shared by tests/training and tests/e2e (a plain module, as tests/fixtures_*.py are).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACKING_PYTHON = ROOT / ".work" / "tracking-venv" / "bin" / "python"

# TensorBoard 2.21.0, tensorboard/backend/event_processing/event_accumulator.py: EventAccumulator
# reads every event file of a folder (directory_watcher, in file-name order); scalars written as
# ``simple_value`` come back from Scalars(tag), text summaries (plugin "text", a string tensor)
# from Tensors(tag) (tensor_util.make_ndarray). size_guidance 0 keeps every event (the default
# samples 10,000 scalars and 10 tensors per tag by reservoir).
READ_EVENTS = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.util import tensor_util
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
out = {"scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
       "text": {t: [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()] for e in acc.Tensors(t)]
                for t in tags["tensors"]}}
print(json.dumps(out))
"""


def tracking_python() -> Path:
    """The venv's interpreter; the test is skipped, saying how to make it, when it is absent."""
    if not TRACKING_PYTHON.exists():
        pytest.skip(f"{TRACKING_PYTHON} is missing: `make install` (or `make tracking-venv`) makes it")
    return TRACKING_PYTHON


def read_events(logdir: Path) -> dict[str, Any]:
    """``{"scalars": {tag: [[step, value], ...]}, "text": {tag: [[step, text], ...]}}`` as
    TensorBoard's own reader sees the folder."""
    proc = subprocess.run([str(tracking_python()), "-c", READ_EVENTS, str(logdir)],
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout)


def expected_scalars(rows: list[dict[str, Any]], *, float32: bool = True) -> dict[str, list[list[float]]]:
    """What the events (``float32``) or MLflow's metrics (doubles) must hold for these
    metrics.jsonl rows: every number of every row by step under ``<kind>/<key>``, the later row
    winning on a repeated step (as the report reads)."""
    from training.metric_sinks import row_step, scalars

    table: dict[str, dict[int, float]] = {}
    for row in rows:
        for tag, value in scalars(row):
            table.setdefault(tag, {})[row_step(row)] = as_float32(value) if float32 else value
    return {tag: [[step, value] for step, value in sorted(steps.items())] for tag, steps in table.items()}


def as_float32(value: float) -> float:
    """A scalar as an event holds it: ``Summary.Value.simple_value`` is a proto ``float``
    (32 bits; tensorboard 2.21.0 tensorboard/compat/proto/summary.proto)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def last_by_step(points: list[list[float]]) -> list[list[float]]:
    """A tag's events, one per step (the last written), in step order."""
    return [[step, value] for step, value in sorted({int(s): v for s, v in points}.items())]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


NO_JOB_RUNNERS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""mlflow 3.17.2 starts huey consumer processes for its server-side jobs by default
(``mlflow/environment_variables.py`` ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``, default True;
``mlflow/server/__init__.py`` and ``server/jobs/utils.py`` ``_launch_huey_consumer``): GenAI
evaluation and prompt-optimization jobs, which nothing here submits. The tracking REST API the
job and the CLI use is served the same either way. Off, a server costs ~6 CPU-s over its start and
20 idle seconds instead of ~24 (its group's processes 2 instead of 10; 2026-12-06, two pairs back
to back)."""


@contextlib.contextmanager
def mlflow_server(folder: Path, *, start_s: float = 300.0, artifact_root: str = "") -> Iterator[str]:
    """A real ``mlflow server`` (3.17.2) on 127.0.0.1: its runs in SQLite under ``folder``, its
    artifacts served through its own proxy (``--serve-artifacts``, the default: runs get
    ``mlflow-artifacts:/`` URIs), or with ``artifact_root`` not served: runs get URIs under it,
    which the client writes itself (as SageMaker's managed MLflow does with its S3 artifact
    store). Yields the base URL; stops its process group at the end. A
    start that does not answer within ``start_s`` (a loaded machine) is stopped and started again
    on a fresh port with a longer wait (``start_with_retries``)."""
    import time

    from raytrain_eks.backends.local_services import ServiceStartError, start_with_retries

    folder.mkdir(parents=True, exist_ok=True)

    def start(attempt: int) -> tuple[subprocess.Popen, str, Any]:
        url = f"http://127.0.0.1:{_free_port()}"
        argv = [str(tracking_python()), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                url.rsplit(":", 1)[1], "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                *(["--no-serve-artifacts", "--default-artifact-root", artifact_root] if artifact_root
                  else ["--artifacts-destination", str(folder / "artifacts")]), "--workers", "1"]
        log = (folder / "server.log").open("w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
                                env={**os.environ, **NO_JOB_RUNNERS})
        deadline = time.monotonic() + start_s * attempt  # a bound on waiting for the event, not a measurement
        while not _up(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc, log)
                raise ServiceStartError(f"mlflow server did not start: {(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        return proc, url, log

    proc, url, log = start_with_retries(start, "mlflow server")
    try:
        yield url
    finally:
        _stop(proc, log)


def _stop(proc: subprocess.Popen, log) -> None:
    """SIGTERM to the server's group, SIGKILL after 60 s: on a loaded machine its graceful
    shutdown (a worker finishing its requests) can take longer, and the session must still end."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    log.close()


def rest_post(url: str, path: str, body: dict[str, Any]) -> Any:
    """A POST of JSON on the server (standard library), its JSON answer."""
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def rest_get(url: str, path: str, **query: str) -> Any:
    """A GET on the server, read with the standard library (not the code under test): JSON, or
    the raw bytes of an artifact."""
    import urllib.parse

    full = f"{url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(full, timeout=60) as answer:
        body = answer.read()
    return json.loads(body) if answer.headers.get_content_type() == "application/json" else body
