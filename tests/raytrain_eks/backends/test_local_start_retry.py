"""A local service start that fails (the process exits, or does not answer within its wait, as
on a loaded machine) is stopped and retried with a longer wait, never reported at once
(raytrain_eks/backends/local_services.py ``start_with_retries``, used by ``ray_head``, ``s3_server`` and
the tests' own Ray cluster and registry). The readiness call is injected: no timing, no Ray."""
from __future__ import annotations

import pytest

from raytrain_eks.backends import local_services
from raytrain_eks.backends.local_services import START_ATTEMPTS, ServiceStartError, start_with_retries


def test_a_start_that_times_out_is_retried_and_its_result_returned():
    attempts = []

    def start(attempt: int) -> str:
        attempts.append(attempt)
        if attempt == 1:
            raise ServiceStartError("did not answer within 360 s")
        return "head"

    assert start_with_retries(start, "Ray head") == "head"
    assert attempts == [1, 2]


def test_every_attempt_failing_is_one_error_naming_the_service_and_each_attempt():
    def start(attempt: int) -> None:
        raise ServiceStartError(f"timed out ({attempt})")

    with pytest.raises(ServiceStartError) as caught:
        start_with_retries(start, "moto S3 server")
    message = str(caught.value)
    assert message.startswith(f"moto S3 server did not start in {START_ATTEMPTS} attempts")
    assert all(f"attempt {n}: timed out ({n})" in message for n in range(1, START_ATTEMPTS + 1))


def test_a_bug_in_the_start_is_not_retried():
    calls = []

    def start(attempt: int) -> None:
        calls.append(attempt)
        raise TypeError("bug")

    with pytest.raises(TypeError):
        start_with_retries(start, "Ray head")
    assert calls == [1]


class _StartedHead:
    """A `ray start --head` that returned 0 (the head's processes are up): what `_start_head` hands back."""

    returncode = 0

    def wait(self, timeout: float) -> int:
        return 0


def test_ray_head_stops_a_head_that_was_not_ready_and_starts_a_fresh_one(monkeypatch):
    """The readiness call (the dashboard's /api/version) times out once, as on a loaded machine:
    the half-started head is stopped, a second one is started on new ports, and it is yielded."""
    starts, stopped, waits = [], [], []

    def fake_start_head(num_cpus, env, temp_dir, token, log):
        starts.append(len(starts) + 1)
        n = len(starts)
        return 1000 + n, 2000 + n, {"--metrics-export-port": 3000 + n}, _StartedHead()

    def fake_ready(url, timeout_s, proc, what, headers=None):
        waits.append((url, timeout_s))
        if len(waits) == 1:
            raise ServiceStartError(f"{what} did not answer at {url} within {timeout_s:.0f} s")

    monkeypatch.setattr(local_services, "_start_head", fake_start_head)
    monkeypatch.setattr(local_services, "_wait_http", fake_ready)
    monkeypatch.setattr(local_services, "stop_ray", lambda temp_dir, gcs: stopped.append(gcs))
    monkeypatch.setattr(local_services, "kill_group", lambda proc, marker=None: None)

    with local_services.ray_head(num_cpus=1) as head:
        assert head.gcs_address == f"{local_services.LOOPBACK}:1002"
        assert head.dashboard_url == local_services.dashboard_url(2002)
    assert starts == [1, 2]
    assert waits[1][1] > waits[0][1]  # the second attempt waits longer
    assert stopped == [f"{local_services.LOOPBACK}:1001", f"{local_services.LOOPBACK}:1002"]
