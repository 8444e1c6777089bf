"""With ``image.pull_through_cache`` every pod template (heads, workers, RayJob submitters) and
the job's own record name the cache's repository at the SAME digest; the provenance digest is
unchanged (what ``lock`` pinned, what the pipeline promotes)."""
from __future__ import annotations

import pytest

from charts_testspec import ACCOUNT, TEST_DIGEST, make_env, run_synth, spec_raw
from training import contract

CACHED = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/raytrain-ecr-public/deep-learning-containers/ray@{TEST_DIGEST}"


@pytest.fixture(scope="module")
def cached_synth(tmp_path_factory):
    raw = spec_raw()
    raw["image"]["pull_through_cache"] = True
    return run_synth(make_env(raw), tmp_path_factory.mktemp("dist-cached"))


def _images(node, found: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                found.add(value)
            elif key == "env" and isinstance(value, list):
                found.update(e["value"] for e in value if e.get("name") == contract.ENV_IMAGE)
            else:
                _images(value, found)
    elif isinstance(node, list):
        for value in node:
            _images(value, found)
    return found


def test_every_dlc_reference_is_the_cache_at_the_same_digest(cached_synth):
    ray_objects = [d for docs in cached_synth.docs.values() for d in docs if d.get("kind") in ("RayCluster", "RayJob")]
    assert {d["kind"] for d in ray_objects} == {"RayCluster", "RayJob"}
    for obj in ray_objects:
        assert _images(obj["spec"], set()) == {CACHED}, obj["metadata"]["name"]
        assert obj["metadata"]["annotations"]["raytrain.io/image-digest"] == TEST_DIGEST
        assert obj["metadata"]["annotations"]["raytrain.io/image"] == CACHED


def test_without_it_the_manifests_name_the_public_registry(default_synth):
    rc = default_synth.one("raycluster")
    assert _images(rc["spec"], set()) == {f"public.ecr.aws/deep-learning-containers/ray@{TEST_DIGEST}"}
