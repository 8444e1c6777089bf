"""cfn-lint and cdk-nag over every synthesized template of every spec variant: the shipped spec
(scale to zero), a capacity reservation and a p5.48xlarge group, a capacity block."""
from __future__ import annotations

import json

import pytest

# cfn-lint warnings we accept, and why. Anything else (every E*, any other W*) fails.
IGNORED_WARNINGS = {
    "W3005": "CDK emits DependsOn next to a Ref/GetAtt that already implies it (kubectl "
             "provider roles); redundant, harmless.",
    "W3010": "Hard-coded AZs are the point: the spec pins them (GPU nodes in ONE AZ for EFA).",
}
STACKS = ("network", "storage", "cluster")


def _lint(synth, which: str):
    from cfnlint.api import lint
    from cfnlint.config import ManualArgs

    stack = getattr(synth.built, which)
    text = (synth.outdir / f"{stack.stack_name}.template.json").read_text()
    return lint(text, config=ManualArgs(regions=[synth.env.cluster.region]))


@pytest.mark.parametrize("which", STACKS)
def test_cfn_lint_no_errors_and_only_known_warnings(variant, which):
    matches = _lint(variant, which)
    unexpected = [f"{m.rule.id} {m.message} ({'/'.join(map(str, m.path))})" for m in matches
                  if m.rule.id not in IGNORED_WARNINGS]
    assert unexpected == []
    assert not [m for m in matches if m.rule.id.startswith("E")]


@pytest.mark.parametrize("which", ("storage", "cluster"))
def test_cfn_lint_on_an_existing_cluster(existing, which):
    # the stacks installed onto an existing cluster (no network stack there) lint as the others
    matches = _lint(existing, which)
    assert [f"{m.rule.id} {m.message}" for m in matches if m.rule.id not in IGNORED_WARNINGS] == []


def test_cdk_nag_on_an_existing_cluster(existing):
    reports = existing.validation_report["pluginReports"]
    assert [r for r in reports if r["conclusion"] != "success" or r["violations"]] == []


def test_cfn_lint_catches_a_real_error(default):
    # given a template with a bad property, cfn-lint reports an error (the check can fail)
    from cfnlint.api import lint
    from cfnlint.config import ManualArgs

    template = default.json("cluster")
    [nodegroup] = [k for k, v in template["Resources"].items()
                   if v["Type"] == "AWS::EKS::Nodegroup" and v["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"]
    template["Resources"][nodegroup]["Properties"]["CapacityType"] = "SOMETIMES"
    matches = lint(json.dumps(template), config=ManualArgs(regions=["us-east-1"]))
    assert any(m.rule.id.startswith("E") for m in matches)


def test_cdk_nag_zero_unacknowledged_findings(variant):
    # the synth in conftest already raises on a finding; the report lists no failure either
    reports = variant.validation_report["pluginReports"]
    assert [r for r in reports if r["conclusion"] != "success" or r["violations"]] == []


def test_nag_checks_fail_the_synth_on_an_unacknowledged_finding(tmp_path):
    # given the plugin build_app registers, an unencrypted, unlogged bucket fails the synth;
    # acknowledged, the same findings pass (so the suite's green synths mean something)
    import aws_cdk as cdk
    from aws_cdk import aws_s3 as s3

    from infra.nag import acknowledge, add_nag_checks

    def synth(acknowledged: bool, outdir):
        app = cdk.App(outdir=str(outdir))
        stack = cdk.Stack(app, "Probe")
        bucket = s3.Bucket(stack, "Plain")
        if acknowledged:
            for rule in ("AwsSolutions-S1", "AwsSolutions-S10"):
                acknowledge(bucket, rule, "A probe bucket in a unit test, never deployed anywhere.")
        add_nag_checks(app)
        app.synth()

    with pytest.raises(Exception, match="ValidationFailed"):
        synth(False, tmp_path / "a")
    report = json.loads((tmp_path / "a" / "validation-report.json").read_text())
    rules = {v["ruleName"] for r in report["pluginReports"] for v in r["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules
    synth(True, tmp_path / "b")


def _acknowledgements(synth) -> dict[str, str]:
    """'path rule' -> reason, from the acknowledged-rules metadata of every stack."""
    found = {}
    for which in STACKS:
        stack = getattr(synth.built, which)
        metadata = json.loads((synth.outdir / f"{stack.stack_name}.metadata.json").read_text())
        for path, entries in metadata.items():
            for entry in entries:
                if entry["type"] == "aws:cdk:acknowledged-rules":
                    for rule, reason in entry["data"].items():
                        if "AwsSolutions-" in rule:
                            found[f"{path} {rule}"] = reason
    return found


def test_every_nag_acknowledgement_has_a_real_reason(variant):
    acks = _acknowledgements(variant)
    groups = len(variant.env.gpu_node_groups)
    # control-plane role 1 + kubectl provider 8 + its read of the CRD chart assets 4 + the ONE
    # node role's 2 managed policies (no CNI policy) + the CNI's own role 1 + access-log bucket 1
    # + the three pod policies (the long-lived cluster's, the run role's, the smoke runs'): each its read/write
    # prefix 1 + each read-only prefix + the uploaded inputs 1 (+ MLflow on the tracking server 1)
    read_only = len(variant.env.storage.read_only_prefixes)
    tracking = 1 if variant.env.ray.mlflow_tracking_server_arn else 0
    # + cluster-autoscaler's describe/scale policy 1 + with the image cache, the node role's
    # statements on the cache's repositories 1
    cache = 1 if variant.env.image.pull_through_cache else 0
    # + the submitters' policy: associations by id, code archive, inputs, runs read 4
    assert groups >= 1 and len(acks) == 1 + 8 + 4 + 2 + 1 + 1 + 3 * (1 + read_only + 1 + tracking) + 1 + cache + 4
    for key, reason in acks.items():
        assert len(reason) >= 40, key
    # each finding has a reason of its own (no sentence copied from one finding to another)
    assert len(set(acks.values())) == len(acks)
    rules = {key.split(" ", 1)[1] for key in acks}
    # never a blanket acknowledgement of a whole rule for wildcard permissions
    assert not {"Annotation::AwsSolutions-IAM5", "Annotation::AwsSolutions-IAM4"} & rules
