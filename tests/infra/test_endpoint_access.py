"""Every endpoint_access / public_access_cidrs the spec accepts synthesizes; the one aws_eks_v2
cannot build is refused by the spec in one line.

Oracle: aws-cdk-lib 2.275 aws-eks-v2/lib/cluster.js ``EndpointAccess.onlyFrom`` throws
"Cannot restric public access to endpoint when private access is disabled" for a public-only
endpoint; it is called here, the real code, not a copy.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from aws_cdk import aws_eks_v2 as eks

from environment import SpecError, environment_from_dict
from environment.cluster import ENDPOINT_ACCESS, OPEN_TO_ALL
from infra.stacks.cluster import endpoint_access
from infra_variants import REPO, Synthesized, default_raw, synthesize
from test_app import _env
from toml_writer import toml_text

NARROW = "203.0.113.0/24"


def test_the_oracle_public_only_cannot_be_narrowed_in_aws_eks_v2():
    with pytest.raises(Exception, match="Cannot restric public access"):
        eks.EndpointAccess.PUBLIC.only_from(NARROW)


@pytest.mark.parametrize("access, cidrs", list(itertools.product(
    ENDPOINT_ACCESS, [[], [OPEN_TO_ALL], [NARROW], [NARROW, "198.51.100.7/32"]])))
def test_every_accepted_combination_builds_and_every_other_is_one_line(access, cidrs):
    raw = default_raw()
    raw["cluster"].update(endpoint_access=access, public_access_cidrs=cidrs)
    try:
        env = environment_from_dict(raw, "endpoint.toml")
    except SpecError as err:
        assert "\n" not in str(err) and str(err).startswith("endpoint.toml: cluster.")
        return
    endpoint_access(env.cluster.endpoint_access, env.cluster.public_access_cidrs)  # must not raise


def test_public_narrowed_is_refused_naming_the_field_and_the_way_out():
    raw = default_raw()
    raw["cluster"].update(endpoint_access="public", public_access_cidrs=[NARROW])
    with pytest.raises(SpecError) as err:
        environment_from_dict(raw, "endpoint.toml")
    assert str(err.value) == (
        f"endpoint.toml: cluster.public_access_cidrs: ['{NARROW}'] cannot narrow a public-only endpoint "
        "(endpoint_access = 'public'): use endpoint_access = 'public_and_private' with these CIDRs, "
        "or [\"0.0.0.0/0\"]")


@pytest.fixture(scope="module")
def public(tmp_path_factory) -> Synthesized:
    raw = default_raw()
    raw["cluster"].update(endpoint_access="public", public_access_cidrs=[OPEN_TO_ALL])
    return synthesize(raw, tmp_path_factory.mktemp("cdk-public"), "public.toml")


def test_public_open_to_all_synthesizes_a_public_only_endpoint(public):
    [cluster] = public.resources("cluster", "AWS::EKS::Cluster").values()
    vpc = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc["EndpointPublicAccess"] is True and vpc["EndpointPrivateAccess"] is False
    assert vpc.get("PublicAccessCidrs") in (None, [OPEN_TO_ALL])
    # the kubectl handler is outside the VPC: it reaches the public endpoint
    handlers = [r for r in public.resources("cluster", "AWS::Lambda::Function").values()
                if "kubectl" in r["Properties"].get("Description", "")]
    assert handlers and all("VpcConfig" not in h["Properties"] for h in handlers)


def test_app_refuses_public_narrowed_in_one_line(tmp_path):
    raw = default_raw()
    raw["cluster"].update(endpoint_access="public", public_access_cidrs=[NARROW])
    spec_file = tmp_path / "public.toml"
    spec_file.write_text(toml_text(raw))
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=_env(CDK_CONTEXT_JSON=json.dumps({"env": str(spec_file)}),
                                     CDK_OUTDIR=str(tmp_path / "out")))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: {spec_file}: cluster.public_access_cidrs:")
