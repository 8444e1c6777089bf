"""Where the nodes pull the DLC from: the public registry through the NAT gateway, or the
account's own ECR registry through a pull-through cache rule and VPC endpoints.

The pull reference is derived HERE, once, and every consumer (the charts' pod templates, the
pipeline's check of what the pods run, ``summary`` and the preflight) reads it from
:func:`pull_reference`. ``ImageSpec.reference`` stays the upstream reference: the image
``lock`` resolves and the image watcher follows.

The digest is the same on both paths. A registry serves a manifest by its digest, the sha256 of
its bytes (opencontainers/distribution-spec v1.1.0 spec.md, "Pulling manifests": the client
verifies the content against the digest), so a pull of ``<cache>/<name>@sha256:X`` returns the
very manifest upstream names X or fails; ECR's pull-through cache stores the upstream manifest
and "the image digest ... rather than the tag" may be pulled through it (Amazon ECR User Guide,
"Using pull through cache rules", Considerations: a multi-architecture image pulled by the
digest of one architecture).
"""
from __future__ import annotations

# The functions take an ``environment.model.Environment`` (not imported: the model imports
# this module for its validation).

CACHE_UPSTREAM_URL = "public.ecr.aws"
"""The only upstream this project's rule caches (ECR Public needs no credential; Amazon ECR User
Guide, "Using pull through cache rules": ECR Public, the Kubernetes registry and Quay do not
require authentication)."""
CACHE_UPSTREAM_REGISTRY = "ecr-public"
"""``AWS::ECR::PullThroughCacheRule`` ``UpstreamRegistry`` for it (the resource schema's enum)."""
CACHE_PREFIX_SUFFIX = "-ecr-public"
MAX_CACHE_PREFIX = 30
"""``EcrRepositoryPrefix`` length limit (the resource schema: 2-30 characters)."""
UNSUPPORTED_REGION_PREFIXES = ("cn-", "us-gov-")
"""Regions where pull-through cache rules cannot be created (same User Guide page)."""


def cache_prefix(cluster_name: str) -> str:
    """The rule's ECR repository prefix: one per cluster, so two clusters in one account and
    region never create the same rule (its prefix is its identity: CloudFormation refuses a
    second rule with the prefix)."""
    return f"{cluster_name}{CACHE_PREFIX_SUFFIX}"


def registry_host(account: str, region: str) -> str:
    """The account's private ECR registry."""
    return f"{account}.dkr.ecr.{region}.amazonaws.com"


def pull_repository(env) -> str:
    """The repository the nodes pull from: ``<account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<name>``
    through the cache (the upstream path kept under the prefix), else ``image.repository``."""
    if not env.image.pull_through_cache:
        return env.image.repository
    c = env.cluster
    return f"{registry_host(c.account, c.region)}/{cache_prefix(c.name)}/{env.image.name}"


def pull_reference(env) -> str:
    """What every pod template names: :func:`pull_repository` ``@sha256:...`` once locked (the
    upstream digest), ``:tag`` before (with ``ImageSpec.reference``'s warning)."""
    upstream = env.image.reference
    if not env.image.pull_through_cache:
        return upstream
    suffix = upstream[len(env.image.repository):]  # "@sha256:..." or ":tag": the same on both paths
    return pull_repository(env) + suffix


def cache_problem(env) -> tuple[str, object, str] | None:
    """``(field, value, what is allowed)`` when ``image.pull_through_cache`` cannot be built for
    this spec; None when it is off or can."""
    if not env.image.pull_through_cache:
        return None
    c = env.cluster
    host = env.image.repository.split("/", 1)[0]
    if host != CACHE_UPSTREAM_URL:
        return ("image.pull_through_cache", True,
                f"caches only {CACHE_UPSTREAM_URL} but image.repository is on {host}: set it to false")
    if not c.account:
        return ("image.pull_through_cache", True,
                "needs cluster.account (the pods pull from <account>.dkr.ecr.<region>.amazonaws.com): "
                "set cluster.account, or set this to false")
    if c.region.startswith(UNSUPPORTED_REGION_PREFIXES):
        return ("image.pull_through_cache", True,
                f"is not offered in {c.region} (ECR has no pull-through cache there): set it to false")
    if len(cache_prefix(c.name)) > MAX_CACHE_PREFIX:
        return ("image.pull_through_cache", True,
                f"needs a cluster.name of at most {MAX_CACHE_PREFIX - len(CACHE_PREFIX_SUFFIX)} characters "
                f"(the cache prefix {cache_prefix(c.name)!r} exceeds ECR's {MAX_CACHE_PREFIX}): "
                "shorten cluster.name, or set this to false")
    return None
