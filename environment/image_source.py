"""Where the nodes pull the DLC from: the public registry through the NAT gateway, or the
account's own ECR registry through a pull-through cache rule and VPC endpoints; and what a pull
costs on either path.

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

from dataclasses import dataclass

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


def cache_repository(env) -> str:
    """The name of the cache's repository for the image: ``<prefix>/<name>`` (the upstream path
    kept under the prefix), made by ECR on the first pull through the rule."""
    return f"{cache_prefix(env.cluster.name)}/{env.image.name}"


PROMOTED_TAG_PREFIX = "raytrain-promoted-"
"""The tags the pipeline's Promote puts on a digest in the cache's repository before it promotes
it (:func:`promoted_tag`), and the prefix the cache's lifecycle policy keeps
(infra/stacks/cluster.py ``PullThroughCache``). The nodes pull by digest and the cache fills only
by tag (raytrain_eks/pipeline/smoke.py ``warm_cache``), so once ``image.tag`` has moved on, the
promoted digest is untagged there: without its own tag a count rule expires it, and a pull by
digest cannot bring it back."""


def promoted_tag(digest: str) -> str:
    """``raytrain-promoted-<the digest's 64 hex>``: one tag per promoted digest (ECR tags take up
    to 300 characters), so a promotion never moves another digest's tag."""
    return PROMOTED_TAG_PREFIX + digest.split(":", 1)[1]


def pull_repository(env) -> str:
    """The repository the nodes pull from: ``<account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<name>``
    through the cache (:func:`cache_repository`), else ``image.repository``."""
    if not env.image.pull_through_cache:
        return env.image.repository
    c = env.cluster
    return f"{registry_host(c.account, c.region)}/{cache_repository(env)}"


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


IMAGE_COMPRESSED_GB = 20.0
"""What a node downloads: the DLC's compressed layers, ~20 GB (the figure behind
``ImageSpec.disk_gib`` and ``environment.addons.SCALE_UP_MINUTES``; no published size for the image exists)."""
NODE_PULL_MB_PER_S = 170.0
"""What one node's containerd takes in while pulling onto its NVMe RAID0: the ~2 minutes for
~20 GB that ``SCALE_UP_MINUTES`` assumes (an estimate; ``make gpu-check`` does not measure it)."""
NAT_USD_PER_GB = 0.045
"""NAT gateway data processing, per GB (Amazon VPC pricing, NAT gateway, us-east-1)."""
NAT_BASELINE_GBPS = 5.0
"""A NAT gateway's bandwidth before it scales up (Amazon VPC User Guide, "NAT gateway basics":
5 Gbps, scaling to 100 Gbps): shared by every node that pulls through it at once."""
INTERFACE_ENDPOINT_USD_PER_AZ_HOUR = 0.01
"""An interface VPC endpoint, per AZ it is in, per hour (AWS PrivateLink pricing, us-east-1).
Its per-GB charge carries only manifests and tokens here: the layers come from S3."""
GATEWAY_ENDPOINT_USD = 0.0
"""The S3 gateway endpoint the layers come through costs nothing (Amazon VPC pricing:
"There is no additional charge for using gateway endpoints")."""
ECR_STORAGE_USD_PER_GB_MONTH = 0.10
"""Private ECR storage, per GB-month (Amazon ECR pricing): the cached image's layers."""
HOURS_PER_MONTH = 730
ECR_INTERFACE_ENDPOINTS = 2
"""ecr.api and ecr.dkr (infra/stacks/network.py), one network interface per VPC AZ each."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PullPath:
    """One way onto a GPU node: ``minutes`` per node while ``nodes`` start together,
    ``nat_usd`` per node start, ``fixed_usd_per_hour`` whether or not a node starts."""

    name: str
    minutes: float
    nat_usd: float
    fixed_usd_per_hour: float


def starting_nodes(env) -> int:
    """GPU nodes a job of the primary group starts from its idle size (at least one)."""
    group = env.primary_gpu_group
    return max(1, group.job_nodes - group.min_nodes)


def pull_paths(env) -> tuple[PullPath, PullPath]:
    """(through the NAT, through the cache) for the primary GPU group's job."""
    nodes = starting_nodes(env)
    megabytes = IMAGE_COMPRESSED_GB * 1000
    nat_share = NAT_BASELINE_GBPS * 1000 / 8 / nodes  # MB/s per node while all pull at once
    nat = PullPath(name="public registry via NAT", minutes=megabytes / min(NODE_PULL_MB_PER_S, nat_share) / 60,
                   nat_usd=IMAGE_COMPRESSED_GB * NAT_USD_PER_GB, fixed_usd_per_hour=0.0)
    fixed = (ECR_INTERFACE_ENDPOINTS * len(env.cluster.availability_zones) * INTERFACE_ENDPOINT_USD_PER_AZ_HOUR
             + GATEWAY_ENDPOINT_USD + IMAGE_COMPRESSED_GB * ECR_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH)
    cache = PullPath(name="ECR pull-through cache", minutes=megabytes / NODE_PULL_MB_PER_S / 60,
                     nat_usd=0.0, fixed_usd_per_hour=fixed)
    return nat, cache


def break_even_starts_per_day(env) -> float:
    """GPU node starts a day above which the cache costs less than the NAT's data charge."""
    nat, cache = pull_paths(env)
    return cache.fixed_usd_per_hour * 24 / nat.nat_usd


def pull_lines(env) -> list[str]:
    """The image-pull lines of ``summary`` and the preflight: both paths, the chosen one marked."""
    nat, cache = pull_paths(env)
    nodes = starting_nodes(env)
    chosen = cache if env.image.pull_through_cache else nat
    lines = [f"image pull   {IMAGE_COMPRESSED_GB:.0f} GB per GPU node, {nodes} node(s) start per job "
             f"(us-east-1 list prices; estimate):"]
    for path in (nat, cache):
        mark = "*" if path is chosen else " "
        lines.append(f"           {mark} {path.name:24} ~{path.minutes:.1f} min/node, NAT data {path.nat_usd:.2f} USD/node "
                     f"({path.nat_usd * nodes:.2f} a job), fixed {path.fixed_usd_per_hour:.3f} USD/hour")
    lines.append(f"             the cache pays off above {break_even_starts_per_day(env):.1f} GPU node starts a day"
                 f" (image.pull_through_cache = {'true' if env.image.pull_through_cache else 'false'})")
    return lines
