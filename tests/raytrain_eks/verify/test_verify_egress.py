"""`raytrain-eks verify` on ``cluster.existing``: every private subnet the nodes (and the kubectl
handler) use has a way out, as a user runs verify (the world of test_verify_existing.py: EKS and
EC2 answers checked against botocore's service model, kubectl by a double).

The route table a subnet uses is the one explicitly associated with it, else the VPC's main
table (botocore ec2 2016-11-15 DescribeRouteTables documentation; Amazon VPC User Guide,
"Route tables": "If a subnet is not explicitly associated with any route table, it is
implicitly associated with the main route table"). The team's VPC (existing_cluster_doubles.py):
the first subnet on the main table, the second on a table of its own, both with a NAT route.
"""
from __future__ import annotations

import pytest

from existing_cluster_doubles import frozen, route
from infra_variants import EXISTING_SUBNETS, EXISTING_VPC
from test_verify_command import charts, failures, moto, registry  # noqa: F401
from test_verify_existing import _one_failure, world  # noqa: F401

MAIN, OWN = "rtb-0main000000000000", "rtb-0bbbbbbbbbbbbbbb2"
VPC_FILTER = frozen([{"Name": "vpc-id", "Values": [EXISTING_VPC]}])


def _table(world, table_id: str) -> dict:  # noqa: F811
    tables = world.tables["ec2"][("describe_route_tables", VPC_FILTER)]["RouteTables"]
    return next(t for t in tables if t["RouteTableId"] == table_id)


def _endpoints(world, services: list[str], gateway_tables: list[str]) -> None:  # noqa: F811
    region = world.env.cluster.region
    found = [{"VpcEndpointId": f"vpce-{i:017d}", "VpcEndpointType": "Interface", "VpcId": EXISTING_VPC,
              "ServiceName": f"com.amazonaws.{region}.{s}", "State": "available", "PrivateDnsEnabled": True}
             for i, s in enumerate(services)]
    found.append({"VpcEndpointId": "vpce-0s3gateway0000000", "VpcEndpointType": "Gateway", "VpcId": EXISTING_VPC,
                  "ServiceName": f"com.amazonaws.{region}.s3", "State": "available", "RouteTableIds": gateway_tables})
    world.tables["ec2"][("describe_vpc_endpoints", VPC_FILTER)]["VpcEndpoints"] = found


def test_each_subnet_in_use_has_its_way_out_named(world, charts, capsys):  # noqa: F811
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == [], lines
    egress = [line for line in lines if line.startswith("ok    egress: ")]
    assert egress == [
        f"ok    egress: subnet {EXISTING_SUBNETS[0]} (node group platform-system, node group team-l4, new GPU group(s) p5, "
        f"the kubectl handler): 0.0.0.0/0 via nat-0aaaaaaaaaaaaaaa1 (route table {MAIN} (the VPC's main: no explicit "
        "association))",
        f"ok    egress: subnet {EXISTING_SUBNETS[1]} (the kubectl handler): 0.0.0.0/0 via nat-0aaaaaaaaaaaaaaa1 "
        f"(route table {OWN})"], egress


def test_an_explicit_table_without_a_default_route_fails_though_the_main_table_has_one(world, charts, capsys):  # noqa: F811
    _table(world, OWN)["Routes"].pop()
    line = _one_failure(world, capsys, charts, f"egress: subnet {EXISTING_SUBNETS[1]} (the kubectl handler): route table "
                        f"{OWN} has no active 0.0.0.0/0 route", "nodes there cannot pull the DLC",
                        f"add a 0.0.0.0/0 route to a NAT gateway to {OWN}")
    for lacking in ("interface endpoint ec2", "interface endpoint ecr.api", "interface endpoint ecr.dkr",
                    "interface endpoint sts", "interface endpoint eks-auth", f"S3 gateway endpoint on {OWN}",
                    "image.pull_through_cache = true"):
        assert lacking in line, line


def test_a_subnet_on_the_main_table_whose_nat_route_is_a_blackhole_fails(world, charts, capsys):  # noqa: F811
    _table(world, MAIN)["Routes"][1]["State"] = "blackhole"  # its NAT gateway was deleted
    _one_failure(world, capsys, charts, f"egress: subnet {EXISTING_SUBNETS[0]} (node group platform-system, node group "
                 f"team-l4, new GPU group(s) p5, the kubectl handler): route table {MAIN} (the VPC's main: no explicit "
                 "association) has no active 0.0.0.0/0 route")


def _public(world, subnet: str) -> None:  # noqa: F811
    [subnets] = [v["Subnets"] for k, v in world.tables["ec2"].items() if k[0] == "describe_subnets"]
    next(s for s in subnets if s["SubnetId"] == subnet)["MapPublicIpOnLaunch"] = True


@pytest.mark.parametrize("target", [{"TransitGatewayId": "tgw-0123456789abcdef0"}, {"GatewayId": "igw-0123456789abcdef0"}])
def test_a_central_egress_or_an_internet_gateway_is_a_way_out(world, charts, capsys, target):  # noqa: F811
    _public(world, EXISTING_SUBNETS[1])  # an internet gateway serves a subnet whose nodes get public addresses
    _table(world, OWN)["Routes"][1] = route("0.0.0.0/0", **target)
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == [], lines
    assert any(f"0.0.0.0/0 via {next(iter(target.values()))} (route table {OWN})" in line for line in lines)


def test_without_a_default_route_the_endpoints_alone_do_not_bring_the_public_images(world, charts, capsys):  # noqa: F811
    _table(world, OWN)["Routes"].pop()
    _endpoints(world, ["ec2", "ecr.api", "ecr.dkr", "sts", "eks-auth"], [OWN])
    line = _one_failure(world, capsys, charts, f"route table {OWN} has no active 0.0.0.0/0 route, and without one it lacks "
                        "image.pull_through_cache = true (the DLC is on public.ecr.aws, which no VPC endpoint serves); "
                        "internet for the add-ons this app installs (")
    assert "interface endpoint" not in line and "S3 gateway" not in line, line


def test_an_internet_gateway_is_no_way_out_for_nodes_without_public_addresses(world, charts, capsys):  # noqa: F811
    """Amazon VPC User Guide, "Internet gateways": an instance needs a public IPv4 address (or an
    Elastic IP) to talk to the internet through one. Before the fix any igw- route passed."""
    _table(world, OWN)["Routes"][1] = route("0.0.0.0/0", GatewayId="igw-0123456789abcdef0")
    _one_failure(world, capsys, charts, f"egress: subnet {EXISTING_SUBNETS[1]} (the kubectl handler): 0.0.0.0/0 goes to "
                 "the internet gateway igw-0123456789abcdef0", "MapPublicIpOnLaunch false",
                 f"route 0.0.0.0/0 of {OWN} to a NAT gateway")
