"""``image.pull_through_cache`` in the templates: the ECR pull-through cache rule, the ECR
interface endpoints beside the S3 gateway endpoint, the node role's cache statements scoped to
the rule's prefix (cfn-lint and cdk-nag run over this variant in test_lint.py: ``capacity``
has the cache on), and what turning it on does to a running cluster (the update oracle)."""
from __future__ import annotations

import copy

from infra_variants import ACCOUNT, capacity_raw
from update_oracle import CACHE_EDIT, edit_over, table, touches_running

PREFIX = "raytrain-ecr-public"
REPOSITORIES = f":ecr:us-east-1:{ACCOUNT}:repository/{PREFIX}/*"


def _endpoints(synth) -> dict[str, dict]:
    return {r["Properties"]["VpcEndpointType"] + " " + str(r["Properties"]["ServiceName"]): r["Properties"]
            for r in synth.resources("network", "AWS::EC2::VPCEndpoint").values()}


def test_the_rule_caches_ecr_public_under_the_clusters_prefix(capacity):
    assert [r["Properties"] for r in capacity.resources("cluster", "AWS::ECR::PullThroughCacheRule").values()] == [
        {"EcrRepositoryPrefix": PREFIX, "UpstreamRegistry": "ecr-public", "UpstreamRegistryUrl": "public.ecr.aws"}]


def test_the_nodes_reach_ecr_over_endpoints_and_its_layers_over_the_s3_gateway(capacity):
    endpoints = _endpoints(capacity)
    for service in ("ecr.api", "ecr.dkr"):
        props = endpoints[f"Interface com.amazonaws.us-east-1.{service}"]
        assert props["PrivateDnsEnabled"] is True  # the registry's own name resolves to the endpoint
        assert len(props["SubnetIds"]) == 2       # a private subnet per VPC AZ
    assert any(k.startswith("Gateway ") and ".s3" in k for k in endpoints)
    [group] = [g for g in capacity.resources("network", "AWS::EC2::SecurityGroup").values()
               if g["Properties"]["GroupDescription"].startswith("ECR interface endpoints")]
    assert [(i["CidrIp"], i["FromPort"], i["ToPort"]) for i in group["Properties"]["SecurityGroupIngress"]] == [
        ("10.0.0.0/16", 443, 443)]


def test_the_node_role_may_fill_only_the_cache(capacity):
    template = capacity.json("cluster")
    [policy] = [r["Properties"] for r in capacity.resources("cluster", "AWS::IAM::Policy").values()
                if any("ecr:BatchImportUpstreamImage" in s["Action"] for s in r["Properties"]["PolicyDocument"]["Statement"])]
    [statement] = policy["PolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    assert statement["Resource"]["Fn::Join"][1][-1] == REPOSITORIES  # never "*"
    [role] = policy["Roles"]
    node_roles = {g["Properties"]["NodeRole"]["Fn::GetAtt"][0]
                  for g in template["Resources"].values() if g["Type"] == "AWS::EKS::Nodegroup"}
    assert node_roles == {role["Ref"]}  # the system nodes (Ray heads) and every GPU group pull the DLC


def test_without_the_switch_there_is_no_rule_and_no_ecr_endpoint(default):
    assert default.resources("cluster", "AWS::ECR::PullThroughCacheRule") == {}
    assert [k for k in _endpoints(default) if "ecr" in k] == []


def test_turning_it_on_for_a_running_cluster_adds_and_touches_nothing_running():
    # given a cluster deployed without the cache, when the spec turns it on and is deployed
    # again (after the verify that finds the GPU groups), then only additions
    raw = copy.deepcopy(capacity_raw())
    raw["image"]["pull_through_cache"] = False
    name, changes = CACHE_EDIT[0], edit_over(raw, CACHE_EDIT[1])
    print(table({name: changes}))
    assert touches_running(changes) == [] and [c for c in changes if c.effect] == []
    assert {(c.type, c.action) for c in changes} == {
        ("AWS::ECR::PullThroughCacheRule", "add"), ("AWS::ECR::RepositoryCreationTemplate", "add"), ("AWS::IAM::Policy", "add"),
        ("AWS::EC2::VPCEndpoint", "add"), ("AWS::EC2::SecurityGroup", "add")}


def test_each_cache_repository_gets_a_lifecycle_policy(capacity):
    """The cache's repositories are made by ECR on the first pull, so only a repository creation
    template for the rule's prefix (appliedFor PULL_THROUGH_CACHE) can give them a lifecycle
    policy; before it every ~20 GB digest ever pulled stayed, billed."""
    import json

    [template] = [r["Properties"] for r in capacity.resources("cluster", "AWS::ECR::RepositoryCreationTemplate").values()]
    assert template["Prefix"] == PREFIX and template["AppliedFor"] == ["PULL_THROUGH_CACHE"]
    [rule] = json.loads(template["LifecyclePolicy"])["rules"]
    assert rule["selection"]["countType"] == "imageCountMoreThan" and rule["selection"]["countNumber"] >= 2
    assert rule["action"] == {"type": "expire"}
