"""The cdk8s app synthesized per chart-test spec (tests/charts/charts_testspec.py) ONCE per process:
a plain module, as fixtures_cdk.py is for the CDK app, so tests/charts and tests/devtools (the
before/after oracle, devtools/synth_digest.py) share one synth instead of each paying for its own
(the bindings' import alone costs ~5 s without bytecode caching, a synth ~2 s more)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

# charts_testspec lives beside the chart tests (a plain module with a unique name), on the path
# pytest gives tests/charts only when it collects a test there
_CHART_TESTS = str(Path(__file__).resolve().parent / "charts")
if _CHART_TESTS not in sys.path:
    sys.path.append(_CHART_TESTS)

from charts_testspec import SPEC_TOML, Synth, large_env, make_env, run_synth  # noqa: E402

_SYNTHESIZED: dict[str, Synth] = {}


def _once(name: str, make: Callable[[Path], Synth], tmp_path_factory) -> Synth:
    if name not in _SYNTHESIZED:
        _SYNTHESIZED[name] = make(tmp_path_factory.mktemp(f"dist-{name}"))
    return _SYNTHESIZED[name]


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory) -> Synth:
    return _once("default", lambda out: run_synth(make_env(), out, spec_text=SPEC_TOML), tmp_path_factory)


@pytest.fixture(scope="session")
def large_synth(tmp_path_factory) -> Synth:
    return _once("large", lambda out: run_synth(large_env(), out), tmp_path_factory)
