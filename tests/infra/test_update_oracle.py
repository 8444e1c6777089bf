"""A later ``cdk deploy`` after each common edit of environment.toml, and ``cdk destroy``, read
through the update oracle (tests/update_oracle.py: CloudFormation's resource schemas plus the
update behaviours they do not encode, each cited there). ``bench/bench_update_oracle.py``
prints the whole table."""
from __future__ import annotations

import copy
import json

import pytest

from infra_variants import default_raw
from update_oracle import (
    STACKS, Change, deploy_with, deployed_groups, destroy, diff, diff_stack, edit_over, edit_results, edited, gone, kept,
    redeploy, refused, table, templates, touches_running, verified,
)

SCALING_EDITS = ("gpu max_nodes 2 -> 3", "gpu min_nodes 0 -> 1", "system nodes 1 -> 2")


@pytest.fixture(scope="module")
def baseline() -> dict[str, dict]:
    """The first deploy's templates (no group exists yet)."""
    return templates(default_raw())


@pytest.fixture(scope="module")
def results(baseline) -> dict[str, list[Change]]:
    # each edit deployed over the first deploy, after a verify that found its groups
    return edit_results(default_raw(), baseline)


def _scaling(templates_: dict[str, dict]) -> list[dict]:
    return [r["Properties"]["ScalingConfig"] for r in templates_["cluster"]["Resources"].values()
            if r["Type"] == "AWS::EKS::Nodegroup"]


def test_a_first_deploy_creates_every_node_group_with_its_whole_scaling_config(baseline):
    # given no cluster yet, when it is deployed, then EKS gets MinSize, MaxSize and DesiredSize
    gpu = [s for s in _scaling(baseline) if s["MinSize"] < s["MaxSize"]]
    assert gpu == [{"MinSize": 0, "MaxSize": 2, "DesiredSize": 0}]  # autoscaled, starting at min_nodes
    created = diff({part: {} for part in STACKS}, baseline)
    assert [c for c in created if c.effect] == []
    # the group written as existing (no desired size) would be refused at creation
    partial = diff({part: {} for part in STACKS}, templates(default_raw(), existing_gpu_groups=frozenset({"gpu"})))
    assert [c.effect.split(":")[0] for c in partial if c.effect] == ["CREATE REFUSED"]


def test_a_redeploy_leaves_the_running_size_alone(baseline):
    # the verify before the next deploy finds the group (by its tags): no desired size is sent
    assert deployed_groups(default_raw(), baseline) == frozenset({"gpu"})
    again = redeploy(default_raw(), baseline)
    assert [s for s in _scaling(again) if s["MinSize"] < s["MaxSize"]] == [{"MinSize": 0, "MaxSize": 2}]
    assert touches_running(diff(baseline, again)) == []


