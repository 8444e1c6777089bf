"""The pipeline's least privilege: cdk-nag acknowledgements per resource and per finding (a new
wildcard fails the synth), s3:ResourceAccount on the build's bucket access, and the kubectl
builds' right to apply the Ray cluster's network policy before the cluster."""
from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import pytest
from test_pipeline_stack import ACCOUNT, CONNECTION, DIGEST, policy_statements, resources

from infra.stacks.pipeline_access import DEPLOYER_RULES

REPO = Path(__file__).resolve().parents[2]


def _build(tmp_path, mutate=None):
    from infra.build import build_app, new_app
    from environment import environment_from_dict

    raw = tomllib.loads((REPO / "environment.toml").read_text())
    raw["cluster"].update(account=ACCOUNT, endpoint_access="private", public_access_cidrs=[],
                          admin_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/admin"])
    raw["image"]["digest"] = DIGEST
    raw["pipeline"].update(connection_arn=CONNECTION, repository="example-org/raytrain-eks")
    env = environment_from_dict(raw, "pipeline-test.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(tmp_path)))
        if mutate:
            mutate(built.pipeline)
        built.app.synth()
    return env, json.loads((tmp_path / f"{built.pipeline.stack_name}.template.json").read_text())


def test_a_new_wildcard_fails_cdk_nag_even_where_wildcards_are_acknowledged(tmp_path):
    # given the Synth build's role, which holds acknowledged artifact wildcards, when it gets a
    # Resource: * statement (acknowledged elsewhere in the stack for CodeBuild in the VPC), the synth fails
    from aws_cdk import aws_iam as iam

    def widen(stack):
        stack.node.find_child("Synth").role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ec2:DescribeInstances"], resources=["*"]))

    with pytest.raises(Exception, match="ValidationFailed"):
        _build(tmp_path / "widened", widen)
    report = json.loads((tmp_path / "widened" / "validation-report.json").read_text())
    failed = {(c["constructPath"], v["ruleName"]) for r in report["pluginReports"] for v in r["violations"]
              for c in v["violatingConstructs"]}
    assert failed == {("raytrain-pipeline/Synth/Role/DefaultPolicy/Resource", "AwsSolutions-IAM5[Resource::*]")}


def test_builds_touch_the_bucket_only_in_this_account_and_may_apply_network_policies(tmp_path):
    env, template = _build(tmp_path / "plain")
    statements = {s["Sid"]: s for s in policy_statements(template, "KubectlDeployersSmokeRole") if "Sid" in s}
    for sid in ("UploadCodeArchive", "ReadSmokeRuns", "RecordSmokeImageAndReport", "TellMissingFromDenied"):
        assert statements[sid]["Condition"] == {"StringEquals": {"s3:ResourceAccount": ACCOUNT}}
    statements = {s["Sid"]: s for s in policy_statements(template, "KubectlDeployersPromoteRole") if "Sid" in s}
    assert statements["ReadJudgedRecord"]["Condition"] == {"StringEquals": {"s3:ResourceAccount": ACCOUNT}}
    assert {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]} in DEPLOYER_RULES
    [manifest] = resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
    role = json.loads(manifest["Properties"]["Manifest"])[0]
    assert any("networkpolicies" in rule["resources"] for rule in role["rules"])
