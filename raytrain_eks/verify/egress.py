"""`raytrain-eks verify` on ``cluster.existing``: can the nodes reach what they pull and call?

Each private subnet a node of this app lands in (the existing node groups' subnets, from EKS
DescribeNodegroup, and the spec's ``cluster.private_subnet_ids``: new GPU groups go in the GPU
AZ's, the kubectl handler in all) needs either an active ``0.0.0.0/0`` route to an egress target
(a NAT gateway, or its equivalent: a NAT instance, a transit gateway or Cloud WAN core network to
a central egress VPC, an internet gateway for a subnet that gives its nodes public addresses) or, without one, everything a node without internet
needs (Amazon EKS User Guide, "Deploy private clusters with limited internet access"): interface
endpoints for EC2 (the VPC CNI attaches addresses), ECR (``ecr.api``, ``ecr.dkr``), STS and EKS
Auth (Pod Identity, how the Ray pods get their role), S3 (a gateway endpoint on the subnet's
route table: ECR's layers and the checkpoints), the cluster's private endpoint, every image in
the account's ECR (``image.pull_through_cache``: public.ecr.aws, where the DLC lives, has no VPC
endpoint) and no add-on to install (their charts and images come from public registries).

Which route table a subnet uses (EC2 DescribeRouteTables, botocore's ec2 2016-11-15 model
documentation; Amazon VPC User Guide, "Route tables"): "Each subnet in your VPC must be
associated with a route table. If a subnet is not explicitly associated with any route table, it
is implicitly associated with the main route table", and DescribeRouteTables "does not return the
subnet ID for implicit associations": the table with an association naming the subnet, else the
VPC's table whose association has ``Main`` true.
"""
from __future__ import annotations

from typing import Any

from environment import Environment
from environment.addons import installed_addons
from raytrain_eks.verify.checks import Finding, failed, passed

DEFAULT_ROUTE = "0.0.0.0/0"
EGRESS_TARGETS = ("NatGatewayId", "TransitGatewayId", "CoreNetworkArn", "InstanceId", "NetworkInterfaceId")
"""Route targets (botocore ec2 ``Route`` members) that carry a private subnet's traffic out;
an internet gateway (``GatewayId`` igw-...) only for nodes with a public address."""
INTERFACE_ENDPOINTS = ("ec2", "ecr.api", "ecr.dkr", "sts", "eks-auth")
"""Services a node without a default route reaches through interface endpoints
(``com.amazonaws.<region>.<service>``)."""
S3 = "s3"


def _pages(call, key: str, **params) -> list[dict[str, Any]]:
    items, token = [], None
    while True:
        page = call(**params, **({"NextToken": token} if token else {}))
        items += page.get(key) or []
        token = page.get("NextToken")
        if not token:
            return items


def route_table_of(subnet: str, tables: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bool]:
    """``(table, implicit)``: the subnet's explicitly associated table, else the VPC's main one."""
    for table in tables:
        if any(a.get("SubnetId") == subnet for a in table.get("Associations") or []):
            return table, False
    main = next((t for t in tables if any(a.get("Main") for a in t.get("Associations") or [])), None)
    return main, True


def egress_route(table: dict[str, Any]) -> str:
    """The active default route's target ("" without one)."""
    for route in table.get("Routes") or []:
        if route.get("DestinationCidrBlock") != DEFAULT_ROUTE or route.get("State", "active") != "active":
            continue
        target = next((route[k] for k in EGRESS_TARGETS if route.get(k)), "")
        if target or str(route.get("GatewayId", "")).startswith("igw-"):
            return target or route["GatewayId"]
    return ""


def subnets_in_use(env: Environment, eks) -> dict[str, list[str]]:
    """Subnet -> who puts nodes (or the kubectl handler) there, in the order found."""
    c, out = env.cluster, {}
    groups = [("system", env.system_node_group.existing)] + [(g.name, g.existing) for g in env.gpu_node_groups if g.existing]
    for name, nodegroup in groups:
        try:
            found = eks.describe_nodegroup(clusterName=c.existing, nodegroupName=nodegroup)["nodegroup"]
        except eks.exceptions.ResourceNotFoundException:
            continue  # existing-groups reports it
        for subnet in found.get("subnets") or []:
            out.setdefault(subnet, []).append(f"node group {nodegroup}")
    new_gpu = [g.name for g in env.gpu_node_groups if not g.existing]
    for subnet, az in zip(c.private_subnet_ids, c.availability_zones):
        users = out.setdefault(subnet, [])
        if new_gpu and az == c.gpu_availability_zone:
            users.append(f"new GPU group(s) {', '.join(new_gpu)}")
        users.append("the kubectl handler")
    return out


