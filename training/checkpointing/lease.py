"""One writer per run: a lease in the run's storage, ``<storage>/<run>/LEASE.json``.

Ray Train resumes whatever ``<storage>/<run>`` holds, so two trainers started on one run (``submit
--resume X`` while ``X-on-cluster`` runs, a RayJob retry beside a driver that is still alive)
would both restore, both write ``checkpoint_<step>`` folders of the same names, and each one's
``keep_last`` pruning would delete the other's. The lease says who writes:

- the driver takes it before anything is restored or written (:meth:`Lease.acquire`): a lease
  held by another attempt whose heartbeat is younger than its ``ttl_s`` refuses the start in one
  line naming the holder (exit 2: nothing waits); an expired one (a crashed holder stops renewing)
  is taken over;
- the driver renews it every :data:`HEARTBEAT_S` (:func:`keep_renewed`) and releases it at the end;
- before a checkpoint is sealed (its ``COMPLETE.json``) and reported to Ray Train, whose
  controller prunes beyond ``keep_last`` only on a report, rank 0 checks that the lease is still
  this attempt's (:meth:`Lease.problem`): a trainer that lost its run writes and prunes nothing.

Every write is a compare-and-swap, so of two trainers racing for one run exactly one wins and the
other refuses at :meth:`Lease.acquire`, before it has written anything of the run. A write-then-
read-back is no mutual exclusion: a trainer writing between another's write and read-back wins
too. The swap is the storage room's :class:`training.storage.files.ConditionalFile`: S3
conditional writes (``If-None-Match: *`` to create, ``If-Match: <ETag>`` to renew, take over
and delete), or an ``flock``-guarded replace on a directory or shared mount.

Heartbeats are wall-clock times of the writer's clock, compared with the reader's (EKS nodes
keep NTP time); ``ttl_s`` is far above any plausible skew.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from training.checkpointing.markers import LEASE_NAME
from training.storage import join
from training.storage import files
from training.storage.files import LOST_RACE_CODES, READ_TRIES  # noqa: F401  (re-exported: the lease's policy is the storage's)

log = logging.getLogger(__name__)

LEASE_TTL_S = 120
"""A lease whose heartbeat is older than this is a crashed holder's: the next trainer takes it."""
HEARTBEAT_S = 30
"""How often the driver renews its lease (a quarter of :data:`LEASE_TTL_S`: three missed renewals
are still no expiry)."""
class LeaseHeld(ValueError):
    """Another live trainer writes this run; ``str()`` is one line naming it."""


class LeaseUnreadable(OSError):
    """The lease could not be read (not: is absent). Fails closed: :meth:`Lease.acquire` refuses,
    a checkpoint is not sealed, and :func:`keep_renewed` keeps trying (an OSError)."""


class LeaseLost(RuntimeError):
    """This trainer's lease was taken over: it may write nothing more to the run."""


