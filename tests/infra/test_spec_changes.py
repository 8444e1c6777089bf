"""Changing the spec changes the template as it should (default vs the combined alternative:
account, 4 x g6.48xlarge on a capacity reservation, + a p5.48xlarge group on a capacity block)."""
from __future__ import annotations

import json

from infra_variants import DEFAULT_BUCKET, ACCOUNT, BLOCK, RESERVATION, default_raw, synthesize


def _gpu_groups(synth) -> dict[str, dict]:
    out = {}
    for resource in synth.resources("cluster", "AWS::EKS::Nodegroup").values():
        props = resource["Properties"]
        if props["AmiType"] == "AL2023_x86_64_NVIDIA":
            out[props["Labels"]["raytrain.io/node-group"]] = props
    return out


def _template_data(synth, group: dict) -> dict:
    return synth.json("cluster")["Resources"][group["LaunchTemplate"]["Id"]["Ref"]][
        "Properties"]["LaunchTemplateData"]


def test_more_bigger_gpu_nodes(default, alternative):
    # given 2 x g6.12xlarge -> 4 x g6.48xlarge, then node count, type and GPU count follow
    before, after = _gpu_groups(default)["gpu"], _gpu_groups(alternative)["gpu"]
    assert before["ScalingConfig"]["MaxSize"] == 2 and after["ScalingConfig"]["MaxSize"] == 4
    assert before["InstanceTypes"] == ["g6.12xlarge"] and after["InstanceTypes"] == ["g6.48xlarge"]
    assert before["Tags"]["raytrain:gpus-per-node"] == "4"
    assert after["Tags"]["raytrain:gpus-per-node"] == "8"
    assert alternative.env.world_size == 32 and default.env.world_size == 8


def test_capacity_reservation_in_the_launch_template(default, alternative):
    after = _gpu_groups(alternative)["gpu"]
    data = _template_data(alternative, after)
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}}
    assert "InstanceMarketOptions" not in data
    assert after["CapacityType"] == "ON_DEMAND"  # an ODCR is consumed as On-Demand capacity
    assert RESERVATION not in json.dumps(default.json("cluster"))


def test_capacity_block_group_with_32_efa_interfaces(alternative):
    h100 = _gpu_groups(alternative)["h100"]
    assert h100["CapacityType"] == "CAPACITY_BLOCK"
    assert "InstanceTypes" not in h100  # EKS wants a capacity block's type in the launch template only
    assert h100["ScalingConfig"] == {"MinSize": 0, "MaxSize": 2, "DesiredSize": 0}  # a first deploy: all three
    data = _template_data(alternative, h100)
    assert data["InstanceType"] == "p5.48xlarge"
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationId": BLOCK}
    interfaces = data["NetworkInterfaces"]
    assert len(interfaces) == 32 == alternative.env.gpu_node_groups[1].efa_per_node
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(32))
    assert [i["DeviceIndex"] for i in interfaces] == [0] * 32
    # the primary card's EFA carries the node's IP traffic; the other 31 are EFA-only
    assert [i["InterfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * 31
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500


def test_each_on_demand_gpu_group_has_its_own_placement_group(capacity, alternative):
    # the capacity variant: a spot p5 group (a placement group of its own, as on-demand: EC2
    # refuses only spot that stops or hibernates there) and a reservation in a named one
    groups = _gpu_groups(capacity)
    placements = [_template_data(capacity, g)["Placement"]["GroupName"] for g in groups.values()]
    assert "odcr-training-pg" in placements
    assert [p["Fn::GetAtt"][1] for p in placements if isinstance(p, dict)] == ["GroupName"]
    # a reservation without a placement group, and a capacity block, get none of their own
    assert all("Placement" not in _template_data(alternative, g) for g in _gpu_groups(alternative).values())


def test_a_spot_group_is_a_spot_node_group_with_its_types(capacity):
    groups = _gpu_groups(capacity)
    [spot] = [g for g in groups.values() if g["CapacityType"] == "SPOT"]
    assert spot["InstanceTypes"] == ["p5.48xlarge"]
    assert "CapacityReservationSpecification" not in _template_data(capacity, spot)


def test_account_binds_the_stacks_and_names_the_bucket(default, alternative):
    manifest = json.loads((alternative.outdir / "manifest.json").read_text())
    assert manifest["artifacts"]["raytrain-cluster"]["environment"] == f"aws://{ACCOUNT}/us-east-1"
    default_manifest = json.loads((default.outdir / "manifest.json").read_text())
    assert default_manifest["artifacts"]["raytrain-cluster"]["environment"] == "aws://unknown-account/us-east-1"
    assert alternative.env.bucket_name == f"raytrain-raytrain-{ACCOUNT}-us-east-1"
    assert default.env.bucket_name == DEFAULT_BUCKET  # no account: the user names the bucket
    # no lookup left for the CLI to do (it would need credentials)
    assert "missing" not in manifest and "missing" not in default_manifest


def test_a_new_image_digest_changes_no_infrastructure(default, tmp_path):
    # given only the image digest changes (what `raytrain-eks lock` writes), then no template
    # changes: no tag or name derived from the whole spec may roll the GPU nodes
    raw = default_raw()
    raw["image"]["digest"] = "sha256:" + "ab" * 32
    locked = synthesize(raw, tmp_path, "locked.toml")
    assert locked.env.spec_hash != default.env.spec_hash
    for which in ("network", "storage", "cluster"):
        assert locked.json(which) == default.json(which)
