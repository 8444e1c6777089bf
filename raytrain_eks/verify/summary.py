"""`raytrain-eks summary`: the environment in a form a person reads before paying for it."""
from __future__ import annotations

import argparse
import warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")


def render(env) -> str:
    from environment import UnlockedImageWarning
    from environment.addons import ADDONS
    from environment.image_source import pull_lines, pull_reference

    c = env.cluster
    lines = [
        f"environment  {env.source}  (spec hash {env.spec_hash})",
        f"cluster      {c.name}  EKS {c.kubernetes_version}  {c.region}  account {c.account or '(from credentials at deploy)'}",
        f"             VPC AZs {', '.join(c.availability_zones)}; GPU nodes only in {c.gpu_availability_zone}; endpoint {c.endpoint_access}",
        f"system       {env.system_node_group.nodes} x {env.system_node_group.instance_type}"
        f", {env.system_node_group.disk_gib} GiB disk  (each Ray head {env.ray.head_cpu} CPU / {env.ray.head_memory_gib} GiB)",
    ]
    for g in env.gpu_node_groups:
        it = g.instance
        lines.append(
            f"gpu group    {g.name}: {g.min_nodes}-{g.max_nodes} x {g.instance_type} (jobs run on {g.job_nodes}; cluster-autoscaler),"
            f" {g.gpus_per_node} x {it.gpu_model} {it.gpu_memory_gib} GB, {g.efa_per_node} EFA per node,"
            f" {g.capacity}{' ' + g.capacity_reservation_id if g.capacity_reservation_id else ''}")
        lines.append(
            f"             worker pod {g.pod_cpu} CPU / {g.pod_memory_gib} GiB / {g.gpus_per_node} GPU;"
            f" world size {g.world_size}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnlockedImageWarning)
        reference = pull_reference(env)
    lines.append(f"image        {reference}  (Ray {env.image.ray_version}, Python {env.image.python_version})")
    if env.image.pull_through_cache:
        lines.append(f"             cached from {env.image.repository} (same digest) through the account's ECR")
    if caught:
        lines.append(f"  WARNING    {caught[0].message}")
    lines += pull_lines(env)
    charts = ", ".join(f"{a.chart} {env.versions.chart(a.key)}" for a in ADDONS if a.enabled(env))
    lines.append(f"add-ons      {charts}")
    lines.append(f"storage      {env.bucket_uri}  (noncurrent versions kept {env.storage.noncurrent_version_days} d)")
    if env.storage_uri != env.bucket_uri:
        lines.append(f"             runs on {env.storage_uri}: claim {env.storage.shared_claim} mounted on every Ray pod "
                     "(a file system you provide; code, models, data and uploads stay in the bucket)")
    lines.append(f"pods         namespace {env.ray.namespace}, service account {env.ray.service_account}")
    lines.append(f"pipeline     {'on: ' + env.pipeline.repository + '@' + env.pipeline.branch if env.pipeline.enabled else 'off (no pipeline.connection_arn)'}")
    lines.append(f"cost         ~{env.hourly_cost_usd:.2f} USD/hour while a job runs, ~{env.idle_hourly_cost_usd:.2f} "
                 "USD/hour idle (nodes on demand, estimate; EKS, NAT, storage extra)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from environment import load_environment

    print(render(load_environment(args.env)))
    return 0
