"""Resolve an image tag to its digest through the OCI distribution (Docker Registry v2) HTTP API.

The protocol, as public.ecr.aws and the CNCF ``registry`` speak it:

1. ``HEAD /v2/<name>/manifests/<tag>`` with an ``Accept`` listing the manifest media types we
   understand (OCI index + manifest, Docker manifest list + schema 2). A multi-arch tag answers
   with its index, whose digest is what ``image@sha256:...`` pins.
2. ``401`` with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``: fetch an anonymous
   token from the realm (``GET realm?service=...&scope=...`` -> ``{"token": ...}``), retry with
   ``Authorization: Bearer <token>``.
3. Read ``Docker-Content-Digest``. A registry may omit it; then ``GET`` the manifest and hash its
   bytes ourselves (the digest IS the sha256 of the manifest as served).

Standard library only: the image-watcher Lambda packages this very module into its asset
(infra/stacks/pipeline_watcher.py), so the CLI and the Lambda cannot disagree about a digest.
Every failure a user or the network can cause is a :class:`RegistryError` with one line.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from environment.contract import DIGEST_PATTERN

REQUEST_TIMEOUT_S = 15.0
"""The bound on one registry request (connect and read); the watcher Lambda's timeout is sized from it."""
MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_AUTH_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(ValueError):
    """The registry could not give a digest; ``str(err)`` is the one line to print."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageLocation:
    """Where a tag lives: the registry's base URL and the repository name inside it."""

    registry_url: str
    """``https://public.ecr.aws`` (no trailing slash, no ``/v2``)."""
    name: str
    """Repository path inside the registry, e.g. ``deep-learning-containers/ray``."""
    tag: str

    @classmethod
    def from_repository(cls, repository: str, tag: str, registry_url: str = "") -> "ImageLocation":
        """``repository`` as written in environment.toml (``host[:port]/path``). The URL defaults
        to ``https://host``; loopback hosts get ``http://``, as docker treats them."""
        host, _, name = repository.partition("/")
        if not name:
            raise RegistryError(f"image repository {repository!r} is not registry/name")
        if not registry_url:
            scheme = "http" if host.split(":")[0] in _LOOPBACK_HOSTS or host.startswith("[::1]") else "https"
            registry_url = f"{scheme}://{host}"
        return cls(registry_url=registry_url.rstrip("/"), name=name, tag=tag)

    @property
    def manifest_url(self) -> str:
        return f"{self.registry_url}/v2/{self.name}/manifests/{urllib.parse.quote(self.tag, safe='')}"

    @property
    def display(self) -> str:
        return f"{self.name}:{self.tag} at {self.registry_url}"


def resolve_digest(location: ImageLocation, *, timeout: float = REQUEST_TIMEOUT_S) -> str:
    """Return ``sha256:<hex>`` of the manifest (or index) the tag points to now."""
    headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
    status, reply_headers, _ = _request("HEAD", location.manifest_url, headers, location, timeout)
    if status == 401:
        headers["Authorization"] = "Bearer " + _fetch_token(reply_headers, location, timeout)
        status, reply_headers, _ = _request("HEAD", location.manifest_url, headers, location, timeout)
    _raise_for_status(status, location)
    digest = reply_headers.get("Docker-Content-Digest", "").strip()
    if digest:
        if not DIGEST_PATTERN.fullmatch(digest):
            raise RegistryError(f"malformed reply from {location.display}: Docker-Content-Digest "
                                f"{digest[:80]!r} is not sha256:<64 hex digits>")
        return digest
    # No header: the digest is the sha256 of the manifest bytes exactly as served.
    status, _, body = _request("GET", location.manifest_url, headers, location, timeout)
    _raise_for_status(status, location)
    _check_manifest(body, location)
    return "sha256:" + hashlib.sha256(body).hexdigest()


INDEX_MEDIA_TYPES = ("application/vnd.oci.image.index.v1+json",
                     "application/vnd.docker.distribution.manifest.list.v2+json")
REQUIRED_PLATFORM = ("linux", "amd64")
"""What the GPU nodes run (g6 instances are x86_64)."""