def _recorded_by_the_pipeline(raw: dict, deployed: dict[str, dict], root) -> frozenset[str]:
    """What the pipeline's Deploy build records (raytrain_eks/verify/account.py record_node_groups) over
    the ``deployed`` templates, with EKS modelled by moto's mock_aws: DescribeNodegroup returns
    the tags CloudFormation set from the template (generated node group names)."""
    import boto3
    from moto import mock_aws

    from environment import environment_from_dict
    from infra import verify_gate
    from raytrain_eks.verify.account import record_node_groups as record

    env = environment_from_dict(raw, "environment.toml")
    with mock_aws():
        eks = boto3.client("eks", region_name=env.cluster.region)
        eks.create_cluster(name=env.cluster.name, roleArn="arn:aws:iam::123456789012:role/c",
                           resourcesVpcConfig={"subnetIds": ["subnet-1"]})
        for i, r in enumerate(r for r in deployed["cluster"]["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"):
            eks.create_nodegroup(clusterName=env.cluster.name, nodegroupName=f"Nodegroup-{i}", subnets=["subnet-1"],
                                 nodeRole="arn:aws:iam::123456789012:role/n", tags=r["Properties"].get("Tags") or {})
        record(env, root, eks, "123456789012", boto3.client("cloudformation", region_name=env.cluster.region))
    return verify_gate.recorded_groups(verify_gate.stamp_path(root, env).read_text())


def test_a_pipeline_redeploy_after_a_verified_one_leaves_the_running_size_alone(baseline, tmp_path):
    # first deploy (no group), a verified redeploy ({gpu}: no DesiredSize), then the pipeline's
    # Deploy build: it records the groups before `cdk deploy`, so it sends no DesiredSize either
    verified = redeploy(default_raw(), baseline)
    recorded = _recorded_by_the_pipeline(default_raw(), verified, tmp_path)
    assert recorded == frozenset({"gpu"})
    pipeline = templates(default_raw(), existing_gpu_groups=recorded)
    assert touches_running(diff(verified, pipeline)) == []
    # deploying blind (no record: the pipeline before) puts DesiredSize back and resets the nodes
    blind = diff(verified, templates(default_raw()))
    assert [c.effect.split(":")[0] for c in touches_running(blind)] == ["DESIRED SIZE RESET to 0"]


def _group(min_size: int, max_size: int, **scaling) -> dict:
    return {"Type": "AWS::EKS::Nodegroup", "Properties": {
        "ClusterName": "c", "InstanceTypes": ["g6.12xlarge"],
        "ScalingConfig": {"MinSize": min_size, "MaxSize": max_size, **scaling}}}


def test_the_oracle_resets_an_autoscaled_groups_desired_size_only_when_the_template_has_one():
    before = {"Resources": {"G": _group(0, 2, DesiredSize=0)}}
    after = {"Resources": {"G": _group(0, 3, DesiredSize=0)}}
    [change] = diff_stack("cluster", before, after)
    assert change.action == "update" and change.effect.startswith("DESIRED SIZE RESET to 0")
    without = {"Resources": {"G": _group(0, 3)}}
    assert diff_stack("cluster", {"Resources": {"G": _group(0, 2)}}, without) == [
        Change("cluster", "G", "AWS::EKS::Nodegroup", "update")]
    # a fixed-size group's desired size is its only size: nothing an autoscaler set is lost
    fixed = diff_stack("cluster", {"Resources": {"G": _group(1, 1, DesiredSize=1)}},
                       {"Resources": {"G": _group(2, 2, DesiredSize=2)}})
    assert touches_running(fixed) == []


def test_the_oracle_follows_a_replacement_into_what_references_it():
    # a new placement group (GroupName... replaced by Strategy, create-only) gives the launch
    # template new data, hence a new version, hence a rolling update of the node group
    placement = lambda strategy: {"Type": "AWS::EC2::PlacementGroup", "Properties": {"Strategy": strategy}}  # noqa: E731
    template = {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {
        "Placement": {"GroupName": {"Fn::GetAtt": ["P", "GroupName"]}}}}}
    group = _group(0, 2)
    group["Properties"]["LaunchTemplate"] = {"Id": {"Ref": "T"}, "Version": {"Fn::GetAtt": ["T", "LatestVersionNumber"]}}
    before = {"Resources": {"P": placement("cluster"), "T": template, "G": group}}
    after = {"Resources": {"P": placement("partition"), "T": template, "G": group}}
    changes = {c.logical_id: c for c in diff_stack("cluster", before, after)}
    assert changes["P"].action == "replace" and changes["T"].action == "update"
    assert changes["G"].effect.startswith("NODES ROLLED")


