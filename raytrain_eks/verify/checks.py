"""What only the user's account can answer, checked before ``cdk deploy`` and before a job: each
check returns :class:`Finding` lines, one per problem, each with its fix.

- every EKS add-on pin is offered for the spec's Kubernetes version (EKS DescribeAddonVersions);
- every Helm chart version is in its repository's index (:mod:`raytrain_eks.verify.chart_index`);
- every GPU instance type is offered in the GPU AZ (EC2 DescribeInstanceTypeOfferings);
- every AZ's zone id is one EKS supports, and offers the system node type (:func:`check_zones`);
- every admin principal exists (IAM);
- the On-Demand vCPU quotas cover every node group at its maximum size (Service Quotas);
- a named capacity reservation or Capacity Block exists and fits its group;
- the CDK bootstrap stack exists, at a version this CDK accepts (CloudFormation);
- nothing a first deploy would collide with is left: a retained bucket the spec does not adopt,
  a control-plane log group of the same name, an image cache rule;
- the credentials are the spec's account (STS);
- which GPU node groups already exist, recorded for the deploy
  (:func:`raytrain_eks.verify.account.check_node_groups`);
- the pinned image digest resolves and can run on linux/amd64 (the registry).

The AWS clients and the index fetcher are passed in (boto3 and urllib in the CLI; moto's
server, botocore's Stubber where moto lacks an API, and a local HTTP server in the tests).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from environment import Environment
from environment.addons import EKS_ADDONS, installed_addons
from environment.instances import INSTANCE_TYPES
from raytrain_eks.verify.capacity import USABLE_STATES, Reservation, offered_zones
from raytrain_eks.verify.chart_index import ChartIndexError, IndexCache, index_url, matches, oci_tags_url


# Service Quotas codes of the EC2 On-Demand vCPU quotas, by instance family (the letters before
# the generation digit); "Running On-Demand <families> instances".
VCPU_QUOTAS = {
    "L-1216C47A": ("Standard (A, C, D, H, I, M, R, T, Z)", ("a", "c", "d", "h", "i", "m", "r", "t", "z")),
    "L-DB2E81BA": ("G and VT", ("g", "vt")),
    "L-417A185B": ("P", ("p",)),
}

# Service Quotas codes of the EC2 Spot vCPU quotas, by instance family: "All <families> Spot
# Instance Requests". A separate quota from the On-Demand one (0 by default in many accounts).
SPOT_VCPU_QUOTAS = {
    "L-34B43A08": ("Standard (A, C, D, H, I, M, R, T, Z)", ("a", "c", "d", "h", "i", "m", "r", "t", "z")),
    "L-3819A6DF": ("G and VT", ("g", "vt")),
    "L-7212CCBC": ("P", ("p",)),
}

# What each check calls, for the fix of a check the credentials may not run.
ACTIONS = {"account": "sts:GetCallerIdentity", "eks-addon": "eks:DescribeAddonVersions",
           "gpu-az": "ec2:DescribeInstanceTypeOfferings", "quota": "servicequotas:GetServiceQuota",
           "reservation": "ec2:DescribeCapacityReservations", "bootstrap": "cloudformation:DescribeStacks",
           "leftover": "cloudformation:DescribeStacks, s3:ListBucket, s3:GetBucketPolicy, logs:DescribeLogGroups",
           "zones": "ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings",
           "admins": "iam:GetRole, iam:GetUser",
           "image-cache": "cloudformation:DescribeStacks, ecr:DescribePullThroughCacheRules",
           "node-groups": "eks:DescribeCluster, eks:ListNodegroups, eks:DescribeNodegroup",
           "cluster": "eks:DescribeCluster, ec2:DescribeSubnets", "cluster-addons": "eks:ListAddons, eks:DescribeAddon",
           "existing-groups": "eks:DescribeNodegroup",
           "egress": "eks:DescribeNodegroup, ec2:DescribeRouteTables, ec2:DescribeVpcEndpoints"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    check: str
    ok: bool
    message: str
    fix: str = ""

    def line(self) -> str:
        return f"ok    {self.check}: {self.message}" if self.ok else \
            f"FAIL  {self.check}: {self.message} -- fix: {self.fix}"


def passed(check: str, message: str) -> Finding:
    return Finding(check=check, ok=True, message=message)


def failed(check: str, message: str, fix: str) -> Finding:
    return Finding(check=check, ok=False, message=message, fix=fix)


def _listed(values: list[str], most: int = 6) -> str:
    return ", ".join(values[:most]) + (f", ... ({len(values)} in all)" if len(values) > most else "") if values else "none"


def check_eks_addons(env: Environment, eks) -> list[Finding]:
    """EKS validates an add-on version per Kubernetes version: the pin must be listed by
    DescribeAddonVersions(addonName, kubernetesVersion) with that version among its
    compatibilities, or CreateAddon fails and the cluster stack rolls back."""
    k8s = env.cluster.kubernetes_version
    out = []
    for addon in EKS_ADDONS:
        pin = addon.versions.get(k8s)
        offered: list[str] = []
        for page in eks.get_paginator("describe_addon_versions").paginate(addonName=addon.name, kubernetesVersion=k8s):
            for item in page.get("addons", []):
                offered += [v["addonVersion"] for v in item.get("addonVersions", [])
                            if any(c.get("clusterVersion") == k8s for c in v.get("compatibilities", []))]
        if pin is None:
            out.append(failed("eks-addon", f"{addon.name}: no version pinned for Kubernetes {k8s} (offered: {_listed(offered)})",
                             f"add \"{k8s}\" to {addon.name}'s versions in environment/addons.py EKS_ADDONS"))
        elif pin in offered:
            out.append(passed("eks-addon", f"{addon.name} {pin} is offered for Kubernetes {k8s}"))
        else:
            out.append(failed("eks-addon", f"{addon.name} {pin} is not offered for Kubernetes {k8s} (offered: {_listed(offered)})",
                             f"pin one of the offered versions for \"{k8s}\" in environment/addons.py EKS_ADDONS"))
    return out


def check_charts(env: Environment, index: IndexCache, mirror: str = "") -> list[Finding]:
    out = []
    for addon in installed_addons(env):  # an add-on already present is not installed
        version = env.versions.chart(addon.key)
        url = (oci_tags_url(addon.repository, mirror) if addon.repository.startswith("oci://")
               else index_url(addon.repository, mirror))
        try:
            listed = index.versions(url, addon.chart)
        except ChartIndexError as err:
            out.append(failed("helm-chart", f"{addon.chart} {version}: {err}",
                             "check the network path to the repository (or pass --helm-repo-mirror)"))
            continue
        if any(matches(version, v) for v in listed):
            out.append(passed("helm-chart", f"{addon.chart} {version} is in {addon.repository}"))
        else:
            out.append(failed("helm-chart", f"{addon.chart} {version} is not in {url} (newest: {_listed(listed, 4)})",
                             f"set versions.{addon.key} in {env.source} to a listed version"))
    return out


def check_gpu_zones(env: Environment, ec2) -> list[Finding]:
    gpu_az = env.cluster.gpu_availability_zone
    out = []
    for group in env.gpu_node_groups:
        zones = offered_zones(ec2, group.instance_type)
        if gpu_az in zones:
            out.append(passed("gpu-az", f"group {group.name}: {group.instance_type} is offered in {gpu_az}"))
        else:
            out.append(failed("gpu-az", f"group {group.name}: {group.instance_type} is not offered in {gpu_az} "
                             f"(offered in: {_listed(zones)})",
                             f"set cluster.gpu_availability_zone in {env.source} to one of those AZs (or another instance_type)"))
    return out


EKS_UNSUPPORTED_ZONE_IDS = {"us-east-1": ("use1-az3",), "us-west-1": ("usw1-az2",), "ca-central-1": ("cac1-az3",)}
"""Zone ids that do not support EKS control-plane subnets, per the Amazon EKS User Guide, "View
Amazon EKS networking requirements for VPC and subnets" (docs.aws.amazon.com/eks/latest/
userguide/network-reqs.html, subnet requirements: "use1-az3 in us-east-1, usw1-az2 in
us-west-1, cac1-az3 in ca-central-1")."""


