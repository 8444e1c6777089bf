"""Shared fixtures: a tiny Qwen2 config and ONE local Ray cluster per test session.

Every ``TorchTrainer.fit`` costs ~20-30 s of start-up on 2 cores, and ``ray.init`` itself a few
seconds more: tests that need Ray take ``ray_cluster`` and share the same one.
"""
from __future__ import annotations

import os

import pytest

from tiny_qwen import TINY_VOCAB, tiny_qwen2_config  # noqa: F401  (re-exported)


@pytest.fixture
def tiny_qwen2():
    """A tiny Qwen2 config (dict of Qwen2Config kwargs) with a small vocabulary."""
    return tiny_qwen2_config()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs; no dashboard)."""
    ray = pytest.importorskip("ray")
    # Each ray.train.report waits for a controller poll (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by
    # default): poll fast in tests.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    # Workers push their metrics to the node's agent every 10 s by default: a short test run
    # could end between two pushes. Set before ray.init so every Ray process inherits it.
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
                                           "RAY_metrics_report_interval_ms": "1000"}})
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """`-m "not slow"` is the inner loop: a test that starts Ray (takes ``ray_cluster``) must be
    marked slow, or the fast set would start a cluster."""
    unmarked = [item.nodeid for item in items if "ray_cluster" in getattr(item, "fixturenames", ())
                and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError("tests that start Ray must be marked slow: " + ", ".join(unmarked))
