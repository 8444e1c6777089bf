"""Synthesize each spec variant ONCE per session (a synth costs ~5-10 s on 2 cores, more cold).
The variants themselves are in infra_variants.py. A plain module (tests/infra and tests/raytrain_eks
both use the synthesized app): each folder's conftest.py imports the fixtures it needs."""
from __future__ import annotations

import pytest

from infra_variants import Synthesized, alternative_raw, capacity_raw, default_raw, existing_raw, synthesize


@pytest.fixture(scope="session")
def default(tmp_path_factory) -> Synthesized:
    return synthesize(default_raw(), tmp_path_factory.mktemp("cdk-default"), "environment.toml")


@pytest.fixture(scope="session")
def alternative(tmp_path_factory) -> Synthesized:
    return synthesize(alternative_raw(), tmp_path_factory.mktemp("cdk-alternative"), "alternative.toml")


@pytest.fixture(scope="session")
def capacity(tmp_path_factory) -> Synthesized:
    return synthesize(capacity_raw(), tmp_path_factory.mktemp("cdk-capacity"), "capacity.toml")


@pytest.fixture(scope="session")
def existing(tmp_path_factory) -> Synthesized:
    """Installed onto an existing EKS cluster (infra_variants.existing_raw): no network stack."""
    return synthesize(existing_raw(), tmp_path_factory.mktemp("cdk-existing"), "existing.toml")


@pytest.fixture(scope="session", params=["default", "alternative", "capacity"])
def variant(request) -> Synthesized:
    return request.getfixturevalue(request.param)