def zone_ids(env: Environment, ec2) -> dict[str, str]:
    """AZ name -> zone id of every AZ of the region, in the credentials' account."""
    reply = ec2.describe_availability_zones()
    return {z["ZoneName"]: z["ZoneId"] for z in reply["AvailabilityZones"]}


def check_zones(env: Environment, ec2) -> list[Finding]:
    """An AZ name means a different zone in each account (us-east-1a is use1-az6 in one, use1-az3
    in another), so each of the spec's AZs is mapped to its zone id (EC2
    DescribeAvailabilityZones) and checked by id: against the zone ids EKS refuses a cluster
    subnet in (CreateCluster fails with UnsupportedAvailabilityZoneException, 12+ minutes into
    the cluster stack, and rolls it back), and for the system node type offered in every VPC AZ
    (location type ``availability-zone-id``); each GPU type in the GPU AZ is the ``gpu-az`` check
    (the same answer by name: names and ids map one to one within an account)."""
    c = env.cluster
    ids = zone_ids(env, ec2)
    refused = EKS_UNSUPPORTED_ZONE_IDS.get(c.region, ())
    out = []
    for name in c.availability_zones:
        if ids[name] in refused:
            usable = [n for n, i in sorted(ids.items()) if i not in refused and n not in c.availability_zones]
            out.append(failed("zones", f"{name} is zone {ids[name]} in this account, where EKS creates no cluster",
                              f"replace {name} in cluster.availability_zones of {env.source} with another AZ of "
                              f"{c.region} (not {', '.join(refused)}): {_listed(usable)}"))
    system = env.system_node_group.instance_type
    where = offered_zones(ec2, system, "availability-zone-id")
    for name in c.availability_zones:
        if ids[name] not in where:
            out.append(failed("zones", f"system nodes: {system} is not offered in {name} ({ids[name]}) in this account",
                              f"choose another AZ in cluster.availability_zones of {env.source} (offered in zones "
                              f"{_listed(where)}) or another system_node_group.instance_type"))
    if not out:
        out.append(passed("zones", ", ".join(f"{n}={ids[n]}" for n in c.availability_zones)
                          + f": EKS supports them, {system} is offered in each"))
    return out


