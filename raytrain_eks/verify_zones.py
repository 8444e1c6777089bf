"""The zone checks of `raytrain-eks verify` (see :mod:`raytrain_eks.verify`): an AZ name means
a different zone in each account (us-east-1a is use1-az6 in one, use1-az3 in another), so each
of the spec's AZs is mapped to its zone id (EC2 DescribeAvailabilityZones) and checked by id:

- against the zone ids EKS refuses a cluster subnet in (CreateCluster fails with
  UnsupportedAvailabilityZoneException, 12+ minutes into the cluster stack, and rolls it back);
- the system node type offered in every VPC AZ (EC2 DescribeInstanceTypeOfferings, location
  type ``availability-zone-id``); each GPU type in the GPU AZ is the ``gpu-az`` check (the
  same answer by name: names and ids map one to one within an account).
"""
from __future__ import annotations

from environment import Environment
from raytrain_eks.capacity import offered_zones
from raytrain_eks.verify import Finding, _listed, failed, passed

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
