"""An EKS cluster a team already has (``cluster.existing``): the rules of the fields that
describe it. The fields live on their sections (cluster.py); the rules live here, one place, so
"what this app needs of an existing cluster" is read in one module.

With ``cluster.existing = "<eks name>"`` the CDK app creates no VPC, no cluster, no system node
group and no EKS managed add-on: it imports the cluster (aws_eks_v2 ``Cluster.fromClusterAttributes``)
and adds only what is missing (infra/stacks/attached.py). The imported cluster needs what
aws-cdk-lib 2.275 cannot look up offline: the VPC and its private subnets (a node group selects
its subnets through ``cluster.vpc``), and the cluster security group (the GPU nodes' launch
template lists it; the kubectl handler joins it in the VPC). `raytrain-eks verify` checks every
one of them against the live cluster (raytrain_eks/verify/existing.py).

Standard library only.
"""
from __future__ import annotations

import re
from typing import Any

from spec_schema import FieldError

EKS_NAME = re.compile(r"(?a)[0-9A-Za-z][A-Za-z0-9_-]{0,99}")
"""EKS CreateCluster's ``name`` pattern and length (1-100) (EKS API Reference)."""
NODEGROUP_NAME = re.compile(r"(?a)[0-9A-Za-z][A-Za-z0-9_-]{0,62}")
"""EKS CreateNodegroup's ``nodegroupName`` (1-63 characters) (EKS API Reference)."""
_VPC_ID = re.compile(r"vpc-[0-9a-f]{8}([0-9a-f]{9})?")
_SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8}([0-9a-f]{9})?")
_SG_ID = re.compile(r"sg-[0-9a-f]{8}([0-9a-f]{9})?")

EXISTING_ONLY = ("vpc_id", "private_subnet_ids", "cluster_security_group_id", "present_addons")
"""The cluster fields that describe an existing cluster: empty unless ``cluster.existing`` is set."""


def cluster_problem(cluster: Any, addon_keys: tuple[str, ...]) -> None:
    """Raise :class:`FieldError` (relative to ``[cluster]``) for the first field of an existing
    cluster's description that is wrong, or set without ``existing``."""
    if not cluster.existing:
        for name in EXISTING_ONLY:
            if getattr(cluster, name):
                raise FieldError(name, _shown(getattr(cluster, name)),
                                 "is only for cluster.existing (an EKS cluster this app installs onto); "
                                 "set cluster.existing, or remove it")
        return
    if not EKS_NAME.fullmatch(cluster.existing):
        raise FieldError("existing", cluster.existing,
                         "is not an EKS cluster name (1-100 letters, digits, '-' and '_', starting with a letter or digit)")
    if not _VPC_ID.fullmatch(cluster.vpc_id):
        raise FieldError("vpc_id", cluster.vpc_id, "is not a VPC id (vpc- and 8 or 17 hex digits), required with "
                                                    "cluster.existing: the existing cluster's VPC")
    zones = cluster.availability_zones
    if len(cluster.private_subnet_ids) != len(zones):
        raise FieldError("private_subnet_ids", _shown(cluster.private_subnet_ids),
                         f"must list one private subnet of vpc_id per cluster.availability_zones entry, in the "
                         f"same order ({len(zones)}: {', '.join(zones)})")
    for i, subnet in enumerate(cluster.private_subnet_ids):
        if not _SUBNET_ID.fullmatch(subnet):
            raise FieldError(f"private_subnet_ids[{i}]", subnet, "is not a subnet id (subnet- and 8 or 17 hex digits)")
        if subnet in cluster.private_subnet_ids[:i]:
            raise FieldError(f"private_subnet_ids[{i}]", subnet, "is listed twice (one subnet per AZ)")
    if not _SG_ID.fullmatch(cluster.cluster_security_group_id):
        raise FieldError("cluster_security_group_id", cluster.cluster_security_group_id,
                         "is not a security group id (sg- and 8 or 17 hex digits), required with cluster.existing: "
                         "the cluster security group EKS made (aws eks describe-cluster: "
                         "resourcesVpcConfig.clusterSecurityGroupId)")
    for i, key in enumerate(cluster.present_addons):
        if key not in addon_keys:
            raise FieldError(f"present_addons[{i}]", key,
                             f"is not an add-on of this app (known: {', '.join(addon_keys)})")
        if key in cluster.present_addons[:i]:
            raise FieldError(f"present_addons[{i}]", key, "is listed twice")
    if cluster.admin_principal_arns:
        # An access entry per principal is the cluster owner's: a second one for a principal
        # that has one fails CreateAccessEntry (ResourceInUseException), and destroying ours
        # would remove that principal's access.
        raise FieldError("admin_principal_arns", _shown(cluster.admin_principal_arns),
                         "must be empty with cluster.existing (the existing cluster's access entries are its "
                         "owner's; this app adds one only, for its own kubectl handler)")


def environment_problem(env: Any) -> None:
    """Rules across sections (absolute field names) for an existing cluster, or for a node
    group that says it exists while the cluster does not."""
    existing = env.cluster.existing
    system = env.system_node_group.existing
    if not existing and system:
        raise FieldError("system_node_group.existing", system, "is only for cluster.existing (a node group of "
                                                               "an EKS cluster this app installs onto)")
    if existing and not system:
        raise FieldError("system_node_group.existing", system,
                         f"must name the node group of cluster {existing!r} that runs the Ray heads, the submitters "
                         "and the operators (this app creates no system node group in an existing cluster)")
    if system and not NODEGROUP_NAME.fullmatch(system):
        raise FieldError("system_node_group.existing", system, "is not an EKS node group name (1-63 letters, "
                                                               "digits, '-' and '_')")
    for i, group in enumerate(env.gpu_node_groups):
        if group.existing and not existing:
            raise FieldError(f"gpu_node_groups[{i}].existing", group.existing,
                             "is only for cluster.existing (empty: this app creates the group)")
        if group.existing and not NODEGROUP_NAME.fullmatch(group.existing):
            raise FieldError(f"gpu_node_groups[{i}].existing", group.existing,
                             "is not an EKS node group name (1-63 letters, digits, '-' and '_')")
    if existing and env.image.pull_through_cache:
        raise FieldError("image.pull_through_cache", True,
                         "must be false with cluster.existing (the cache rule, its node-role grant and the ECR "
                         "endpoints are built only for a cluster and VPC this app creates)")
    if existing and env.pipeline.enabled:
        raise FieldError("pipeline.connection_arn", env.pipeline.connection_arn,
                         "must be empty with cluster.existing (the image pipeline recreates a long-lived cluster "
                         "this app owns; it is not built for an existing cluster)")


def _shown(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