def test_a_bucket_policy_deleted_beside_its_kept_bucket_is_reported():
    bucket = {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain"}
    policy = {"Type": "AWS::S3::BucketPolicy", "Properties": {"Bucket": {"Ref": "B"}}}
    [kept, stripped] = destroy({"storage": {"Resources": {"B": bucket, "P": policy}}})
    assert kept.action == "retain" and stripped.effect.startswith("PROTECTION REMOVED")
    [_, retained] = destroy({"storage": {"Resources": {"B": bucket, "P": {**policy, "DeletionPolicy": "Retain"}}}})
    assert retained.action == "retain"


@pytest.mark.parametrize("edit", SCALING_EDITS)
def test_a_scaling_edit_touches_nothing_running(results, edit):
    # given cluster-autoscaler has the GPU group at 2 nodes, when max/min nodes change, then
    # CloudFormation's update carries no desired size to reset it to
    print(table({edit: results[edit]}))
    assert touches_running(results[edit]) == []
    assert {c.logical_id for c in results[edit]} and all(c.action == "update" for c in results[edit])


def test_what_each_edit_replaces_or_disrupts(results):
    print(table(results))
    effects = {edit: sorted((c.type, c.action, c.effect.split(":")[0]) for c in changes if c.effect or c.action != "update")
               for edit, changes in results.items()}
    # a replacement is a creation: verify does not count the group, its desired size is written
    assert effects["gpu instance_type -> g6.48xlarge"] == [
        ("AWS::EKS::Nodegroup", "replace", "NODES TERMINATED")]
    assert effects["gpu root_volume_gib 200 -> 300"] == [("AWS::EKS::Nodegroup", "update", "NODES ROLLED")]
    # CapacityType and InstanceTypes are create-only (the Nodegroup schema): on-demand -> spot
    # replaces the group, its nodes go; the launch template (placement group, EFA) is the same
    assert effects["gpu capacity on-demand -> spot"] == effects["gpu capacity on-demand -> spot with g5.12xlarge too"] \
        == [("AWS::EKS::Nodegroup", "replace", "NODES TERMINATED")]
    # a raised minimum carries no desired size either: EKS refuses it while fewer nodes run
    assert effects["gpu min_nodes 0 -> 1"] == [("AWS::EKS::Nodegroup", "update", "MAY BE REFUSED")]
    # so does a lowered maximum while more nodes run than it allows (the desired size stays)
    assert effects["gpu max_nodes 2 -> 1"] == [("AWS::EKS::Nodegroup", "update", "MAY BE REFUSED")]
    assert effects["cluster_autoscaler chart 9.59.0 -> 9.58.0"] == []
    assert effects["storage noncurrent_version_days 30 -> 7"] == []
    assert effects["cluster log_retention_days 30 -> 90"] == effects["cluster endpoint_access -> private"] == []
    assert effects["cluster gpu_availability_zone -> us-east-1b"] == [
        ("AWS::EKS::Nodegroup", "replace", "NODES TERMINATED")]
    # observability off: its charts go, no node is touched
    assert {t for t, _, _ in effects["observability enabled -> false"]} == {
        "Custom::AWSCDK-EKS-HelmChart", "Custom::AWSCDK-EKS-KubernetesResource"}


def test_spot_back_to_on_demand_replaces_the_group_and_its_nodes():
    # the other way: a spot group (two types) made on-demand again; CapacityType and
    # InstanceTypes are create-only, so the group is replaced, as a type change is
    spot = edited(default_raw(), "gpu capacity on-demand -> spot with g5.12xlarge too")
    back = {"gpu_node_groups.0.capacity": "on-demand", "gpu_node_groups.0.instance_types": []}
    changes = edit_over(spot, back)
    print(table({"gpu capacity spot -> on-demand": changes}))
    assert sorted((c.type, c.action, c.effect.split(":")[0]) for c in changes if c.effect or c.action != "update") == [
        ("AWS::EKS::Nodegroup", "replace", "NODES TERMINATED")]
    # the type list alone, on spot: the same replacement
    assert [c.action for c in edit_over(spot, {"gpu_node_groups.0.instance_types": []})
            if c.type == "AWS::EKS::Nodegroup"] == ["replace"]


def test_a_second_policy_on_a_bucket_that_keeps_one_is_refused():
    # S3 holds one policy per bucket: a BucketPolicy created for a bucket whose policy was
    # retained (or is still in the stack) fails with "Bucket Policy Already Exists"
    bucket = {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain", "Properties": {"BucketName": "ckpt"}}
    policy = {"Type": "AWS::S3::BucketPolicy", "DeletionPolicy": "Retain", "Properties": {"Bucket": {"Ref": "B"}}}
    adopted = {"Type": "AWS::S3::BucketPolicy", "Properties": {"Bucket": "ckpt"}}
    before = {"Resources": {"B": bucket, "P": policy}}
    [add] = [c for c in diff_stack("storage", before, {"Resources": {"Q": adopted}}) if c.action == "add"]
    assert add.effect.startswith("CREATE REFUSED: Bucket Policy Already Exists")
    # after a destroy the stack is gone but the retained policy is not
    [add] = diff_stack("storage", {}, {"Resources": {"Q": adopted}}, retained={"B": bucket, "P": policy})
    assert add.effect.startswith("CREATE REFUSED")
    assert diff_stack("storage", {}, {"Resources": {"Q": {**adopted, "Properties": {"Bucket": "other"}}}},
                      retained={"B": bucket, "P": policy})[0].effect == ""


def test_adopting_the_kept_bucket_after_a_destroy_is_not_refused(baseline):
    # given `cdk destroy` kept the checkpoint bucket with its policy, when the spec adopts it,
    # then the new storage stack creates nothing S3 refuses (no second policy on that bucket)
    raw = default_raw()
    raw["storage"]["existing_bucket"] = True
    adopt = templates(raw)
    changes = diff_stack("storage", {}, adopt["storage"], retained=kept(baseline)["storage"])
    assert [c for c in changes if c.effect] == []


def test_verify_counts_a_group_as_existing_exactly_when_the_deploy_does_not_replace_it(baseline, results):
    # the creation key (infra/verify_gate.py) must change whenever a create-only property of
    # the synthesized GPU node group does (schema: the oracle's "replace"), else the replacement
    # is written without DesiredSize and EKS refuses its creation
    for edit, changes in results.items():
        replaced = any(c.type == "AWS::EKS::Nodegroup" and c.action == "replace" and "Gpu" in c.logical_id
                       for c in changes)
        assert (deployed_groups(edited(default_raw(), edit), baseline) == frozenset()) == replaced, edit
        assert not [c for c in changes if c.effect.startswith("CREATE REFUSED")], edit
    # reordering the AZs changes no subnet (they are carved in sorted order): the group stays
    assert deployed_groups(edited(default_raw(), "cluster availability_zones -> [us-east-1b, us-east-1a]"),
                           baseline) == frozenset({"gpu"})


def test_adopting_the_kept_bucket_strips_no_protection(results):
    changes = results["storage existing_bucket -> true (redeploy)"]
    assert [c for c in changes if c.effect] == []
    assert {(c.type, c.action) for c in changes if c.action in ("retain", "delete")} <= {
        ("AWS::S3::Bucket", "retain"), ("AWS::S3::BucketPolicy", "retain")}


def test_reordering_the_availability_zones_changes_no_subnet(results):
    # the VPC's subnets are carved in the AZs' sorted order: in the spec's order, a reorder
    # replaced every subnet by one of the same CIDR (EC2 refuses it while the old one exists)
    # and changed the subnet ids the cluster stack imports (CloudFormation refuses that too)
    changes = results["cluster availability_zones -> [us-east-1b, us-east-1a]"]
    print(table({"reorder": changes}))
    assert refused(changes) == [] and touches_running(changes) == []
    assert [c for c in changes if c.stack == "network"] == []


def test_the_oracle_refuses_a_subnet_replaced_with_its_own_cidr_and_an_export_in_use():
    subnet = lambda az: {"Type": "AWS::EC2::Subnet", "Properties": {"CidrBlock": "10.0.32.0/19", "AvailabilityZone": az}}  # noqa: E731
    export = {"SubnetOut": {"Value": {"Ref": "S"}, "Export": {"Name": "net:S"}}}
    before = {"network": {"Resources": {"S": subnet("a")}, "Outputs": export},
              "cluster": {"Resources": {"G": {"Type": "AWS::EKS::Nodegroup", "Properties": {
                  "Subnets": [{"Fn::ImportValue": "net:S"}]}}}}}
    after = copy.deepcopy(before)
    after["network"]["Resources"]["S"] = subnet("b")
    effects = {c.logical_id: c.effect for c in refused(diff(before, after))}
    assert effects["S"].startswith("UPDATE REFUSED: CIDR 10.0.32.0/19")
    assert effects["SubnetOut"] == "UPDATE REFUSED: export net:S is imported by the cluster stack"


def test_destroy_keeps_the_buckets_with_their_policies(baseline):
    kept = {(c.stack, c.type) for c in destroy(baseline) if c.action == "retain"}
    assert {("storage", "AWS::S3::Bucket"), ("storage", "AWS::S3::BucketPolicy")} <= kept
    assert [c for c in destroy(baseline) if c.effect.startswith("PROTECTION")] == []


def test_turning_on_node_auto_repair_and_the_monitoring_agent_touches_nothing_running(baseline):
    """A cluster deployed before node auto repair (main's template: no NodeRepairConfig, no
    eks-node-monitoring-agent add-on), deployed again with it: each GPU group is updated in
    place (``NodeRepairConfig`` is not among AWS::EKS::Nodegroup's createOnlyProperties, and
    EKS applies it through UpdateNodegroupConfig, which replaces no node), the add-on is added,
    and nothing running is touched."""
    now = redeploy(default_raw(), baseline)
    before = copy.deepcopy(now)
    cluster = before["cluster"]["Resources"]
    repaired = [k for k, r in cluster.items() if r["Type"] == "AWS::EKS::Nodegroup"
                and (r["Properties"].get("NodeRepairConfig") or {}).get("Enabled") is True]
    gpu = [k for k, r in cluster.items() if r["Type"] == "AWS::EKS::Nodegroup"
           and any(t.get("Key") == "nvidia.com/gpu" for t in r["Properties"].get("Taints") or [])]
    assert repaired == gpu and gpu  # every GPU group, and only they
    for key in repaired:
        del cluster[key]["Properties"]["NodeRepairConfig"]
    agent = [k for k, r in cluster.items() if r["Type"] == "AWS::EKS::Addon"
             and r["Properties"]["AddonName"] == "eks-node-monitoring-agent"]
    assert len(agent) == 1
    config = json.loads(cluster[agent[0]]["Properties"]["ConfigurationValues"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in config["nodeAgent"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in config["dcgmAgent"]["tolerations"]
    del cluster[agent[0]]
    changes = diff(before, now)
    print(table({"node auto repair + monitoring agent": changes}))
    assert sorted((c.type, c.action) for c in changes) == sorted(
        [("AWS::EKS::Nodegroup", "update")] * len(gpu) + [("AWS::EKS::Addon", "add")])
    assert touches_running(changes) == [] and refused(changes) == []


# --- Sequences of verify / deploy / destroy / deploy with one record (infra/verify_gate.py decide) ---

NOTHING = {part: {} for part in STACKS}


def test_a_record_made_before_a_group_was_created_cannot_reset_it_later(baseline):
    # verify (no cluster) -> cdk deploy creates the group -> the pipeline's Deploy (its own fresh
    # record: no DesiredSize) -> a person's `cdk deploy` with the first record, within its 24 h
    old = verified(default_raw(), NOTHING)
    created = deploy_with(default_raw(), old, NOTHING)
    assert created == baseline
    pipeline = deploy_with(default_raw(), verified(default_raw(), created), created, skip=True)
    assert touches_running(diff(created, pipeline)) == []
    again = deploy_with(default_raw(), old, pipeline)
    # the record read a stack that has changed since: refused before anything changes, never
    # "DESIRED SIZE RESET to 0" on the running group
    assert isinstance(again, str), [c.row() for c in touches_running(diff(pipeline, again))]
    assert "the cluster stack changed after `raytrain-eks verify` read its GPU node groups" in again
    # the same with the override: it skips the verify's checks, not the reading of the groups
    assert isinstance(deploy_with(default_raw(), old, pipeline, skip=True), str)
    # and a plain second deploy with the first record is refused as well (the stack it read is gone)
    assert isinstance(deploy_with(default_raw(), old, created), str)
    # a verify after the change lets the deploy through, leaving the running size alone
    fresh = deploy_with(default_raw(), verified(default_raw(), pipeline), pipeline)
    assert touches_running(diff(pipeline, fresh)) == []


def test_a_record_saying_a_group_exists_cannot_refuse_its_creation_after_a_destroy(baseline):
    # deploy -> verify (the group exists) -> cdk destroy of the cluster stack -> deploy with that record
    deployed = redeploy(default_raw(), baseline)
    record = verified(default_raw(), deployed)
    assert "gpu" in json.loads(record)["existing_gpu_groups"]
    after = deploy_with(default_raw(), record, gone(deployed))
    # refused by the gate before anything is created, never "CREATE REFUSED" half-way through
    assert isinstance(after, str), [c.row() for c in refused(diff(gone(deployed), after))]
    assert "(then stack@" in after and "now absent)" in after
    # a verify after the destroy creates the group with its whole scaling config
    rebuilt = deploy_with(default_raw(), verified(default_raw(), gone(deployed)), gone(deployed))
    assert refused(diff(gone(deployed), rebuilt)) == []


def test_a_record_that_does_not_name_the_stack_or_a_stack_that_cannot_be_read_trusts_no_group():
    from environment import environment_from_dict
    from infra import verify_gate

    env = environment_from_dict(default_raw(), "environment.toml")
    now = verify_gate.now()
    old_style = verify_gate.stamp(env, "123456789012", now, frozenset({"gpu"}))
    refusal, found, _ = verify_gate.decide(env, old_style, now, "123456789012", False, lambda: verify_gate.ABSENT)
    assert "does not say which cluster stack" in refusal and found == frozenset()
    current = verify_gate.stamp(env, "123456789012", now, frozenset({"gpu"}), "stack@1")
    refusal, found, _ = verify_gate.decide(env, current, now, "123456789012", False, lambda: None)
    assert "could not be read" in refusal and found == frozenset()
    assert verify_gate.decide(env, current, now, "123456789012", False, lambda: "stack@1")[:2] == (None, frozenset({"gpu"}))


def test_an_existing_clusters_gpu_subnet_edit_replaces_the_group_as_a_creation():
    """cluster.existing: the GPU group's Subnets are the spec's private_subnet_ids (literal ids;
    the GPU AZ's entry). Subnets is create-only on AWS::EKS::Nodegroup (cfn-lint's schema), so
    pointing the GPU AZ at another subnet replaces the group: a creation, which needs its whole
    scaling config, and whose old nodes end (the deploy hold must see it). Before the fix the
    creation key left the subnet id out: verify counted the group as existing, the replacement
    went out without DesiredSize (CREATE REFUSED) and the hold saw no change."""
    from infra_variants import existing_raw

    from raytrain_eks.pipeline.apply_promote import gpu_node_changes

    raw = existing_raw()
    first = templates(raw)
    running = redeploy(raw, first)
    moved = copy.deepcopy(raw)
    gpu_az = moved["cluster"]["gpu_availability_zone"]
    moved["cluster"]["private_subnet_ids"][moved["cluster"]["availability_zones"].index(gpu_az)] = "subnet-0ccccccccccccccc3"
    after = redeploy(moved, running)
    changes = diff(running, after)
    groups = [c for c in changes if c.type == "AWS::EKS::Nodegroup"]
    assert groups and all(c.action == "replace" for c in groups), [c.row() for c in changes]
    assert refused(changes) == [], [c.row() for c in refused(changes)]
    assert [line for line in gpu_node_changes(running["cluster"], after["cluster"]) if "p5" in line and "replaced" in line], \
        gpu_node_changes(running["cluster"], after["cluster"])


def test_a_gpu_group_tagged_before_the_subnet_tag_counts_by_its_creation_key():
    # a group an earlier release created on an existing cluster has no raytrain:gpu-subnet tag:
    # it still counts as existing (no DesiredSize sent); one tagged with another subnet does not
    from infra_variants import existing_raw

    from environment import environment_from_dict
    from infra.verify_gate import SUBNET_TAG, existing, identity_tags

    env = environment_from_dict(existing_raw(), "environment.toml")
    az, zones, ids = env.cluster.gpu_availability_zone, env.cluster.availability_zones, tuple(env.cluster.private_subnet_ids)
    p5 = next(g for g in env.gpu_node_groups if g.name == "p5")
    assert SUBNET_TAG in identity_tags(p5, az, zones, ids)
    assert existing(env, [identity_tags(p5, az, zones)]) == {"p5"}
    assert existing(env, [identity_tags(p5, az, zones, ids)]) == {"p5"}
    assert existing(env, [{**identity_tags(p5, az, zones, ids), SUBNET_TAG: "subnet-0ccccccccccccccc3"}]) == frozenset()
