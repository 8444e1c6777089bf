"""What an update replaces, and what then collides: read from CloudFormation's own resource
schemas as cfn-lint ships them (cfnlint/data/schemas: each type's ``createOnlyProperties``,
from the CloudFormation registry's provider schemas).

A create-only property that changes makes CloudFormation create a replacement BEFORE it
deletes the old resource; a replacement that keeps a fixed name, or a unique key the old one
still holds, fails, and the stack rolls back.
"""
from __future__ import annotations

import json
from pathlib import Path

import cfnlint

from infra_variants import ADMIN, default_raw

SCHEMAS = Path(cfnlint.__file__).parent / "data" / "schemas"

# Resources that keep a fixed name on a create-only property, and why that is safe here.
FIXED_NAMES = {
    ("AWS::EKS::Cluster", "Name"): "its other create-only properties (role, IP family, encryption, "
                                   "bootstrap add-ons) are constants of this app, never spec fields",
    ("AWS::Logs::LogGroup", "LogGroupName"): "EKS writes to /aws/eks/<cluster>/cluster: the name is the "
                                             "cluster's, and it is its only create-only property",
    ("AWS::S3::Bucket", "BucketName"): "retained on delete; a redeploy adopts it (storage.existing_bucket)",
    ("AWS::EKS::Addon", "AddonName"): "one per add-on and cluster; its other create-only property is the cluster",
    ("AWS::EC2::VPCEndpoint", "ServiceName"): "com.amazonaws.<region>.<service>: it changes only with the region "
                                              "(a new stack); a replaced VPC takes its endpoints with it",
    ("AWS::EKS::PodIdentityAssociation", "Namespace"): "the key is (namespace, service account): a changed "
                                                       "namespace is a new key, no collision",
    ("AWS::IAM::Role", "RoleName"): "the run role (environment/contract.py run_role_name): its name is its only "
                                   "create-only property in use (no Path), so it is replaced only with a new name",
}


def create_only(type_name: str) -> list[str]:
    index = json.loads((SCHEMAS / "providers" / "us-east-1.json").read_text())
    if type_name not in index:  # custom resources have no provider schema
        return []
    schema = json.loads((SCHEMAS / "resources" / f"{index[type_name]}.json").read_text())
    return [p.removeprefix("/properties/") for p in schema.get("createOnlyProperties", [])]


def test_the_oracle_knows_a_node_groups_instance_types_are_create_only():
    assert {"InstanceTypes", "NodegroupName", "Subnets"} <= set(create_only("AWS::EKS::Nodegroup"))
    assert "PrincipalArn" in create_only("AWS::EKS::AccessEntry")


def test_every_fixed_name_on_a_create_only_property_is_known_safe(variant):
    found = set()
    for which in ("network", "storage", "cluster"):
        for resource in variant.json(which)["Resources"].values():
            props = resource.get("Properties", {})
            for prop in create_only(resource["Type"]):
                if "/" not in prop and "Name" in prop and isinstance(props.get(prop), str):
                    found.add((resource["Type"], prop))
    assert found <= FIXED_NAMES.keys(), found - FIXED_NAMES.keys()


def _entries(tmp_path, admins: list[str]) -> dict[str, str]:
    from environment import environment_from_dict
    from infra.build import build_app, new_app

    raw = default_raw()
    raw["cluster"]["admin_principal_arns"] = admins
    env = environment_from_dict(raw, "admins.toml")
    built = build_app(env, new_app(env, outdir=str(tmp_path)))
    from aws_cdk.assertions import Template

    resources = Template.from_stack(built.cluster).find_resources("AWS::EKS::AccessEntry")
    return {rid: r["Properties"]["PrincipalArn"] for rid, r in resources.items()}


def test_reordering_the_admins_replaces_no_access_entry(tmp_path):
    other = ADMIN.replace("platform-admin", "sre")
    before = _entries(tmp_path / "a", [ADMIN, other])
    after = _entries(tmp_path / "b", [other, ADMIN])
    assert before == after and len(before) == 3  # and the kubectl handler's own entry


def test_an_admin_listed_twice_is_one_line(tmp_path):
    import pytest

    from environment import SpecError, environment_from_dict
    from infra.build import build_app

    raw = default_raw()
    raw["cluster"]["admin_principal_arns"] = [ADMIN, ADMIN]
    with pytest.raises(SpecError) as err:
        build_app(environment_from_dict(raw, "admins.toml"))
    # The spec refuses it (one rule, in environment/cluster.py), before any construct exists.
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("admins.toml: cluster.admin_principal_arns[1]")
    assert ADMIN in message and "listed twice" in message
