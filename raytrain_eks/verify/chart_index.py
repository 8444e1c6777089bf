"""Does a Helm chart version exist in its repository? Read from the repository's ``index.yaml``
the way Helm reads it when the kubectl handler runs ``helm upgrade --install --repo URL
--version V``.

Helm's rule (helm/helm v3.x ``pkg/repo/index.go`` ``IndexFile.Get``, the same in v4): an exact
string match of ``version`` first; otherwise ``version`` is a Masterminds/semver constraint
and the first entry whose version satisfies it is taken. An exact version such as ``v0.5.32``
is the constraint ``=0.5.32`` (the leading ``v`` is dropped), so it matches an entry
``0.5.32`` as well. This module accepts exact versions only (the spec pins versions; it never
writes ranges).
"""
from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

_SEMVER = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")

Fetch = Callable[[str], bytes]
"""URL -> the body it serves (raises OSError / urllib.error.URLError when it cannot)."""


class ChartIndexError(ValueError):
    """An index that could not be read; ``str(err)`` is one line."""


def _semver(version: str) -> tuple | None:
    match = _SEMVER.fullmatch(version.strip())
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    return int(major), int(minor), int(patch), pre or ""


def matches(pinned: str, listed: str) -> bool:
    """Whether Helm resolves ``--version pinned`` to the index entry ``listed``."""
    if pinned == listed:
        return True
    wanted, found = _semver(pinned), _semver(listed)
    return wanted is not None and wanted == found


def _newest_first(versions: list[str]) -> list[str]:
    def key(v: str):
        parsed = _semver(v)
        # a pre-release sorts before its release; unparsable versions last
        return (0, parsed[:3], parsed[3] == "", parsed[3]) if parsed else (-1, (0, 0, 0), False, v)
    return sorted(versions, key=key, reverse=True)


def index_url(repository: str, mirror: str = "") -> str:
    """``<repository>/index.yaml``; with a mirror, ``<mirror>/<host><path>/index.yaml`` (one
    server standing in for every repository, as a caching proxy or the tests do)."""
    base = repository.rstrip("/")
    if mirror:
        parsed = urllib.parse.urlsplit(base)
        base = f"{mirror.rstrip('/')}/{parsed.netloc}{parsed.path}"
    return f"{base}/index.yaml"


def oci_tags_url(repository: str, mirror: str = "") -> str:
    """An ``oci://HOST/PATH`` chart's tag list (OCI distribution spec ``GET /v2/<name>/tags/list``,
    what ``helm pull oci://... --version V`` resolves the version against); with a mirror,
    ``<mirror>/<host>/v2/<path>/tags/list``."""
    parsed = urllib.parse.urlsplit(repository.rstrip("/"))
    base = f"{mirror.rstrip('/')}/{parsed.netloc}" if mirror else f"https://{parsed.netloc}"
    return f"{base}/v2{parsed.path}/tags/list"


def http_fetch(timeout: float) -> Fetch:
    def fetch(url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (http(s) URLs from the add-on table)
            return reply.read()
    return fetch


def chart_versions(body: bytes, chart: str, url: str) -> list[str]:
    """Every version of ``chart`` an index lists, newest first."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the big indexes are tens of MB
    try:
        index = yaml.load(body, Loader=loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as err:
        raise ChartIndexError(f"{url} is not a Helm index ({type(err).__name__})") from None
    if not isinstance(index, dict) or not isinstance(index.get("entries"), dict):
        raise ChartIndexError(f"{url} is not a Helm index (no entries)")
    entries = index["entries"].get(chart) or []
    return _newest_first([str(e.get("version", "")) for e in entries if isinstance(e, dict)])


class IndexCache:
    """One download per repository URL (several add-ons share aws/eks-charts)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._bodies: dict[str, bytes | ChartIndexError] = {}

    def versions(self, url: str, chart: str) -> list[str]:
        if url not in self._bodies:
            try:
                self._bodies[url] = self._fetch(url)
            except (OSError, urllib.error.URLError) as err:
                reason = getattr(err, "reason", None) or err
                self._bodies[url] = ChartIndexError(f"could not read {url}: {reason}")
        body = self._bodies[url]
        if isinstance(body, ChartIndexError):
            raise body
        if url.endswith("/tags/list"):  # an OCI chart: {"name": ..., "tags": [...]}
            import json
            try:
                return [str(t) for t in json.loads(body).get("tags") or []]
            except (ValueError, AttributeError):
                raise ChartIndexError(f"{url} is not an OCI tag list") from None
        return chart_versions(body, chart, url)
