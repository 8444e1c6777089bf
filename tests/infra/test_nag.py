"""Our cdk-nag pack (infra/nag.py) on aws_eks_v2 clusters, where AwsSolutions is blind.

Oracle: cdk-nag 3.0.2's own EKS rules (lib/rules/eks/EKSClusterNoEndpointPublicAccess.js and
EKSClusterControlPlaneLogs.js) match ``aws_eks.CfnCluster`` by class; they are run here, the
real pack, to show they pass an aws_eks_v2 cluster open to all with no logs.
"""
from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from cdk_nag import AwsSolutionsChecks

from infra.nag import ENDPOINT_RULE, LOGS_RULE, RaytrainChecks


def _probe(public_cidrs=None, public=True, logs=("api", "audit", "authenticator", "controllerManager", "scheduler")):
    app = cdk.App()
    stack = cdk.Stack(app, "Probe")
    eks.CfnCluster(
        stack, "Cluster", role_arn="arn:aws:iam::111122223333:role/eks",
        resources_vpc_config=eks.CfnCluster.ResourcesVpcConfigProperty(
            subnet_ids=["subnet-1", "subnet-2"], endpoint_public_access=public, endpoint_private_access=True,
            public_access_cidrs=public_cidrs),
        logging=eks.CfnCluster.LoggingProperty(cluster_logging=eks.CfnCluster.ClusterLoggingProperty(
            enabled_types=[eks.CfnCluster.LoggingTypeConfigProperty(type=t) for t in logs])))
    return app


def _rules(pack, app) -> set[str]:
    return {v.rule_name for v in pack.validate_scope(app).violations}


def test_aws_solutions_does_not_see_an_aws_eks_v2_cluster():
    app = _probe(public_cidrs=None, logs=())
    assert not {r for r in _rules(AwsSolutionsChecks(), app) if r.startswith("AwsSolutions-EKS")}


def test_an_endpoint_open_to_all_is_a_finding():
    assert ENDPOINT_RULE in _rules(RaytrainChecks(), _probe(public_cidrs=None))
    assert ENDPOINT_RULE in _rules(RaytrainChecks(), _probe(public_cidrs=["10.0.0.0/8", "0.0.0.0/0"]))
    assert ENDPOINT_RULE not in _rules(RaytrainChecks(), _probe(public_cidrs=["203.0.113.0/24"]))
    assert ENDPOINT_RULE not in _rules(RaytrainChecks(), _probe(public=False))


def test_each_missing_control_plane_log_is_a_finding():
    found = _rules(RaytrainChecks(), _probe(public_cidrs=["203.0.113.0/24"], logs=("api", "audit")))
    assert found == {f"{LOGS_RULE}[LogExport::{t}]" for t in ("authenticator", "controllerManager", "scheduler")}


def _acknowledged(synth) -> set[str]:
    import json

    stack = synth.built.cluster
    metadata = json.loads((synth.outdir / f"{stack.stack_name}.metadata.json").read_text())
    return {rule for entries in metadata.values() for e in entries if e["type"] == "aws:cdk:acknowledged-rules"
            for rule in e["data"]}


def test_only_a_spec_that_chose_every_address_acknowledges_the_endpoint(default, alternative):
    # default: public_access_cidrs = ["0.0.0.0/0"] in the shipped spec; alternative: private
    assert any(ENDPOINT_RULE in rule for rule in _acknowledged(default))
    assert not any(ENDPOINT_RULE in rule for rule in _acknowledged(alternative))
    assert RaytrainChecks().validate_scope(default.built.app).success


def test_an_endpoint_opened_behind_the_specs_back_fails(tmp_path):
    # given a spec that narrows the endpoint, a cluster whose template opens it anyway is a finding
    from infra.build import build_app, new_app
    from environment import environment_from_dict
    from infra_variants import default_raw

    raw = default_raw()
    raw["cluster"]["public_access_cidrs"] = ["203.0.113.0/24"]
    env = environment_from_dict(raw, "narrow.toml")
    built = build_app(env, new_app(env, outdir=str(tmp_path)))
    assert RaytrainChecks().validate_scope(built.app).success
    built.cluster.cluster.node.default_child.add_property_override(
        "ResourcesVpcConfig.PublicAccessCidrs", ["0.0.0.0/0"])
    built.cluster.cluster.node.default_child.resources_vpc_config = eks.CfnCluster.ResourcesVpcConfigProperty(
        subnet_ids=["subnet-1"], endpoint_public_access=True, public_access_cidrs=["0.0.0.0/0"])
    assert ENDPOINT_RULE in _rules(RaytrainChecks(), built.app)