def _without_egress(env: Environment, table: dict[str, Any], endpoints: list[dict[str, Any]]) -> list[str]:
    """What a subnet on ``table`` lacks to work without a default route."""
    prefix = f"com.amazonaws.{env.cluster.region}."
    available = [e for e in endpoints if str(e.get("State", "")).lower() == "available"]
    interface = {e["ServiceName"].removeprefix(prefix) for e in available
                 if e.get("VpcEndpointType") == "Interface" and e.get("PrivateDnsEnabled")}
    missing = [f"interface endpoint {s}" for s in INTERFACE_ENDPOINTS if s not in interface]
    s3_gateway = any(e["ServiceName"] == prefix + S3 and e.get("VpcEndpointType") == "Gateway"
                     and table["RouteTableId"] in (e.get("RouteTableIds") or []) for e in available)
    if not s3_gateway and S3 not in interface:
        missing.append(f"S3 gateway endpoint on {table['RouteTableId']}")
    if env.cluster.endpoint_access == "public":
        missing.append("the cluster's private endpoint (nodes register through it)")
    if not env.image.pull_through_cache:
        missing.append("image.pull_through_cache = true (the DLC is on public.ecr.aws, which no VPC endpoint serves)")
    addons = [a.key for a in installed_addons(env)]
    if addons:
        missing.append(f"internet for the add-ons this app installs ({', '.join(addons)}: public charts and images)")
    return missing


def _public_addresses(env: Environment, ec2, subnet: str, known: dict[str, dict[str, Any]]) -> bool:
    """Whether the subnet gives new instances a public IPv4 address (EC2 DescribeSubnets
    ``MapPublicIpOnLaunch``): only then is an internet gateway a way out for its nodes."""
    if not known:
        known.update({s["SubnetId"]: s for s in ec2.describe_subnets(
            SubnetIds=list(env.cluster.private_subnet_ids))["Subnets"]})
    if subnet not in known:
        known.update({s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=[subnet])["Subnets"]})
    return bool((known.get(subnet) or {}).get("MapPublicIpOnLaunch"))


def check_egress(env: Environment, eks, ec2) -> list[Finding]:
    """One FAIL line per subnet in use whose nodes could not pull the DLC or reach AWS."""
    vpc = [{"Name": "vpc-id", "Values": [env.cluster.vpc_id]}]
    tables = _pages(ec2.describe_route_tables, "RouteTables", Filters=vpc)
    endpoints: list[dict[str, Any]] | None = None
    known: dict[str, dict[str, Any]] = {}
    out = []
    for subnet, users in subnets_in_use(env, eks).items():
        table, implicit = route_table_of(subnet, tables)
        whose = f"subnet {subnet} ({', '.join(users)})"
        if table is None:
            out.append(failed("egress", f"{whose}: no route table of {env.cluster.vpc_id} applies to it",
                              f"associate it with a route table with a {DEFAULT_ROUTE} route to a NAT gateway"))
            continue
        where = f"route table {table['RouteTableId']}" + (" (the VPC's main: no explicit association)" if implicit else "")
        target = egress_route(table)
        if target.startswith("igw-") and not _public_addresses(env, ec2, subnet, known):
            # An internet gateway carries only traffic from public addresses: a node without one
            # (a private subnet's nodes get none) sends into it and nothing comes back.
            out.append(failed("egress", f"{whose}: {DEFAULT_ROUTE} goes to the internet gateway {target} ({where}), but the "
                                        "subnet gives its nodes no public address (MapPublicIpOnLaunch false): they "
                                        "cannot reach out, nor pull the DLC",
                              f"route {DEFAULT_ROUTE} of {table['RouteTableId']} to a NAT gateway in a public subnet"))
            continue
        if target:
            out.append(passed("egress", f"{whose}: {DEFAULT_ROUTE} via {target} ({where})"))
            continue
        if endpoints is None:
            endpoints = _pages(ec2.describe_vpc_endpoints, "VpcEndpoints", Filters=vpc)
        missing = _without_egress(env, table, endpoints)
        if missing:
            out.append(failed("egress", f"{whose}: {where} has no active {DEFAULT_ROUTE} route, and without one it lacks "
                                        f"{'; '.join(missing)}: nodes there cannot pull the DLC",
                              f"add a {DEFAULT_ROUTE} route to a NAT gateway to {table['RouteTableId']}"))
        else:
            out.append(passed("egress", f"{whose}: no {DEFAULT_ROUTE} route ({where}); every endpoint a node needs is there"))
    return out