@dataclass(kw_only=True, slots=True)
class Lease:
    """This attempt's claim on one run directory."""

    run: str
    """``<storage>/<run_name>`` (``s3://...`` or a local path)."""
    attempt: str
    """Unique per driver start (a restart within the run keeps it: Ray Train's worker retries)."""
    holder: str
    """Who holds it, for the refusal line: the Ray job, its host (on EKS the head pod) and pid."""
    ttl_s: int = LEASE_TTL_S
    _etag: str | None = field(default=None, repr=False, compare=False)
    """The ETag of this attempt's last write (what :meth:`release` deletes)."""

    @property
    def uri(self) -> str:
        return join(self.run, LEASE_NAME)

    def _fetch(self) -> tuple[dict[str, Any] | None, str | None]:
        """The stored lease and its ETag; (None, None) when absent, (None, etag) when not a lease.
        A read error (after the storage's retries) raises :class:`LeaseUnreadable`: an unreadable
        lease is never taken for an absent one."""
        try:
            got = files.ConditionalFile(self.uri).get()
        except OSError as err:
            raise LeaseUnreadable(f"lease {self.uri} could not be read ({files.READ_TRIES} tries): {err}") from err
        if got is None:
            return None, None
        raw, etag = got
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            return None, etag
        return (body if isinstance(body, dict) and "attempt" in body else None), etag

    def read(self) -> dict[str, Any] | None:
        """The stored lease; None when there is none (absent, or not a lease)."""
        return self._fetch()[0]

    def _swap(self, now: float, etag: str | None) -> bool:
        body = {"attempt": self.attempt, "holder": self.holder, "heartbeat": now, "ttl_s": self.ttl_s}
        new = files.ConditionalFile(self.uri).put(json.dumps(body, sort_keys=True).encode("utf-8"), etag=etag)
        if new is not None:
            self._etag = new
        return new is not None

    def acquire(self, now: float | None = None) -> None:
        """Take the lease, or raise :class:`LeaseHeld` while another attempt's is alive or another
        trainer won the same instant. Writes nothing but the lease."""
        now = time.time() if now is None else now
        try:
            current, etag = self._fetch()
        except LeaseUnreadable as err:  # fail closed: a live holder's lease may be behind the error
            raise LeaseHeld(f"run {self.run}: refusing to start: {err}; another trainer may hold it") from err
        if current is not None and current["attempt"] != self.attempt and _alive(current, now):
            raise LeaseHeld(self._refusal(current, now))
        if self._swap(now, etag):
            return
        try:  # the condition failed: another writer created or took the lease since our read
            winner, won_etag = self._fetch()
        except LeaseUnreadable:
            winner, won_etag = None, None
        if winner is not None and winner["attempt"] == self.attempt:
            # our own write: it landed but its reply was lost, and the SDK's retry of the same
            # conditional write was refused (412) because of it. The attempt id is ours alone.
            self._etag = won_etag
            return
        raise LeaseHeld(self._refusal(winner or {"holder": "another trainer", "attempt": "?", "heartbeat": now}, now))

    def problem(self) -> str | None:
        """Why this attempt may not write the run any more (its lease taken or gone), or None.
        Raises :class:`LeaseUnreadable` when that cannot be known."""
        return self._problem(self.read())

    def _problem(self, current: dict[str, Any] | None) -> str | None:
        if current is None:
            return f"its lease {self.uri} is gone"
        if current["attempt"] != self.attempt:
            return f"its lease {self.uri} is held by {_describe(current, time.time())}"
        return None

    def renew(self, now: float | None = None) -> str | None:
        """Refresh the heartbeat while the lease is ours; else return the reason it is not.
        Raises :class:`LeaseUnreadable` (nothing written) when that cannot be known."""
        current, etag = self._fetch()
        problem = self._problem(current)
        if problem is None and not self._swap(time.time() if now is None else now, etag):
            return self._problem(self.read()) or f"its lease {self.uri} changed while it was renewed"
        return problem

    def release(self) -> None:
        """Delete the lease if it is still ours (the next trainer need not wait for expiry)."""
        try:
            current, etag = self._fetch()
        except LeaseUnreadable as err:  # it expires after ttl_s instead
            log.warning("could not release the lease: %s", err)
            return
        if current is not None and current["attempt"] == self.attempt and etag is not None:
            try:
                files.ConditionalFile(self.uri).delete(etag)
            except Exception as err:  # noqa: BLE001  (it expires after ttl_s instead)
                log.warning("could not release the lease %s: %s", self.uri, err)

    def _refusal(self, current: dict[str, Any], now: float) -> str:
        return (f"run {self.run} is being written by another trainer: {_describe(current, now)}; "
                "this start is refused (exit 2) and nothing waits: stop that run first (raytrain-eks stop RUN), "
                "or start again once its lease has expired")

    def to_dict(self) -> dict[str, Any]:
        """What the driver hands the workers (train_loop_config)."""
        return {"run": self.run, "attempt": self.attempt, "holder": self.holder, "ttl_s": self.ttl_s}


def _alive(current: dict[str, Any], now: float) -> bool:
    return now - float(current.get("heartbeat", 0)) < float(current.get("ttl_s", LEASE_TTL_S))


def _describe(current: dict[str, Any], now: float) -> str:
    age = now - float(current.get("heartbeat", now))
    ttl = float(current.get("ttl_s", LEASE_TTL_S))
    return (f"{current.get('holder', '?')} (attempt {current.get('attempt', '?')}, heartbeat {age:.0f} s ago, "
            f"lease expires {max(0.0, ttl - age):.0f} s after it)")


def keep_renewed(lease: Lease, every_s: float = HEARTBEAT_S) -> threading.Event:
    """Renew ``lease`` every ``every_s`` on a daemon thread; set the returned event to stop.
    A lost lease is logged once (the workers refuse to checkpoint on their own check)."""
    done = threading.Event()

    def _beat() -> None:
        while not done.wait(every_s):
            try:
                problem = lease.renew()
            except OSError as err:  # a storage hiccup (LeaseUnreadable too): the next beat retries, the TTL covers it
                log.warning("lease heartbeat failed: %s", err)
                continue
            if problem:
                log.error("this trainer lost its run: %s", problem)
                return

    threading.Thread(target=_beat, name="lease-heartbeat", daemon=True).start()
    return done