def quota_code(instance_type: str, spot: bool = False) -> str | None:
    """The vCPU quota an instance type runs under: by its family letters (``g6`` -> ``g``,
    ``m7i`` -> ``m``, ``vt1`` -> ``vt``); ``spot``: the Spot quota of that family."""
    family = instance_type.split(".")[0]
    letters = family[:len(family) - len(family.lstrip("abcdefghijklmnopqrstuvwxyz"))]
    for code, (_, families) in (SPOT_VCPU_QUOTAS if spot else VCPU_QUOTAS).items():
        if letters in families:
            return code
    return None


def vcpu_needs(env: Environment) -> dict[str, list[tuple[str, int]]]:
    """Quota code -> (what, vCPUs) of every group at its maximum size. Capacity Blocks are left
    out: their instances run on the block, not on the On-Demand quota."""
    needs: dict[str, list[tuple[str, int]]] = defaultdict(list)
    system = env.system_node_group
    # Groups an existing cluster already runs are already counted by EC2: only new ones need room.
    groups = [] if system.existing else [("system", (system.instance_type,), system.nodes, False)]
    groups += [(g.name, g.all_instance_types, g.max_nodes, g.spot) for g in env.gpu_node_groups
               if g.capacity != "capacity-block" and not g.existing]
    for name, types, count, spot in groups:
        # a spot group may launch any of its types: the largest is what the quota must hold
        instance_type = max(types, key=lambda t: INSTANCE_TYPES[t].vcpus if t in INSTANCE_TYPES else 0)
        vcpus = INSTANCE_TYPES[instance_type].vcpus if instance_type in INSTANCE_TYPES else 0
        needs[quota_code(instance_type, spot) or f"unknown:{instance_type}"].append(
            (f"{name} {count} x {'/'.join(types)}{' (spot)' if spot else ''}", vcpus * count))
    return dict(needs)


