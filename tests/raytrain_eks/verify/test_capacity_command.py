"""`raytrain-eks capacity`: AZ offerings from EC2 (moto's EC2, which ships AWS's offering
tables) and reservation matching. moto 5.2.5 does not implement DescribeCapacityReservations,
so those answers come from botocore's Stubber with the API's own response shape."""
from __future__ import annotations

import copy
import datetime

import boto3
import pytest
from botocore.stub import Stubber

from environment import environment_from_dict
from infra_variants import ACCOUNT, default_raw
from raytrain_eks.verify.capacity import offered_zones, report

BLOCK_ID = "cr-0aaaaaaaaaaaaaaaa"
ODCR_ID = "cr-0bbbbbbbbbbbbbbbb"


@pytest.fixture()
def moto_ec2(monkeypatch):
    from moto import mock_aws

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


def test_offered_zones_come_from_ec2(moto_ec2):
    zones = offered_zones(moto_ec2, "g6.12xlarge")
    assert "us-east-1a" in zones and "us-east-1e" not in zones  # no g6 in use1-az3 (us-east-1e)
    assert offered_zones(moto_ec2, "p5.48xlarge")[:2] == ["us-east-1a", "us-east-1b"]


class _Split:
    """Offerings from moto; reservations from a stubbed client (moto lacks that call)."""

    def __init__(self, offerings_client, reservations_client):
        self.describe_instance_type_offerings = offerings_client.describe_instance_type_offerings
        self.describe_capacity_reservations = reservations_client.describe_capacity_reservations


def _reservation(cid: str, kind: str, az: str, pg: str = "") -> dict:
    item = {"CapacityReservationId": cid, "InstanceType": "g6.12xlarge", "AvailabilityZone": az,
            "ReservationType": kind, "State": "active", "TotalInstanceCount": 2, "AvailableInstanceCount": 2,
            "StartDate": datetime.datetime(2026, 12, 2), "EndDate": datetime.datetime(2026, 12, 9)}
    if pg:
        item["PlacementGroupArn"] = f"arn:aws:ec2:us-east-1:{ACCOUNT}:placement-group/{pg}"
    return item


def test_reservations_in_the_gpu_az_are_matched_with_the_fields_to_set(moto_ec2):
    env = environment_from_dict(default_raw())
    stubbed = boto3.client("ec2", region_name="us-east-1")
    with Stubber(stubbed) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            _reservation(ODCR_ID, "default", "us-east-1a", pg="training-pg"),
            _reservation(BLOCK_ID, "capacity-block", "us-east-1b")]},
            {"Filters": [{"Name": "instance-type", "Values": ["g6.12xlarge"]},
                         {"Name": "state", "Values": ["active", "scheduled", "payment-pending"]}]})
        lines, ok = report(env, _Split(moto_ec2, stubbed))
    text = "\n".join(lines)
    assert ok
    assert f'to use it: capacity = "capacity-reservation", capacity_reservation_id = "{ODCR_ID}", ' \
           'placement_group = "training-pg"' in text
    assert f"capacity-block {BLOCK_ID} active: 2/2 free, us-east-1b" in text
    assert "(in us-east-1b, not us-east-1a: unusable here)" in text


def test_a_gpu_az_without_the_type_is_refused(moto_ec2, capsys, monkeypatch):
    raw = copy.deepcopy(default_raw())
    raw["cluster"].update(availability_zones=["us-east-1a", "us-east-1e"], gpu_availability_zone="us-east-1e")
    env = environment_from_dict(raw)
    stubbed = boto3.client("ec2", region_name="us-east-1")
    with Stubber(stubbed) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": []})
        lines, ok = report(env, _Split(moto_ec2, stubbed))
    assert not ok
    assert any("NOT in us-east-1e: set cluster.gpu_availability_zone" in line for line in lines)
