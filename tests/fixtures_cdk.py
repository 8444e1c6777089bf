"""Synthesize each spec variant ONCE per session (a synth costs ~5-10 s on 2 cores, more cold).
The variants themselves are in infra_variants.py. A plain module (tests/infra and tests/raytrain_eks
both use the synthesized app): each folder's conftest.py imports the fixtures it needs.

Once per process, not once per importer: pytest makes one fixture definition per module that
holds the function (tests/infra/conftest.py and tests/raytrain_eks/conftest.py both import
these), each with its own session cache, so without :data:`_SYNTHESIZED` a worker that ran
tests of both folders synthesized ``default`` and ``existing`` twice."""
from __future__ import annotations

from typing import Callable

import pytest

from infra_variants import Synthesized, alternative_raw, capacity_raw, default_raw, existing_raw, synthesize

_SYNTHESIZED: dict[str, Synthesized] = {}


def _once(name: str, raw: Callable[[], dict], source: str, tmp_path_factory) -> Synthesized:
    if name not in _SYNTHESIZED:
        _SYNTHESIZED[name] = synthesize(raw(), tmp_path_factory.mktemp(f"cdk-{name}"), source)
    return _SYNTHESIZED[name]


@pytest.fixture(scope="session")
def default(tmp_path_factory) -> Synthesized:
    return _once("default", default_raw, "environment.toml", tmp_path_factory)


@pytest.fixture(scope="session")
def alternative(tmp_path_factory) -> Synthesized:
    return _once("alternative", alternative_raw, "alternative.toml", tmp_path_factory)


@pytest.fixture(scope="session")
def capacity(tmp_path_factory) -> Synthesized:
    return _once("capacity", capacity_raw, "capacity.toml", tmp_path_factory)


@pytest.fixture(scope="session")
def existing(tmp_path_factory) -> Synthesized:
    """Installed onto an existing EKS cluster (infra_variants.existing_raw): no network stack."""
    return _once("existing", existing_raw, "existing.toml", tmp_path_factory)


@pytest.fixture(scope="session", params=["default", "alternative", "capacity"])
def variant(request) -> Synthesized:
    return request.getfixturevalue(request.param)