def check_quotas(env: Environment, quotas) -> list[Finding]:
    out = []
    for code, parts in vcpu_needs(env).items():
        if code.startswith("unknown:"):
            out.append(failed("quota", f"no On-Demand vCPU quota known for {code.split(':', 1)[1]}",
                             "add its family to raytrain_eks/verify/checks.py VCPU_QUOTAS"))
            continue
        need = sum(v for _, v in parts)
        value = int(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        kind = f"On-Demand {VCPU_QUOTAS[code][0]}" if code in VCPU_QUOTAS else \
            f"Spot (All {SPOT_VCPU_QUOTAS[code][0]} Spot Instance Requests, {code})"
        what = f"{kind} vCPUs in {env.cluster.region}: quota {value}, " \
               f"needed {need} ({' + '.join(p for p, _ in parts)})"
        if value >= need:
            out.append(passed("quota", what))
        else:
            out.append(failed("quota", what, f"request {code} >= {need} in Service Quotas (EC2, {env.cluster.region}), "
                             "or lower max_nodes in " + env.source))
    return out


def check_reservations(env: Environment, ec2) -> list[Finding]:
    out = []
    for group in env.gpu_node_groups:
        if not group.capacity_reservation_id:
            continue
        rid, where = group.capacity_reservation_id, f"group {group.name}: {group.capacity_reservation_id}"
        from botocore.exceptions import ClientError
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[rid]).get("CapacityReservations", [])
        except ClientError as err:
            if "NotFound" not in err.response.get("Error", {}).get("Code", "") and \
                    "Malformed" not in err.response.get("Error", {}).get("Code", ""):
                raise
            found = []
        if not found:
            out.append(failed("reservation", f"{where} is not in this account and region",
                             "run `raytrain-eks capacity` and set capacity_reservation_id to one it lists"))
            continue
        r = Reservation.from_api(found[0])
        wrong = []
        if r.kind != group.capacity:
            wrong.append(f"it is a {r.kind}, the group says capacity = {group.capacity!r}")
        if r.instance_type != group.instance_type:
            wrong.append(f"it holds {r.instance_type}, the group {group.instance_type}")
        if r.availability_zone != env.cluster.gpu_availability_zone:
            wrong.append(f"it is in {r.availability_zone}, the GPU AZ is {env.cluster.gpu_availability_zone}")
        if r.state not in USABLE_STATES:
            wrong.append(f"its state is {r.state}")
        if r.total < group.max_nodes:
            wrong.append(f"it holds {r.total} instances, max_nodes is {group.max_nodes}")
        if r.kind == "capacity-reservation" and r.placement_group != group.placement_group:
            wrong.append(f"it was made in placement group {r.placement_group or '(none)'}, "
                         f"the group names {group.placement_group or '(none)'}")
        if wrong:
            out.append(failed("reservation", f"{where}: " + "; ".join(wrong),
                             f"correct [[gpu_node_groups]] {group.name} in {env.source} "
                             f"(`raytrain-eks capacity` prints the fields to set)"))
        else:
            out.append(passed("reservation", f"{where} is a usable {r.kind} of {r.total} x {r.instance_type} in {r.availability_zone}"))
    return out


def check_image(env: Environment, registry_url: str = "", timeout: float = 15.0) -> list[Finding]:
    from infra.lambdas.image_watcher.registry import (
        REQUIRED_PLATFORM, ImageLocation, RegistryError, fetch_manifest, platforms,
    )

    image = env.image
    if not image.digest:
        return [failed("image", f"{image.repository}:{image.tag} is not pinned (image.digest is empty)",
                      f"raytrain-eks lock --env {env.source}")]
    try:
        location = ImageLocation.from_repository(image.repository, image.tag, registry_url)
        found = platforms(fetch_manifest(location, image.digest, timeout=timeout))
    except RegistryError as err:
        return [failed("image", f"{image.repository}@{image.digest}: {err}",
                      f"raytrain-eks lock --env {env.source} (pins the digest the tag has now)")]
    if found is not None and REQUIRED_PLATFORM not in found:
        return [failed("image", f"{image.repository}@{image.digest} is an index without {'/'.join(REQUIRED_PLATFORM)} "
                      f"(it has: {', '.join('/'.join(p) for p in found) or 'none'})",
                      "pin a digest that has linux/amd64 (raytrain-eks lock --digest ...)")]
    kind = "an index with linux/amd64" if found is not None else "a single-platform manifest"
    return [passed("image", f"{image.repository}@{image.digest} resolves ({kind})")]


def run_checks(checks: list[tuple[str, Callable[[], list[Finding]]]]) -> list[Finding]:
    """Run every check; a check the credentials or the network cannot run is one finding."""
    from botocore.exceptions import BotoCoreError, ClientError

    out: list[Finding] = []
    for name, check in checks:
        try:
            out += check()
        except ClientError as err:
            error: dict[str, Any] = err.response.get("Error", {})
            out.append(failed(name, f"could not check: {error.get('Code', 'error')}: {error.get('Message', err)}",
                             f"allow {ACTIONS.get(name, 'the call')} to these credentials, and retry"))
        except BotoCoreError as err:
            out.append(failed(name, f"could not check: {err}", "configure AWS credentials (aws configure / AWS_PROFILE)"))
    return out
