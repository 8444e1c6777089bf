"""The deploy gate (infra/verify_gate.py): the cluster stack deploys only after a recent passing
`raytrain-eks verify` of the same spec and account; otherwise it carries a CloudFormation rule
that always fails, so CloudFormation refuses the change set with one line (and ``cdk synth``
still succeeds). The rule's syntax is checked by cfn-lint, whose rule schema is CloudFormation's
template schema (cfnlint/data/schemas/other/rules)."""
from __future__ import annotations

import json
import warnings
from datetime import timedelta

from environment import environment_from_dict
from infra import verify_gate
from infra_variants import ACCOUNT, default_raw

NOW = verify_gate.now()


def _env(**cluster):
    raw = default_raw()
    raw["cluster"].update(cluster)
    return environment_from_dict(raw, "environment.toml")


def test_no_old_or_other_accounts_verify_refuses_with_the_fix():
    env = _env(account=ACCOUNT)
    for recorded, expected in [
        (None, "no passing `raytrain-eks verify` of this spec"),
        (verify_gate.stamp(env, ACCOUNT, NOW - timedelta(hours=30)), "is 30 h old (at most 24 h)"),
        (verify_gate.stamp(env, "999988887777", NOW), "passed for account 999988887777, this deploy is for account"),
    ]:
        line = verify_gate.refusal(env, recorded, NOW)
        assert expected in line and "\n" not in line and line.startswith("environment.toml: ")
        assert "run `raytrain-eks verify --env environment.toml`" in line and "-c raytrain:skip-verify=true" in line
    assert verify_gate.refusal(env, verify_gate.stamp(env, ACCOUNT, NOW - timedelta(hours=1)), NOW) is None


def test_a_verify_of_another_spec_does_not_count():
    env, other = _env(account=ACCOUNT), _env(account=ACCOUNT, log_retention_days=90)
    assert verify_gate.stamp_path(verify_gate.Path("/r"), env) != verify_gate.stamp_path(verify_gate.Path("/r"), other)


def test_without_an_account_in_the_spec_the_cli_credentials_account_decides():
    env = _env()
    recorded = verify_gate.stamp(env, ACCOUNT, NOW)
    assert verify_gate.refusal(env, recorded, NOW, deploying_account=ACCOUNT) is None
    assert "this deploy is for account 444455556666" in verify_gate.refusal(env, recorded, NOW, "444455556666")


def test_an_unverified_cluster_stack_carries_a_rule_that_refuses_the_deploy(tmp_path):
    from aws_cdk.assertions import Template
    from cfnlint.api import lint_all

    from infra.build import build_app, new_app

    env = _env(account=ACCOUNT)
    line = verify_gate.refusal(env, None, NOW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(tmp_path)), deploy_refusal=line)
        cluster = Template.from_stack(built.cluster).to_json()
        others = [Template.from_stack(s).to_json() for s in (built.network, built.storage)]
    [assertion] = cluster["Rules"]["VerifiedBeforeDeploy"]["Assertions"]
    assert assertion == {"Assert": {"Fn::Equals": ["unverified", "verified"]}, "AssertDescription": line}
    assert all("VerifiedBeforeDeploy" not in t.get("Rules", {}) for t in others)  # only the cluster stack is gated
    errors = [m for m in lint_all(json.dumps(cluster)) if m.rule.id.startswith("E")]
    assert errors == []


def test_app_py_reads_the_recorded_pass_and_the_explicit_override(tmp_path, monkeypatch):
    # app.py as the CDK CLI runs it: the override and the deploying account come in the
    # environment the CLI sets (CDK_CONTEXT_JSON, CDK_DEFAULT_ACCOUNT)
    import app

    env = _env(account=ACCOUNT)
    stamps = tmp_path / ".work" / "verify"
    monkeypatch.setattr(verify_gate, "stamp_path", lambda root, spec: stamps / f"{spec.spec_hash}.json")
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", ACCOUNT)
    monkeypatch.delenv("CDK_CONTEXT_JSON", raising=False)
    refusal, existing, warning = app._deploy_gate(env)
    assert "no passing `raytrain-eks verify`" in refusal and existing == frozenset() and warning is None
    stamps.mkdir(parents=True)
    record = stamps / f"{env.spec_hash}.json"
    # the cluster stack's state is read at the deploy, from CloudFormation (moto's mock_aws
    # models DescribeStacks: "Stack with id ... does not exist" for a stack never created)
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_CLOUDFORMATION", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        record.write_text(verify_gate.stamp(env, ACCOUNT, NOW, frozenset({"gpu"}), verify_gate.ABSENT))
        assert app._deploy_gate(env) == (None, frozenset({"gpu"}), None)  # the groups verify found
        # a record of another state of the stack (it was deployed or destroyed since): refused,
        # with the override too (it skips verify's checks, not the reading of the groups)
        record.write_text(verify_gate.stamp(env, ACCOUNT, NOW, frozenset({"gpu"}), "arn:stack/1@2026-12-05T10:00:00"))
        assert "the cluster stack changed after" in app._deploy_gate(env)[0]
        monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({verify_gate.SKIP_CONTEXT: "true"}))
        assert "the cluster stack changed after" in app._deploy_gate(env)[0]
        # an old record of the same state: the override deploys with the groups it found
        record.write_text(verify_gate.stamp(env, ACCOUNT, NOW - timedelta(hours=30), frozenset({"gpu"}), verify_gate.ABSENT))
        assert app._deploy_gate(env) == (None, frozenset({"gpu"}), None)
    # CloudFormation unreachable (an offline synth): the state is unknown, so the record is
    # trusted by no deploy (a closed port answers at once: connection refused)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    refusal, existing, warning = app._deploy_gate(env)
    assert "state could not be read" in refusal and existing == frozenset() and warning is None


def test_the_override_without_a_record_synthesizes_desired_sizes_and_warns_once(tmp_path):
    # app.py as `cdk deploy -c raytrain:skip-verify=true` runs it (its own process: the CLI's
    # environment), with no verify recorded: every group is written as a creation (safe if it
    # does not exist), and one line says what a later scaling edit may do
    import os
    import subprocess
    import sys
    from pathlib import Path

    from toml_writer import toml_text

    raw = default_raw()
    raw["cluster"].update(account=ACCOUNT, name="never-verified")  # no stamp of this spec exists
    spec = tmp_path / "environment.toml"
    spec.write_text(toml_text(raw))
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "app.py")], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "ENV_FILE": str(spec), "CDK_OUTDIR": str(tmp_path / "cdk.out"),
                              "CDK_CONTEXT_JSON": json.dumps({verify_gate.SKIP_CONTEXT: "true"})})
    assert run.returncode == 0, run.stderr[-2000:]
    [line] = [x for x in run.stderr.splitlines() if x.startswith("warning: ")]
    assert "gpu keep(s) DesiredSize = min_nodes: a later min/max_nodes edit may reset the running size" in line
    [cluster] = (tmp_path / "cdk.out").glob("*-cluster.template.json")
    scaling = [r["Properties"]["ScalingConfig"] for r in json.loads(cluster.read_text())["Resources"].values()
               if r["Type"] == "AWS::EKS::Nodegroup" and r["Properties"]["ScalingConfig"]["MinSize"] == 0]
    assert scaling == [{"MinSize": 0, "MaxSize": 2, "DesiredSize": 0}]
