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
    assert "no passing `raytrain-eks verify`" in app._deploy_refusal(env)
    monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({verify_gate.SKIP_CONTEXT: "true"}))
    assert app._deploy_refusal(env) is None
    monkeypatch.delenv("CDK_CONTEXT_JSON")
    stamps.mkdir(parents=True)
    (stamps / f"{env.spec_hash}.json").write_text(verify_gate.stamp(env, ACCOUNT, NOW))
    assert app._deploy_refusal(env) is None
