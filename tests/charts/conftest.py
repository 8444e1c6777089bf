"""Session fixtures: each spec variant of charts_testspec synthesized ONCE per session."""
from __future__ import annotations

import pytest
from charts_testspec import SPEC_TOML, Synth, large_env, make_env, run_synth


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory) -> Synth:
    return run_synth(make_env(), tmp_path_factory.mktemp("dist-default"), spec_text=SPEC_TOML)


@pytest.fixture(scope="session")
def large_synth(tmp_path_factory) -> Synth:
    return run_synth(large_env(), tmp_path_factory.mktemp("dist-large"))
