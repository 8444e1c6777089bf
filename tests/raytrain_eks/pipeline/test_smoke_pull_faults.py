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


# --- Warming the cache by tag before Smoke (raytrain_eks/pipeline/smoke.py warm_cache) -----------

import hashlib  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


class CacheRegistry(BaseHTTPRequestHandler):
    """ECR's registry API under a pull-through cache rule, as far as the first pull goes (Amazon
    ECR User Guide, "Pulling an image with a pull through cache rule": ``docker pull
    <registry>/<prefix>/<upstream path>:<tag>`` fills the cache; aws/containers-roadmap issue 2837:
    a manifest asked for by digest that is not cached yet answers as missing and is NOT fetched
    upstream). ``upstream``: tag -> manifest bytes the upstream tag names now. Auth: ``Basic`` with
    the GetAuthorizationToken token (ECR's registry API), else 401."""

    upstream: dict[str, bytes] = {}
    cached: dict[str, bytes] = {}
    token = ""

    def _answer(self, send_body: bool) -> None:
        if self.headers.get("Authorization") != f"Basic {self.token}":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="https://ecr.example"')
            self.end_headers()
            return
        ref = self.path.rsplit("/manifests/", 1)[1]
        if ref.startswith("sha256:"):
            body = self.cached.get(ref)  # by digest: only what is cached (issue 2837)
        else:
            body = self.upstream.get(ref)
            if body is not None:  # by tag: fetched upstream and cached
                self.cached["sha256:" + hashlib.sha256(body).hexdigest()] = body
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), CacheRegistry)
    CacheRegistry.upstream, CacheRegistry.cached = {}, {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _cached_ctx():
    from environment import environment_from_dict
    from raytrain_eks.pipeline import StepContext
    from spec_template import template_raw

    raw = template_raw()
    raw["cluster"]["account"] = "111122223333"
    raw["image"].update(pull_through_cache=True)
    env = environment_from_dict(raw)
    return StepContext(env=env, dist=Path("dist"), kube=None, s3=None, ssm=None, history=None,
                       parameter_name="p", execution_id="e")


def _ecr():
    import boto3
    from moto import mock_aws

    with mock_aws():
        ecr = boto3.client("ecr", region_name="us-east-1")
        CacheRegistry.token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    token = CacheRegistry.token

    class Ecr:  # moto's token, served after its mock ends
        def get_authorization_token(self):
            return {"authorizationData": [{"authorizationToken": token}]}
    return Ecr()


def test_smoke_warms_the_cache_by_tag_so_the_pods_pull_by_digest(registry):
    """Before the fix nothing pulled the tag: the pods' first pull by digest was "not found" on
    every new digest (classed infrastructure, retried, failing the same way every time)."""
    from raytrain_eks.pipeline.smoke import warm_cache

    ctx = _cached_ctx()
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": []}).encode()
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    CacheRegistry.upstream = {ctx.env.image.tag: index}
    assert digest not in CacheRegistry.cached  # a pod's pull by digest now: not found
    line = warm_cache(ctx, digest, ecr=_ecr(), registry_url=registry)
    assert line.startswith("pull-through cache warmed") and CacheRegistry.cached[digest] == index
    # a second run (a retry) finds it cached and pulls nothing by tag
    CacheRegistry.upstream = {}
    assert warm_cache(ctx, digest, ecr=_ecr(), registry_url=registry).endswith("is cached already")


def test_a_tag_moved_on_or_an_unreachable_cache_is_infrastructure(registry):
    from raytrain_eks.pipeline.smoke import SmokeFailed, warm_cache

    ctx = _cached_ctx()
    CacheRegistry.upstream = {ctx.env.image.tag: b'{"schemaVersion": 2, "manifests": []}'}
    with pytest.raises(SmokeFailed) as moved:
        warm_cache(ctx, "sha256:" + "cd" * 32, ecr=_ecr(), registry_url=registry)
    assert moved.value.failure == FAILURE_INFRASTRUCTURE and "the tag has moved on" in str(moved.value)
    with pytest.raises(SmokeFailed) as down:
        warm_cache(ctx, "sha256:" + "cd" * 32, ecr=_ecr(), registry_url="http://127.0.0.1:9")
    assert down.value.failure == FAILURE_INFRASTRUCTURE
