"""Whose fault a smoke run's failed image pull is (raytrain_eks/pipeline/smoke.py): the image is
shelved for good on an image fault, so a pull error of the registry, the pull-through cache or
the network between must be infrastructure. The pods are as the kubelet reports a container that
cannot pull (kubernetes ``pkg/kubelet/images/image_manager.go``: ``state.waiting`` reason
ErrImagePull / ImagePullBackOff, message the runtime's error; containerd's text is ``failed to
pull and unpack image "<ref>": failed to resolve reference "<ref>": <cause>``)."""
from __future__ import annotations

from infra.lambdas.image_watcher.history import FAILURE_IMAGE, FAILURE_INFRASTRUCTURE
from raytrain_eks.pipeline.smoke import job_failure, pull_errors

REF = "111122223333.dkr.ecr.us-east-1.amazonaws.com/raytrain-ecr-public/deep-learning-containers/ray@sha256:" + "ab" * 32


def _pod(reason: str, cause: str) -> dict:
    message = f'failed to pull and unpack image "{REF}": failed to resolve reference "{REF}": {cause}'
    return {"metadata": {"name": "smoke-head-x"}, "status": {"containerStatuses": [
        {"name": "ray-head", "state": {"waiting": {"reason": reason, "message": message}}}]}}


def _failure(cause: str, *, cached: bool, reason: str = "ErrImagePull") -> str:
    return job_failure({"reason": "DeadlineExceeded"}, pull_errors([_pod(reason, cause)]), started=False, cached=cached)


def test_a_registry_or_network_fault_is_infrastructure():
    """Before the fix every pull error shelved the image."""
    for cause in ("unexpected status from HEAD request to https://x/v2/: 503 Service Unavailable",
                  "dial tcp 10.0.1.5:443: i/o timeout",
                  "pulling from host x failed with status code [manifests sha256:ab]: 403 Forbidden"):
        assert _failure(cause, cached=True) == FAILURE_INFRASTRUCTURE, cause
        assert _failure(cause, cached=False, reason="ImagePullBackOff") == FAILURE_INFRASTRUCTURE, cause


def test_a_digest_the_cache_does_not_have_is_the_caches_fault_a_missing_one_upstream_the_images():
    """aws/containers-roadmap issue 2837: a first pull by digest may not fill the pull-through
    cache; through the cache "not found" proves nothing about the image."""
    cause = f"{REF}: not found"
    assert _failure(cause, cached=True) == FAILURE_INFRASTRUCTURE
    assert _failure(cause, cached=False) == FAILURE_IMAGE
    assert pull_errors([_pod("ErrImagePull", cause)])[0].startswith("smoke-head-x/ray-head: ErrImagePull: ")
