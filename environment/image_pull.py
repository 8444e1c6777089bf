"""What pulling the DLC onto a GPU node costs, in time and money, with and without the
pull-through cache (``image.pull_through_cache``): a small model, every figure a named constant
with its source. ``summary`` and the preflight print :func:`pull_lines`.

Prices are us-east-1 list prices (other regions differ by a few percent); the sizes and the
node's intake rate are this project's estimates, not measurements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from environment.model import Environment

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


def starting_nodes(env: "Environment") -> int:
    """GPU nodes a job of the primary group starts from its idle size (at least one)."""
    group = env.primary_gpu_group
    return max(1, group.job_nodes - group.min_nodes)


def pull_paths(env: "Environment") -> tuple[PullPath, PullPath]:
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


def break_even_starts_per_day(env: "Environment") -> float:
    """GPU node starts a day above which the cache costs less than the NAT's data charge."""
    nat, cache = pull_paths(env)
    return cache.fixed_usd_per_hour * 24 / nat.nat_usd


def pull_lines(env: "Environment") -> list[str]:
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
