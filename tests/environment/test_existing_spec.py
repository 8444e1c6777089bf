"""``cluster.existing`` (environment/existing.py): a valid description of an existing cluster
loads, and every mistake is one line naming the file, the field, the bad value and what is
allowed."""
from __future__ import annotations

import copy

import pytest

from environment import SpecError, environment_from_dict
from environment.addons import ADDONS
from infra_variants import EXISTING_CLUSTER, existing_raw
from spec_template import template_raw


def test_an_existing_cluster_spec_loads():
    env = environment_from_dict(existing_raw(), "existing.toml")
    assert env.cluster.eks_name == EXISTING_CLUSTER and env.cluster.name == "raytrain"
    assert env.system_node_group.existing == "platform-system"


def test_the_shipped_template_creates_its_cluster():
    env = environment_from_dict(template_raw(), "environment.toml")
    assert env.cluster.existing == "" and env.cluster.eks_name == env.cluster.name


def _refused(raw: dict) -> str:
    with pytest.raises(SpecError) as err:
        environment_from_dict(raw, "existing.toml")
    line = str(err.value)
    assert "\n" not in line and line.startswith("existing.toml: ")
    return line


def _with(section: str, **fields) -> dict:
    raw = copy.deepcopy(existing_raw())
    raw[section].update(fields)
    return raw


@pytest.mark.parametrize("fields, expected", [
    (dict(existing="-bad"), "cluster.existing: '-bad' is not an EKS cluster name"),
    (dict(vpc_id="vpc-12"), "cluster.vpc_id: 'vpc-12' is not a VPC id"),
    (dict(vpc_id=""), "cluster.vpc_id: '' is not a VPC id (vpc- and 8 or 17 hex digits), required with cluster.existing"),
    (dict(private_subnet_ids=["subnet-0aaaaaaaaaaaaaaa1"]),
     "cluster.private_subnet_ids: ['subnet-0aaaaaaaaaaaaaaa1'] must list one private subnet of vpc_id per "
     "cluster.availability_zones entry, in the same order (2: us-east-1a, us-east-1b)"),
    (dict(private_subnet_ids=["subnet-0aaaaaaaaaaaaaaa1", "subnet-x"]),
     "cluster.private_subnet_ids[1]: 'subnet-x' is not a subnet id"),
    (dict(private_subnet_ids=["subnet-0aaaaaaaaaaaaaaa1", "subnet-0aaaaaaaaaaaaaaa1"]),
     "cluster.private_subnet_ids[1]: 'subnet-0aaaaaaaaaaaaaaa1' is listed twice"),
    (dict(cluster_security_group_id="sg-1"), "cluster.cluster_security_group_id: 'sg-1' is not a security group id"),
    (dict(present_addons=["kuberay"]), "cluster.present_addons[0]: 'kuberay' is not an add-on of this app (known: "
                                       + ", ".join(a.key for a in ADDONS) + ")"),
    (dict(present_addons=["kuberay_operator", "kuberay_operator"]),
     "cluster.present_addons[1]: 'kuberay_operator' is listed twice"),
    (dict(admin_principal_arns=["arn:aws:iam::111122223333:role/admin"]),
     "cluster.admin_principal_arns: ['arn:aws:iam::111122223333:role/admin'] must be empty with cluster.existing"),
])
def test_a_wrong_description_of_the_existing_cluster_is_one_line(fields, expected):
    assert _refused(_with("cluster", **fields)).startswith(f"existing.toml: {expected}")


@pytest.mark.parametrize("field, value", [
    ("vpc_id", "vpc-0a1b2c3d4e5f60718"), ("private_subnet_ids", ["subnet-0aaaaaaaaaaaaaaa1"]),
    ("cluster_security_group_id", "sg-0123456789abcdef0"), ("present_addons", ["kuberay_operator"]),
])
def test_a_field_of_an_existing_cluster_without_existing_is_refused(field, value):
    raw = copy.deepcopy(template_raw())
    raw["cluster"][field] = value
    assert f"cluster.{field}: " in _refused(raw) and "is only for cluster.existing" in _refused(raw)


def test_node_groups_that_exist_need_an_existing_cluster_and_the_system_group_is_required():
    raw = copy.deepcopy(template_raw())
    raw["gpu_node_groups"][0]["existing"] = "team-l4"
    assert "gpu_node_groups[0].existing: 'team-l4' is only for cluster.existing" in _refused(raw)
    raw = copy.deepcopy(template_raw())
    raw["system_node_group"]["existing"] = "platform"
    assert "system_node_group.existing: 'platform' is only for cluster.existing" in _refused(raw)
    line = _refused(_with("system_node_group", existing=""))
    assert "system_node_group.existing: '' must name the node group of cluster 'team-gpu'" in line
    raw = copy.deepcopy(existing_raw())
    raw["gpu_node_groups"][0]["existing"] = "bad name"
    assert "gpu_node_groups[0].existing: 'bad name' is not an EKS node group name" in _refused(raw)


def test_the_pipeline_is_refused_on_an_existing_cluster():
    arn = "arn:aws:codeconnections:us-east-1:111122223333:connection/0123abcd-0123-4567-89ab-0123456789ab"
    raw = _with("pipeline", connection_arn=arn, repository="team/raytrain")
    assert f"pipeline.connection_arn: '{arn}' must be empty with cluster.existing" in _refused(raw)


def test_the_image_cache_is_refused_on_an_existing_cluster():
    # The attached stack builds no cache rule, node-role grant or ECR endpoints (infra/build.py
    # passes image_cache_prefix to the cluster stack of a new cluster only).
    raw = copy.deepcopy(existing_raw())
    raw.setdefault("image", {})["pull_through_cache"] = True
    line = _refused(raw)
    assert "image.pull_through_cache: True must be false with cluster.existing" in line
