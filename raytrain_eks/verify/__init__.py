"""The environment against the AWS account and the cluster, before a deploy and before a job.

This module holds the two commands the room is named for, the environment before a deploy as the
operator asks for it: ``raytrain-eks summary`` (what the spec deploys, priced, read offline from
the spec alone: :class:`Summary`) and ``raytrain-eks verify`` (what no offline synth can check,
asked of the user's account, the chart repositories and the image registry before `cdk deploy`
and before a job; read-only calls: this module's ``add_arguments`` and ``run``). The room's other
modules are verify's checks (``checks.py`` and ``account.py``: account, add-ons, charts, AZs,
quotas, reservations, bootstrap, leftovers, image; ``existing.py``, ``cluster_inventory.py`` and
``egress.py``: an existing cluster; ``chart_index.py``: Helm's indexes) and two commands of their
own: ``capacity`` (where the GPU types and reservations are) and ``lock`` (the image tag pinned
to its digest).

``verify`` prints one line per check (``ok`` or ``FAIL ... -- fix: ...``); exits 0 when every check
passes, 2 when any fails (as the other commands do for a problem the user must fix). A pass
is recorded (infra/verify_gate.py): `cdk deploy` of the cluster stack needs a recent one.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository: its ``.work/verify/`` holds the passes app.py reads."""


def render_summary(env) -> str:
    """The environment in a form a person reads before paying for it: nodes, GPUs, world size,
    image, add-on versions, storage and the cost per hour."""
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


class Summary:
    """`raytrain-eks summary`: :func:`render_summary` of the spec."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from environment import load_environment

        print(render_summary(load_environment(args.env)))
        return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")
    parser.add_argument("--helm-repo-mirror", default="",
                        help="read every chart index from URL/<repository host and path>/index.yaml "
                             "(a caching proxy) instead of the repositories themselves")
    parser.add_argument("--registry-url", default="",
                        help="image registry base URL (default: https:// + the host of image.repository)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default: %(default)s)")


def make_client(service: str, region: str):
    """One boto3 client (the tests replace this to point at moto's server or a Stubber)."""
    import boto3

    return boto3.client(service, region_name=region)


def kube_list(kind: str, selector: str) -> list[dict]:
    """``kubectl get <kind> -A [-l selector] -o json``'s items (kubectl's current context)."""
    from raytrain_eks.backends.eks import kubectl

    args = ["get", kind, "-A", "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(kubectl(*args).stdout or "{}").get("items", [])


def existing_cluster_checks(env, client) -> list:
    """The checks of an existing cluster (raytrain_eks/verify/existing.py), its Kubernetes side
    read through kubectl, whose current context must be that cluster."""
    from raytrain_eks.verify import checks as verify
    from raytrain_eks.verify import egress as verify_egress
    from raytrain_eks.verify import existing as verify_existing
    from raytrain_eks.verify.cluster_inventory import read_inventory
    from raytrain_eks.backends.eks import KubectlError, KubectlRefused, check_context

    try:
        check_context(env.cluster.eks_name)
        inventory = read_inventory(kube_list)
    except (KubectlError, KubectlRefused) as err:
        kubernetes = [verify.failed("kubernetes", f"cannot read cluster {env.cluster.existing}: {err}",
                                    f"aws eks update-kubeconfig --name {env.cluster.existing} --region {env.cluster.region}, "
                                    "as a principal that may list nodes, workloads, CRDs, namespaces and secrets")]
        inventory = None
    else:
        kubernetes = [verify.passed("kubernetes", f"read {len(inventory.nodes)} node(s), {len(inventory.releases)} Helm "
                                                  f"release(s) of {env.cluster.existing} through kubectl")]
    checks = [("cluster", lambda: verify_existing.check_cluster(env, client("eks"), client("ec2"))),
              ("cluster-addons", lambda: verify_existing.check_cluster_addons(env, client("eks"))),
              ("egress", lambda: verify_egress.check_egress(env, client("eks"), client("ec2")))]
    if inventory is not None:
        checks += [("existing-groups", lambda: verify_existing.check_node_groups(env, client("eks"), inventory)),
                   ("addons", lambda: verify_existing.check_addons(env, inventory)),
                   ("namespace", lambda: verify_existing.check_namespace(env, inventory))]
        if env.queueing.enabled:
            checks.append(("queue-objects", lambda: verify_existing.check_queue_names(env, inventory)))
    return kubernetes + verify.run_checks(checks) + verify_existing.install_plan(env)


def run(args: argparse.Namespace) -> int:
    from environment import load_environment
    from raytrain_eks.verify import checks as verify
    from raytrain_eks.verify import account as verify_account
    from raytrain_eks.verify.chart_index import IndexCache, http_fetch

    env = load_environment(args.env)
    region = env.cluster.region

    def client(service: str):
        return make_client(service, region)

    index = IndexCache(http_fetch(args.timeout))
    existing: set[str] = set()  # the GPU groups a deploy updates in place, recorded with a pass
    # The cluster stack's state, read BEFORE its node groups: a deploy in between makes the
    # record stale (refused), never a record that looks current but misses a group.
    from environment.contract import stack_name
    from infra import verify_gate

    cluster_stack = verify_gate.stack_state(client("cloudformation"), stack_name(env.cluster.name, "cluster"))
    # What a new cluster needs checked and an existing one does not: the EKS add-on pins, the
    # admins' access entries and the AZs' zone ids are the existing cluster's owner's.
    own_cluster = [] if env.cluster.existing else [
        ("eks-addon", lambda: verify.check_eks_addons(env, client("eks"))),
        ("admins", lambda: verify_account.check_admins(env, client("iam"), client("sts"))),
        ("zones", lambda: verify.check_zones(env, client("ec2"))),
    ]
    findings = verify.run_checks([
        ("account", lambda: verify_account.check_account(env, client("sts"))),
        ("bootstrap", lambda: verify_account.check_bootstrap(env, client("cloudformation"))),
        ("leftover", lambda: verify_account.check_leftovers(env, client("cloudformation"), client("s3"), client("logs"))),
        *own_cluster,
        ("helm-chart", lambda: verify.check_charts(env, index, args.helm_repo_mirror)),
        ("gpu-az", lambda: verify.check_gpu_zones(env, client("ec2"))),
        ("quota", lambda: verify.check_quotas(env, client("service-quotas"))),
        ("reservation", lambda: verify.check_reservations(env, client("ec2"))),
        ("image", lambda: verify.check_image(env, args.registry_url, args.timeout)),
        ("image-cache", lambda: verify_account.check_image_cache(env, client("cloudformation"), client("ecr"))),
        ("node-groups", lambda: verify_account.check_node_groups(env, client("eks"), existing)),
        ("mlflow", lambda: verify_account.check_tracking_server(env, client("sagemaker"))),
    ])
    if env.cluster.existing:
        findings += existing_cluster_checks(env, client)
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if not f.ok]
    if failed:
        print(f"error: {args.env}: {len(failed)} of {len(findings)} checks failed (see FAIL above)", file=sys.stderr)
        return 2
    from infra import verify_gate

    account = client("sts").get_caller_identity()["Account"]
    stamp = verify_gate.stamp_path(ROOT, env)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(verify_gate.stamp(env, account, verify_gate.now(), frozenset(existing), cluster_stack))
    hours = verify_gate.MAX_AGE.total_seconds() / 3600
    print(f"{args.env}: all {len(findings)} checks passed (cdk deploy of account {account} allowed for {hours:.0f} h)")
    return 0
