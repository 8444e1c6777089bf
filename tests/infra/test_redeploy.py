"""Deploying again and by anyone: generated node-group names, unique bucket names, adopting a
retained bucket, admin access; scale to zero; capacity modes; the NVMe RAID0 (templates)."""
from __future__ import annotations

import base64
import copy
import json
import warnings

import pytest

from infra_variants import ADMIN, BLOCK, RESERVATION, default_raw


def nodegroups(synth) -> dict:
    return synth.resources("cluster", "AWS::EKS::Nodegroup")


def test_no_node_group_has_a_fixed_name(variant):
    # InstanceTypes, DiskSize, CapacityType, Subnets, AmiType are create-only: with no name,
    # CloudFormation names the replacement itself instead of failing on the old group's name
    groups = nodegroups(variant)
    assert len(groups) == 1 + len(variant.env.gpu_node_groups)
    assert all("NodegroupName" not in g["Properties"] for g in groups.values())


def test_system_nodes_sized_for_the_image_and_the_heads(default):
    [system] = [g["Properties"] for g in nodegroups(default).values() if g["Properties"]["Labels"]["raytrain.io/role"] == "system"]
    # the disk is in the system launch template (beside the IMDS settings)
    data = default.json("cluster")["Resources"][system["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
    [root] = data["BlockDeviceMappings"]
    assert (system["InstanceTypes"], root["Ebs"]["VolumeSize"]) == (["m7i.2xlarge"], 100)
    assert root["Ebs"]["VolumeSize"] * 0.85 - 4 >= default.env.image.disk_gib


def _refusal(raw, tmp_path) -> str:
    from environment import SpecError, environment_from_dict
    from infra.build import build_app

    env = environment_from_dict(raw)
    with pytest.raises(SpecError) as err:
        build_app(env)  # refused before the App (and its output directory) exists
    return str(err.value)


def test_the_shipped_spec_says_what_the_user_must_set(tmp_path):
    raw = default_raw()
    raw["cluster"]["admin_principal_arns"] = []
    assert _refusal(raw, tmp_path).startswith(
        "environment.toml: cluster.admin_principal_arns: [] names nobody who may run kubectl: add your IAM role")
    raw = default_raw()
    raw["storage"]["bucket_name"] = ""
    assert _refusal(raw, tmp_path) == (
        "environment.toml: storage.bucket_name: '' cannot be derived without cluster.account (S3 names are "
        "global): set cluster.account to your 12-digit account id, or storage.bucket_name")


def test_admin_principals_get_cluster_admin(variant):
    entries = variant.resources("cluster", "AWS::EKS::AccessEntry")
    assert ADMIN in json.dumps(entries) and "AmazonEKSClusterAdminPolicy" in json.dumps(entries)


def test_an_existing_bucket_is_adopted_with_its_protections_put_back(tmp_path):
    # given a bucket a previous deploy retained (with its policy), when the spec adopts it, then
    # the storage stack creates no checkpoint bucket and no second policy on it (S3 refuses one:
    # tests/update_oracle.py), but a new (retained) access-log bucket with the delivery grant,
    # the adopted bucket's logging pointed at it
    from aws_cdk.assertions import Template

    from environment import environment_from_dict
    from infra.build import build_app, new_app

    raw = default_raw()
    raw["storage"]["existing_bucket"] = True
    env = environment_from_dict(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(tmp_path)))
        built.app.synth()  # cdk-nag included
        template = Template.from_stack(built.storage).to_json()
    resources = template["Resources"]
    assert template["Outputs"]["BucketName"]["Value"] == env.bucket_name
    [log_bucket_id] = [k for k, r in resources.items() if r["Type"] == "AWS::S3::Bucket"]
    assert "BucketName" not in resources[log_bucket_id]["Properties"]  # the new access-log bucket
    policies = {json.dumps(r["Properties"]["Bucket"]): r for r in resources.values() if r["Type"] == "AWS::S3::BucketPolicy"}
    assert list(policies) == [json.dumps({"Ref": log_bucket_id})]
    logs = policies[json.dumps({"Ref": log_bucket_id})]
    for policy in (logs, resources[log_bucket_id]):
        assert policy["DeletionPolicy"] == "Retain" and policy["UpdateReplacePolicy"] == "Retain"
    [delivery] = [s for s in logs["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert delivery["Principal"] == {"Service": "logging.s3.amazonaws.com"} and delivery["Action"] == "s3:PutObject"
    assert env.bucket_name in json.dumps(delivery["Condition"]["ArnLike"]["aws:SourceArn"])
    [logging] = [r for r in resources.values() if r["Type"] == "Custom::AWS"]
    call = json.dumps(logging["Properties"]["Create"])
    assert "putBucketLogging" in call and env.bucket_name in call and log_bucket_id in call
    assert "Delete" not in logging["Properties"]  # a destroy leaves the logging as it is
    [function] = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    assert resources[function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]["RetentionInDays"] == 30


def test_gpu_groups_scale_from_zero_with_cluster_autoscaler(default):
    [gpu] = [g["Properties"] for g in nodegroups(default).values() if g["Properties"]["Labels"]["raytrain.io/role"] == "gpu"]
    assert gpu["ScalingConfig"] == {"MinSize": 0, "MaxSize": 2, "DesiredSize": 0}  # created at 0; a redeploy omits it
    template = "k8s.io/cluster-autoscaler/node-template"
    assert gpu["Tags"][f"{template}/resources/vpc.amazonaws.com/efa"] == "1"
    assert gpu["Tags"][f"{template}/resources/nvidia.com/gpu"] == "4"
    assert gpu["Tags"][f"{template}/taint/nvidia.com/gpu"] == "true:NoSchedule"
    assert gpu["Tags"][f"{template}/label/raytrain.io/node-group"] == "gpu"
    charts = default.resources("cluster", "Custom::AWSCDK-EKS-HelmChart")
    [ca] = [c["Properties"] for c in charts.values() if c["Properties"].get("Chart") == "cluster-autoscaler"]
    values = json.loads(ca["Values"]) if isinstance(ca["Values"], str) else ca["Values"]
    assert values["autoDiscovery"]["clusterName"] == default.env.cluster.name
    assert values["nodeSelector"] == {"raytrain.io/role": "system"}
    [assoc] = [a["Properties"] for a in default.resources("cluster", "AWS::EKS::PodIdentityAssociation").values()
               if a["Properties"]["ServiceAccount"] == "cluster-autoscaler"]
    assert assoc["Namespace"] == "kube-system"
    policies = json.dumps(default.resources("cluster", "AWS::IAM::Policy"))
    assert "autoscaling:SetDesiredCapacity" in policies and "eks:DescribeNodegroup" in policies
    assert "aws:ResourceTag/k8s.io/cluster-autoscaler/raytrain" in policies


def test_control_plane_logs_have_a_retention(default):
    [group] = [g for g in default.resources("cluster", "AWS::Logs::LogGroup").values()
               if g["Properties"].get("LogGroupName") == "/aws/eks/raytrain/cluster"]
    assert group["Properties"]["RetentionInDays"] == 30


def _templates(synth) -> dict:
    """The GPU groups' launch templates (the system group's holds only its disk and IMDS settings)."""
    return {k: t for k, t in synth.resources("cluster", "AWS::EC2::LaunchTemplate").items()
            if "NetworkInterfaces" in t["Properties"]["LaunchTemplateData"]}


def _data(synth, reservation: str) -> dict:
    [data] = [t["Properties"]["LaunchTemplateData"] for t in _templates(synth).values()
              if reservation in json.dumps(t)]
    return data


def test_capacity_reservation_uses_its_own_placement_group(capacity):
    data = _data(capacity, RESERVATION)
    assert data["Placement"] == {"GroupName": "odcr-training-pg"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationId": RESERVATION}
    # only the spot p5 group gets a placement group of its own (as an on-demand one would)
    assert len(capacity.resources("cluster", "AWS::EC2::PlacementGroup")) == 1


def test_capacity_block_has_its_instance_type_in_the_launch_template(alternative):
    data = _data(alternative, BLOCK)
    assert data["InstanceType"] == "p5.48xlarge"
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert "Placement" not in data
    [block] = [g["Properties"] for g in nodegroups(alternative).values() if g["Properties"].get("CapacityType") == "CAPACITY_BLOCK"]
    assert "InstanceTypes" not in block


def test_gpu_nodes_put_the_nvme_instance_store_in_raid0(variant):
    for template in _templates(variant).values():
        user_data = template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
        assert "Content-Type: multipart/mixed" in user_data
        assert "Content-Type: application/node.eks.aws" in user_data
        assert "kind: NodeConfig" in user_data and "strategy: RAID0" in user_data


def test_every_function_logs_to_a_group_of_its_stack_with_a_retention(variant):
    # Lambda creates /aws/lambda/<name> itself, without a retention and kept after a destroy,
    # for a function that names no log group (the kubectl provider's two functions did)
    for which in ("network", "storage", "cluster"):
        resources = variant.json(which)["Resources"]
        for lid, fn in resources.items():
            if fn["Type"] != "AWS::Lambda::Function":
                continue
            group = resources[fn["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]]
            assert group["Type"] == "AWS::Logs::LogGroup" and group["Properties"]["RetentionInDays"] == 30, lid
