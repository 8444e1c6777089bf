"""Promote reads the smoke record the gate judged, and only this execution's: the URI must name
an object version (the Smoke action exports ``s3://...run.json?versionId=V``) and a run of this
execution (``smoke-<execution id>-<build>``), whose own ``run_dir`` agrees."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from raytrain_eks.pipeline.apply_promote import check_own_record
from raytrain_eks.pipeline.rollback import StepFailed

OWN = "s3://bucket/runs/smoke-exec-1-7/run.json"


def ctx(run_dir: str = "s3://bucket/runs/smoke-exec-1-7"):
    return SimpleNamespace(execution_id="exec-1", read_json=lambda uri: {"run_dir": run_dir})


def test_this_executions_record_at_a_version_passes():
    check_own_record(ctx(), OWN + "?versionId=v3")


@pytest.mark.parametrize("uri, run_dir, message", [
    (OWN, "s3://bucket/runs/smoke-exec-1-7", "names no object version"),
    ("s3://bucket/runs/smoke-exec-2-7/run.json?versionId=v1", "s3://bucket/runs/smoke-exec-2-7",
     "is not a run of execution exec-1"),
    ("s3://bucket/runs/smoke-exec-10-7/run.json?versionId=v1", "s3://bucket/runs/smoke-exec-10-7",
     "is not a run of execution exec-1"),  # a prefix of another execution's id is not its run
    (OWN + "?versionId=v1", "s3://bucket/runs/finetune", "says it is run 's3://bucket/runs/finetune'"),
])
def test_another_record_is_refused_and_not_the_images_fault(uri, run_dir, message):
    with pytest.raises(StepFailed, match=message) as refused:
        check_own_record(ctx(run_dir), uri)
    assert refused.value.failure == "infrastructure"


def test_promote_tags_the_digest_it_promotes_in_the_pull_through_cache():
    """keep_in_cache (before the compare-and-swap) re-tags the promoted digest in the cache's
    repository with environment.image_source.promoted_tag, the prefix the cache's lifecycle policy
    keeps (tests/infra/test_image_cache.py); against moto's ECR (getmoto/moto 5.2.5
    ``moto/ecr/models.py``: put_image, batch_get_image): the same manifest under the new tag, its
    digest unchanged; a second promotion of it changes nothing; a digest the cache does not hold
    refuses the promotion."""
    import json

    import boto3
    from moto import mock_aws

    from environment import environment_from_dict
    from environment.image_source import cache_repository, promoted_tag
    from infra.lambdas.image_watcher.promote import PromotionError
    from raytrain_eks.pipeline.apply_promote import keep_in_cache
    from spec_template import template_raw

    raw = template_raw()
    raw["cluster"]["account"] = "111122223333"
    raw["image"].update(pull_through_cache=True)
    env = environment_from_dict(raw)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                                      "digest": "sha256:" + "0" * 64}, "layers": []})
    with mock_aws():
        ecr = boto3.client("ecr", region_name="us-east-1")
        repository = cache_repository(env)
        ecr.create_repository(repositoryName=repository)
        # as the cache holds it; the digest as moto names it (its Image derives one from the layers,
        # where ECR hashes the manifest's bytes: moto's quirk, not what is tested here)
        cached = ecr.put_image(repositoryName=repository, imageManifest=manifest, imageTag=env.image.tag)
        digest = cached["image"]["imageId"]["imageDigest"]
        step = SimpleNamespace(env=env, ecr=ecr)
        assert keep_in_cache(step, digest).endswith("the cache's lifecycle policy keeps it")
        [image] = ecr.describe_images(repositoryName=repository)["imageDetails"]
        assert image["imageDigest"] == digest and sorted(image["imageTags"]) == sorted([env.image.tag, promoted_tag(digest)])
        assert "tagged" in keep_in_cache(step, digest)  # again (a retried Promote): nothing changes
        assert len(ecr.describe_images(repositoryName=repository)["imageDetails"]) == 1
        with pytest.raises(PromotionError, match="nothing promoted"):
            keep_in_cache(step, "sha256:" + "f" * 64)
    off = SimpleNamespace(env=environment_from_dict(template_raw()), ecr=None)
    assert keep_in_cache(off, digest).startswith("no pull-through cache")
