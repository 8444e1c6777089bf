"""An outside fault at a known point of a run, for `make demo FAULT=1` and the tests' resume proofs:
strike (SIGKILL a worker process, from outside the job) once the run's checkpoint of step k is
saved for good, while the store HOLDS the next checkpoint's upload, so that the run can neither
save a newer checkpoint nor end before the fault has landed.

Why the hold: checkpoints upload in the background (ASYNC), and how far the loop gets between two
looks at the store depends on the machine's load (a loaded 2-core CI machine ran 4 steps past a
checkpoint before Ray Train's controller registered it). A run's end waits for its uploads, and
Ray Train registers a checkpoint only once its upload is complete (ray 2.58
``train/v2/_internal/execution/checkpoint/checkpoint_manager.py``): with the next checkpoint's
upload held at :data:`HOLD`, "checkpoint k is the newest registered" holds from the moment it is
seen until the fault strikes, whatever the load. Nothing races the clock.

The store is moto's S3 server behind the throttling layer of devtools/slow_store.py (its
``slowed(rate, only=...)``): the hold is a property of the store, the job's code runs unchanged.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"
"""Ray Train's record of the checkpoints it registered, written to ``<storage>/<run>/`` at each
registration (ray 2.58 ``train/v2/_internal/constants.py`` ``CHECKPOINT_MANAGER_SNAPSHOT_FILENAME``,
``execution/checkpoint/checkpoint_manager.py`` ``_write_state_to_storage``): a restart resumes
from its ``latest_checkpoint_result``."""
HOLD = 16 * 2**10
"""The held upload's rate until the fault has struck: bytes keep flowing every second (the AWS
SDK's low-speed timeout, 1 byte/s over 3 s, would fail a stalled request), and a held object of
10 MB takes over 10 minutes, so it cannot complete, and Ray Train cannot register it, before the
fault. Only what the store has not read yet is held: the sockets between client and store buffer
a few MB (the client's send buffer grows up to ``net.ipv4.tcp_wmem``'s 4 MB; the store's receive
window stays small while it reads slowly), and a body that fits there whole is sent at once and
waits for its answer instead, within the client's timeout. So each proof holds an object of well
over 4 MB: a checkpoint shard of the demo's model (vocabulary 151,936), of a test model whose
vocabulary is widened for it, or a LoRA run's merged export (its checkpoints hold the adapter
alone)."""
POLL_S = 0.5
"""How often the wait looks again (its bound is generous; only the polls are short)."""
BOUND_S = 900.0
"""The longest the wait for the saved checkpoint lasts (a loaded machine's run start included)."""


def _get(s3: Any, uri: str) -> bytes | None:
    from raytrain_eks.runs.results import split_uri

    bucket, key = split_uri(uri)
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket):  # not written yet (a submit makes its bucket)
        return None


def registered(s3: Any, run_uri: str) -> str | None:
    """The newest checkpoint Ray Train registered for the run (its snapshot), or None."""
    body = _get(s3, f"{run_uri}/{RAY_SNAPSHOT}")
    if body is None:
        return None
    return (json.loads(body).get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")


def logged_step(s3: Any, run_uri: str) -> int:
    """The last training step the run's ``metrics.jsonl`` in the store holds (0: none yet)."""
    body = _get(s3, f"{run_uri}/metrics.jsonl")
    rows = [json.loads(line) for line in (body or b"").decode().splitlines() if line.strip()]
    return max([r["step"] for r in rows if r.get("kind") == "train"], default=0)


def ray_train_workers(dashboard_url: str, token: str = "") -> list[Any]:
    """The live Ray Train worker actors of a cluster (``.pid``, ``.node_id``), from its state API
    through the dashboard (``ray.util.state.list_actors``); ``token``: a token-authenticated head's,
    sent in the request's own header (Ray caches ``RAY_AUTH_MODE`` once per process, so an
    environment set later is not seen)."""
    from ray.util.state.api import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    return StateApiClient(address=dashboard_url, headers=headers).list(
        StateResource.ACTORS, options=ListApiOptions(filters=[("class_name", "=", "RayTrainWorker"),
                                                              ("state", "=", "ALIVE")]),
        raise_on_missing_output=False)


class Strike:
    """``with Strike(store, held=..., ready=..., fault=...):`` around a run that blocks (a fit, a
    subprocess, a submitted job followed to its end). On entry the store holds checkpoint uploads
    whose path holds ``held`` (``/<run>/checkpoint_<k+1's step>/``) at :data:`HOLD`; a thread
    waits for ``ready()`` (checkpoint k saved for good, and whatever else the caller needs logged),
    calls ``fault()`` (the kill), then lets the store run at full speed again. The block's exit
    raises if the fault did not strike (``ended()`` true or the block left first, or
    :data:`BOUND_S` passed; the hold is released then too, so the run can end). ``struck`` holds what ``fault()`` returned."""

    def __init__(self, store: Any, *, held: str, ready: Callable[[], bool], fault: Callable[[], Any],
                 ended: Callable[[], bool] = lambda: False, bound_s: float = BOUND_S, what: str = "the fault's point"):
        self.store, self.held, self.ready, self.fault, self.ended = store, held, ready, fault, ended
        self.bound_s, self.what = bound_s, what
        self.struck: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._left = threading.Event()
        """Set when the block is left: the run it held has ended."""
        self._thread = threading.Thread(target=self._watch, name="strike", daemon=True)

    def __enter__(self) -> "Strike":
        self._hold = self.store.slowed(HOLD, only=self.held)
        self._hold.__enter__()
        self._thread.start()
        return self

    def _watch(self) -> None:
        try:
            deadline = time.monotonic() + self.bound_s
            while time.monotonic() < deadline:
                if self.ready():
                    self.struck = self.fault()
                    self._done.set()
                    return
                if self.ended() or self._left.is_set():
                    raise AssertionError(f"the run ended before {self.what}")
                time.sleep(POLL_S)
            raise AssertionError(f"timed out after {self.bound_s:.0f} s waiting for {self.what}")
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = err
        finally:
            self._hold.__exit__(None, None, None)

    def __exit__(self, kind, value, tb) -> None:
        self._left.set()
        self._thread.join(timeout=self.bound_s + 60)
        if kind is None and not self._done.is_set():
            raise AssertionError(f"the fault did not strike: {self.error!r}") from self.error
