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
    rules = sorted(json.loads(template["LifecyclePolicy"])["rules"], key=lambda r: r["rulePriority"])
    assert all(r["selection"]["countType"] == "imageCountMoreThan" and r["action"] == {"type": "expire"} for r in rules)
    # "A rule with a tagStatus value of any must have the highest value for rulePriority" (ECR User
    # Guide, "Lifecycle policy properties"); the count rule keeps a rollback's target
    assert [r["selection"]["tagStatus"] for r in rules][-1] == "any" and rules[-1]["selection"]["countNumber"] >= 2


def _expired(rules: list[dict], images: list[tuple[str, set[str]]]) -> set[str]:
    """What an ECR lifecycle policy expires from ``images`` (digest, tags), oldest push first, as
    the ECR User Guide states its evaluation ("Lifecycle policy evaluation rules"; "Lifecycle
    policy properties"): rules apply lowest rulePriority first; a rule selects by ``tagStatus``
    (``tagged`` with a tagPrefixList: an image with a tag starting with EVERY prefix listed) and
    ``imageCountMoreThan`` N expires its selected images beyond the N most recently pushed; an
    image is expired by one rule at most, and one that matches the tagging requirements of a
    higher priority rule cannot be expired by a rule with a lower priority, which still counts it
    as if it had not been expired. A model of the documented rules, not of ECR's code (not
    public); only the selections and count type this project's policy uses."""
    def selects(selection: dict, tags: set[str]) -> bool:
        status = selection["tagStatus"]
        if status == "any":
            return True
        if status == "untagged":
            return not tags
        return all(any(t.startswith(p) for t in tags) for p in selection["tagPrefixList"])

    expired: set[str] = set()
    claimed: set[str] = set()  # matched by a higher priority rule's tagging requirements
    for rule in sorted(rules, key=lambda r: r["rulePriority"]):
        selection = rule["selection"]
        assert selection["countType"] == "imageCountMoreThan", selection  # the only count type modelled
        chosen = [digest for digest, tags in reversed(images) if selects(selection, tags)]  # newest first
        for digest in chosen[selection["countNumber"]:]:
            if digest not in claimed and digest not in expired:
                expired.add(digest)
        claimed.update(chosen)
    return expired


def test_the_cache_never_expires_the_digest_the_pipeline_promotes(capacity):
    """The nodes pull the promoted digest BY DIGEST, and the cache fills only by tag (raytrain_eks/
    pipeline/smoke.py warm_cache; aws/containers-roadmap issue 2837): once ``image.tag`` moved on to
    newer candidates the promoted digest is untagged in the cache, and an expired one cannot be
    pulled through again. Before the fix the only rule kept the newest 3 images of any kind, so
    three candidates that failed their smoke runs expired the digest every RayJob was pinned to.
    Promote now tags the digest it promotes (environment.image_source.promoted_tag,
    raytrain_eks/pipeline/apply_promote.py keep_in_cache): it and the one before it (a rollback's
    target) stay, however many candidates come after."""
    import json

    from environment.image_source import promoted_tag

    [template] = [r["Properties"] for r in capacity.resources("cluster", "AWS::ECR::RepositoryCreationTemplate").values()]
    rules = json.loads(template["LifecyclePolicy"])["rules"]
    before, promoted = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    candidates = ["sha256:" + c * 64 for c in "abcdef"]
    images = [(before, {promoted_tag(before)}), (promoted, {promoted_tag(promoted)})]
    images += [(c, set()) for c in candidates[:-1]] + [(candidates[-1], {"train-ml-cuda-v1.1.0"})]  # the tag moved on
    expired = _expired(rules, images)
    assert promoted not in expired and before not in expired
    # the candidates still expire: the cache keeps a bounded number of ~20 GB images
    assert expired == set(candidates[:3])
    # the model itself: an untagged promoted digest (no Promote tag) is what expired before
    assert promoted in _expired(rules, [(d, set()) for d, _ in images])