def fetch_manifest(location: ImageLocation, digest: str, *, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    """The manifest (or index) ``digest`` names, as JSON."""
    url = f"{location.registry_url}/v2/{location.name}/manifests/{digest}"
    headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
    status, reply_headers, body = _request("GET", url, headers, location, timeout)
    if status == 401:
        headers["Authorization"] = "Bearer " + _fetch_token(reply_headers, location, timeout)
        status, _, body = _request("GET", url, headers, location, timeout)
    _raise_for_status(status, location)
    _check_manifest(body, location)
    return json.loads(body)


def platform_problem(location: "ImageLocation", digest: str, *, timeout: float = REQUEST_TIMEOUT_S) -> str:
    """Why the GPU nodes cannot run ``digest`` (one line), or "" when they can: an image index
    (multi-arch tag) must have a :data:`REQUIRED_PLATFORM` entry; a single manifest is taken as is."""
    found = platforms(fetch_manifest(location, digest, timeout=timeout))
    if found is not None and REQUIRED_PLATFORM not in found:
        return (f"{location.display} is an image index without {'/'.join(REQUIRED_PLATFORM)} "
                f"(it has: {', '.join('/'.join(p) for p in found) or 'no platforms'}): the GPU nodes cannot run it")
    return ""


def platforms(manifest: dict) -> list[tuple[str, str]] | None:
    """``[(os, architecture), ...]`` of an index's entries; ``None`` for a single manifest.
    BuildKit attestation entries (``unknown/unknown``) are not platforms."""
    if manifest.get("mediaType") not in INDEX_MEDIA_TYPES and "manifests" not in manifest:
        return None
    found = []
    for entry in manifest.get("manifests") or []:
        platform = entry.get("platform") or {}
        pair = (platform.get("os", "unknown"), platform.get("architecture", "unknown"))
        if pair != ("unknown", "unknown"):
            found.append(pair)
    return found


def _request(method: str, url: str, headers: dict[str, str], location: ImageLocation,
             timeout: float) -> tuple[int, "http.client.HTTPMessage", bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.headers, reply.read() if method != "HEAD" else b""
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, b""
    except urllib.error.URLError as err:
        raise RegistryError(f"registry unreachable: {location.registry_url}: {_reason(err.reason)}") from None
    except (http.client.HTTPException, ConnectionError) as err:
        # A server that answers with something that is not HTTP (or hangs up mid-reply).
        raise RegistryError(f"malformed reply from {location.display}: "
                            f"{type(err).__name__} {str(err)[:80]!r}") from None
    except (socket.timeout, TimeoutError):
        raise RegistryError(f"registry unreachable: {location.registry_url}: no reply within {timeout:g} s") from None


def _reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason)


def _raise_for_status(status: int, location: ImageLocation) -> None:
    if status == 200:
        return
    if status == 404:
        raise RegistryError(f"tag not found: {location.display} (HTTP 404): check image.tag")
    if status in (401, 403):
        raise RegistryError(f"access denied to {location.display} (HTTP {status}): "
                            "the repository is private or the name is wrong")
    raise RegistryError(f"unexpected reply from {location.display}: HTTP {status}")


def _fetch_token(headers: "http.client.HTTPMessage", location: ImageLocation, timeout: float) -> str:
    challenge = headers.get("WWW-Authenticate", "")
    scheme, _, params_text = challenge.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise RegistryError(f"access denied to {location.display} (HTTP 401, auth "
                            f"{scheme or 'none'!r}): only anonymous bearer tokens are supported")
    params = dict(_AUTH_PARAM.findall(params_text))
    realm = params.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise RegistryError(f"malformed reply from {location.display}: bearer challenge without a realm URL")
    # Like docker: always ask for a pull of this repository, plus the challenge's own scope when
    # it names something else (public.ecr.aws has been seen to challenge with scope="aws").
    pull = f"repository:{location.name}:pull"
    query = [("service", params["service"])] if params.get("service") else []
    query += [("scope", scope) for scope in dict.fromkeys([pull, params.get("scope") or pull])]
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
    status, _, body = _request("GET", url, {"Accept": "application/json"}, location, timeout)
    if status != 200:
        raise RegistryError(f"token refused by {realm} for {location.display} (HTTP {status})")
    try:
        reply = json.loads(body)
        token = reply.get("token") or reply.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise RegistryError(f"malformed reply from token service {realm}: no token in {body[:60]!r}")
    return token


def _check_manifest(body: bytes, location: ImageLocation) -> None:
    try:
        manifest = json.loads(body)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise RegistryError(f"malformed reply from {location.display}: not an image manifest "
                            f"(starts {body[:40]!r})")
