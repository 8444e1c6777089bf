"""The waits of a stop and the run's own time limit (training/contract.py): each outer wait
covers the inner one, so a SIGKILL never lands inside the final checkpoint."""
from __future__ import annotations

import threading

from training.checkpointing import signals, stop_driver_after, time_limit_reached
from training.contract import (STOP_MARGIN_SECONDS, driver_exit_code, head_grace_seconds, run_time_limit_seconds,
                                stop_wait_seconds)


def test_each_wait_covers_the_one_inside_it():
    for grace in (30, 120, 600):
        assert grace < stop_wait_seconds(grace) < head_grace_seconds(grace)
        assert head_grace_seconds(grace) - stop_wait_seconds(grace) == STOP_MARGIN_SECONDS


def test_the_runs_own_limit_leaves_the_stop_wait_before_the_rayjob_deadline():
    assert run_time_limit_seconds(240, 120) + stop_wait_seconds(120) == 240 * 60
    assert run_time_limit_seconds(1, 600) == 60  # never negative: at least a minute of training


def test_the_time_limit_sets_the_drivers_stop_as_a_sigterm_does(monkeypatch):
    # forward_driver_sigterm keeps its event here; its forwarding thread hands it to the workers
    # (tests/training/test_resume_ray.py::test_driver_sigterm_is_forwarded_to_workers).
    fired = threading.Event()
    monkeypatch.setitem(signals._driver, "fired", fired)
    stop_driver_after(0, "time limit reached").join(timeout=60)
    assert fired.is_set()


def test_a_run_its_own_time_limit_stopped_exits_0_so_kuberay_does_not_retry_it(monkeypatch):
    """KubeRay ray-operator/v1.7.0 rayjob_controller.go:531-555: a RayJob whose driver exits
    non-zero is AppFailed and retried while ``backoffLimit`` allows (only DeadlineExceeded is
    exempt, :543). The run's own limit is its planned end: the driver must exit 0 after it
    (before the fix it returned run.json's 143 of a stopped run). A SIGTERM stop keeps 143."""
    monkeypatch.setattr(signals, "_driver", {"fired": threading.Event()})
    assert not time_limit_reached()
    assert driver_exit_code("stopped", 143, time_limit_reached()) == 143  # raytrain-eks stop: SIGTERM
    stop_driver_after(0, "time limit reached").join(timeout=60)
    assert time_limit_reached()
    assert driver_exit_code("stopped", 143, time_limit_reached()) == 0
    assert driver_exit_code("failed", 1, time_limit_reached()) == 1  # a failure stays one
