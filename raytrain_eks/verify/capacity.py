"""Where the spec's GPU instance types can run: the AZs of the region that offer each type
(EC2 DescribeInstanceTypeOfferings) and the account's capacity reservations and Capacity Blocks
that match a GPU group (DescribeCapacityReservations), with the spec fields that would use them.

The EC2 client is passed in (boto3 in the CLI, moto or a stub in the tests).

The command (``add_arguments`` and ``run``, at the end of this module): `raytrain-eks capacity`: which AZs offer the GPU instance types, and which of the account's
capacity reservations and Capacity Blocks match a GPU group (read-only EC2 calls).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from environment import Environment, GpuNodeGroupSpec

USABLE_STATES = ("active", "scheduled", "payment-pending")


@dataclass(frozen=True, kw_only=True)
class Reservation:
    id: str
    instance_type: str
    availability_zone: str
    kind: str
    """``capacity-block`` or ``capacity-reservation`` (the spec's ``capacity`` values)."""
    state: str
    total: int
    available: int
    placement_group: str = ""
    """Name of the cluster placement group the reservation was made in ("" if none)."""
    start: str = ""
    end: str = ""

    @classmethod
    def from_api(cls, item: dict) -> "Reservation":
        arn = item.get("PlacementGroupArn", "")
        return cls(id=item["CapacityReservationId"], instance_type=item["InstanceType"],
                   availability_zone=item["AvailabilityZone"],
                   kind="capacity-block" if item.get("ReservationType") == "capacity-block" else "capacity-reservation",
                   state=item.get("State", ""), total=item.get("TotalInstanceCount", 0),
                   available=item.get("AvailableInstanceCount", 0),
                   placement_group=arn.rsplit("/", 1)[-1] if arn else "",
                   start=str(item.get("StartDate", "")), end=str(item.get("EndDate", "")))

    def spec_fields(self) -> str:
        """What to write under the group's ``[[gpu_node_groups]]`` to use it."""
        fields = f'capacity = "{self.kind}", capacity_reservation_id = "{self.id}"'
        if self.placement_group and self.kind == "capacity-reservation":
            fields += f', placement_group = "{self.placement_group}"'
        return fields


def offered_zones(ec2, instance_type: str, location_type: str = "availability-zone") -> list[str]:
    """The AZs (names; ids with ``location_type="availability-zone-id"``) of the client's region
    that offer ``instance_type``."""
    zones: set[str] = set()
    kwargs = {"LocationType": location_type,
              "Filters": [{"Name": "instance-type", "Values": [instance_type]}]}
    while True:
        page = ec2.describe_instance_type_offerings(**kwargs)
        zones |= {o["Location"] for o in page.get("InstanceTypeOfferings", [])}
        if not page.get("NextToken"):
            return sorted(zones)
        kwargs["NextToken"] = page["NextToken"]


def reservations(ec2, instance_types: list[str]) -> list[Reservation]:
    """The account's usable reservations and blocks of these instance types."""
    found: list[Reservation] = []
    kwargs = {"Filters": [{"Name": "instance-type", "Values": instance_types},
                          {"Name": "state", "Values": list(USABLE_STATES)}]}
    while True:
        page = ec2.describe_capacity_reservations(**kwargs)
        found += [Reservation.from_api(r) for r in page.get("CapacityReservations", [])]
        if not page.get("NextToken"):
            return sorted(found, key=lambda r: (r.instance_type, r.availability_zone, r.id))
        kwargs["NextToken"] = page["NextToken"]


def report(env: Environment, ec2) -> tuple[list[str], bool]:
    """Lines to print, and whether every GPU group's type is offered in the spec's GPU AZ."""
    gpu_az = env.cluster.gpu_availability_zone
    lines = [f"capacity in {env.cluster.region} for {env.source} (GPU nodes in {gpu_az})"]
    ok = True
    types = sorted({g.instance_type for g in env.gpu_node_groups})
    found = reservations(ec2, types)
    for group in env.gpu_node_groups:
        zones = offered_zones(ec2, group.instance_type)
        offered = gpu_az in zones
        ok &= offered
        lines.append(f"  group {group.name}: {group.instance_type} offered in {', '.join(zones) or 'no AZ'}"
                     + ("" if offered else f"  -- NOT in {gpu_az}: set cluster.gpu_availability_zone to one of these"))
        lines += _matches(group, [r for r in found if r.instance_type == group.instance_type], gpu_az)
    return lines, ok


def _matches(group: GpuNodeGroupSpec, candidates: list[Reservation], gpu_az: str) -> list[str]:
    if not candidates:
        return ["    no capacity reservation or Capacity Block of this type in the account"]
    lines = []
    for r in candidates:
        where = "" if r.availability_zone == gpu_az else f"  (in {r.availability_zone}, not {gpu_az}: unusable here)"
        used = "  <- in use by this group" if r.id == group.capacity_reservation_id else ""
        lines.append(f"    {r.kind} {r.id} {r.state}: {r.available}/{r.total} free, {r.availability_zone}"
                     f"{', placement group ' + r.placement_group if r.placement_group else ''}"
                     f"{', ' + r.start + ' .. ' + r.end if r.kind == 'capacity-block' else ''}{where}{used}")
        if not where and not used:
            lines.append(f"      to use it: {r.spec_fields()}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from environment import load_environment

    env = load_environment(args.env)
    try:
        lines, ok = report(env, boto3.client("ec2", region_name=env.cluster.region))
    except (BotoCoreError, ClientError) as err:
        print(f"error: EC2: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if not ok:
        print(f"error: {env.source}: cluster.gpu_availability_zone: {env.cluster.gpu_availability_zone!r} "
              "does not offer every GPU group's instance type (see above)", file=sys.stderr)
        return 2
    return 0
