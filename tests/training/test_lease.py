"""One writer per run (training/checkpointing/lease.py): the lease in the run's storage, and the
checkpoint manager's check before it seals and reports a checkpoint (Ray Train prunes on a
report). Two trainers on one real run are in tests/e2e/test_stop_job.py."""
from __future__ import annotations

import json

import pytest
import torch

from training.checkpointing import CheckpointManager, Lease, LeaseHeld, TrainerState
from training.checkpointing.lease import LEASE_TTL_S, LeaseLost
from training.checkpointing.markers import run_exists


def _lease(run, name: str) -> Lease:
    return Lease(run=str(run), attempt=f"attempt-{name}", holder=f"Ray job {name} on head-{name} (pid 1)")


def test_a_second_trainer_refuses_in_one_line_naming_the_holder(tmp_path):
    first, second = _lease(tmp_path / "run", "a"), _lease(tmp_path / "run", "b")
    first.acquire(now=1000.0)
    with pytest.raises(LeaseHeld) as refused:
        second.acquire(now=1010.0)
    line = str(refused.value)
    assert "\n" not in line and "Ray job a on head-a (pid 1)" in line and "attempt attempt-a" in line
    assert f"heartbeat 10 s ago, lease expires {LEASE_TTL_S - 10} s after it" in line
    assert first.problem() is None  # the refusal wrote nothing


def test_a_crashed_holders_lease_expires_and_the_holder_then_sees_it_lost(tmp_path):
    first, second = _lease(tmp_path / "run", "a"), _lease(tmp_path / "run", "b")
    first.acquire(now=1000.0)
    second.acquire(now=1000.0 + LEASE_TTL_S)  # no renewal for a whole TTL: taken over
    assert "held by Ray job b on head-b" in first.problem()
    assert first.renew() is not None and second.read()["attempt"] == "attempt-b"  # a lost lease is not renewed


def test_release_deletes_only_our_own_lease_and_a_lease_alone_is_no_run(tmp_path):
    run = tmp_path / "run"
    first, second = _lease(run, "a"), _lease(run, "b")
    first.acquire()
    assert not run_exists(str(run))  # plan_resume: a fresh run is still fresh
    second.release()
    assert first.read()["attempt"] == "attempt-a"
    first.release()
    assert first.read() is None
    second.acquire()  # at once, no expiry to wait for


def _manager(tmp_path, lease: Lease, reported: list) -> CheckpointManager:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    class Position:
        def state_dict(self):
            return {"position": 0}

        def load_state_dict(self, state):
            pass

    trainer = TrainerState(data=Position(), scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
    return CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=str(tmp_path / "node"),
                             run_name="run", every_n_steps=1, lease=lease,
                             report=lambda metrics, folder, name: reported.append(name))


def test_a_trainer_that_lost_its_run_seals_and_reports_nothing(tmp_path):
    ours, theirs = _lease(tmp_path / "storage" / "run", "a"), _lease(tmp_path / "storage" / "run", "b")
    ours.acquire(now=1000.0)
    reported: list[str] = []
    manager = _manager(tmp_path, ours, reported)
    manager.save(1, {})
    manager.wait()
    assert reported == ["checkpoint_00000001"]
    theirs.acquire(now=1000.0 + LEASE_TTL_S)  # ours expired: a second trainer took the run
    manager.save(2, {})
    with pytest.raises(LeaseLost, match="checkpoint at step 2 not written: this trainer lost its run: .*Ray job b"):
        manager.wait()
    assert reported == ["checkpoint_00000001"]  # no report: Ray Train neither uploads nor prunes
    folder = tmp_path / "node" / "run" / "checkpoint_00000002" / "rank_0"
    assert not (folder / "COMPLETE.json").exists()
    assert json.loads((tmp_path / "storage" / "run" / "LEASE.json").read_text())["attempt"] == "attempt-b"


class _FlakyReads:
    """A pyarrow filesystem whose next ``failures`` reads raise OSError, as pyarrow's S3 client
    does once its own retries are spent (pyarrow 2x ``S3FileSystem``: a missing key is
    FileNotFoundError, any other error an OSError)."""

    def __init__(self, fs, failures: int):
        self.fs, self.failures = fs, failures

    def open_input_file(self, path):
        if self.failures:
            self.failures -= 1
            raise OSError("When reading information for key 'run/LEASE.json': AWS Error NETWORK_CONNECTION")
        return self.fs.open_input_file(path)

    def __getattr__(self, name):
        return getattr(self.fs, name)


def _flaky(monkeypatch, failures: int) -> _FlakyReads:
    from training.storage import files

    monkeypatch.setattr(files, "RETRY_PAUSE_S", 0.0)
    real = files.filesystem_for
    flaky = _FlakyReads(None, failures)

    def filesystem_for(uri):
        fs, path = real(uri)
        flaky.fs = fs
        return flaky, path

    monkeypatch.setattr(files, "filesystem_for", filesystem_for)
    return flaky


def test_an_unreadable_lease_is_not_an_absent_one(tmp_path, monkeypatch):
    """Before the fix Lease.read() took any OSError for "no lease": a second trainer took over a
    live holder's lease, and the holder's renew reported it gone (keep_renewed then stopped)."""
    from training.checkpointing.lease import READ_TRIES, LeaseUnreadable

    first, second = _lease(tmp_path / "run", "a"), _lease(tmp_path / "run", "b")
    first.acquire(now=1000.0)
    flaky = _flaky(monkeypatch, failures=READ_TRIES)
    with pytest.raises(LeaseHeld, match="refusing to start: lease .* could not be read"):
        second.acquire(now=1010.0)  # fails closed: writes nothing
    flaky.failures = READ_TRIES
    with pytest.raises(LeaseUnreadable):  # an OSError: keep_renewed logs it and beats again
        first.renew()
    assert first.problem() is None and first.read()["attempt"] == "attempt-a"
    flaky.failures = READ_TRIES - 1  # a passing error is retried away
    assert first.renew() is None
    flaky.failures = READ_TRIES
    with pytest.raises(LeaseHeld):
        second.acquire(now=1000.0 + LEASE_TTL_S)  # even an expired-looking run is not taken blind
    assert first.read()["attempt"] == "attempt-a"


def test_a_write_based_on_a_stale_read_is_refused(tmp_path):
    """The compare-and-swap itself (directory storage: flock + sha256 "ETag"): a trainer that read
    the lease, then lost the race to a writer, writes nothing. Before the fix the lease was
    written unconditionally and the later writer won."""
    run = tmp_path / "run"
    first, second = _lease(run, "a"), _lease(run, "b")
    first.acquire(now=1000.0)
    seen, etag = second._fetch()  # b read an expired-looking lease ...
    first.renew(now=1000.0 + LEASE_TTL_S)  # ... a renewed meanwhile ...
    assert not second._swap(1000.0 + LEASE_TTL_S, etag)  # ... so b's takeover is refused
    assert first.read()["attempt"] == "attempt-a" and first.problem() is None
    third = _lease(run, "c")
    assert not third._swap(1000.0, None)  # "create only if absent" while one exists
