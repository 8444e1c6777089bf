"""Which of the spec's GPU node groups already exist: only those may deploy without a desired size.

CloudFormation must CREATE an ``AWS::EKS::Nodegroup`` with its whole scaling config ("When
creating a node group, you must specify all or none of the properties": EKS API Reference,
NodegroupScalingConfig, and the CloudFormation ``AWS::EKS::Nodegroup ScalingConfig`` page),
but an UPDATE that carries DesiredSize resets the running size to it, and one without it leaves
that size alone ("When using CloudFormation, no action occurs if you remove this parameter from
your CFN template", same EKS page, desiredSize). So an autoscaled group's template has a desired
size exactly when the deploy creates the group: `raytrain-eks verify` finds the spec's groups
(EKS DescribeNodegroup, by :data:`GROUP_TAG`), the deploy gate's record carries their names, and
app.py hands them to ``build_app``.

A group whose create-only inputs changed is replaced, which is a creation: it counts as
existing only while its :func:`creation_key` (instance type, capacity, GPU AZ and the AZ list,
AMI type: the inputs of the schema's createOnlyProperties) is the one
its running node group is tagged with.

Standard library only: the CLI imports it without aws_cdk.
"""
from __future__ import annotations

from collections.abc import Iterable

from environment import Environment, GpuNodeGroupSpec

GROUP_TAG = "raytrain:gpu-node-group"
"""The node group's tag naming its ``[[gpu_node_groups]]`` entry (CloudFormation generates the
node group's own name, so the name cannot say it)."""
CREATION_TAG = "raytrain:creation-key"
"""The node group's tag holding :func:`creation_key` of the spec it was created from."""


def autoscaled(group: GpuNodeGroupSpec) -> bool:
    """Whether cluster-autoscaler sizes the group (min < max): a desired size in its template
    would reset the autoscaler's work on every scaling update."""
    return group.min_nodes < group.max_nodes


AMI_TYPE = "AL2023_x86_64_NVIDIA"
"""The GPU groups' ``AmiType`` (create-only; CloudFormation spells it with a lower-case "x86")."""


def creation_key(group: GpuNodeGroupSpec, gpu_availability_zone: str, availability_zones: tuple[str, ...]) -> str:
    """What, changed, makes CloudFormation replace the group: the spec inputs of the schema's
    createOnlyProperties (a tag value: letters, digits, ./_-). InstanceTypes and CapacityType:
    ``instance_type``, ``capacity``; Subnets: the GPU AZ's private subnet, whose CIDR block
    (create-only on AWS::EC2::Subnet) follows its place among ``cluster.availability_zones``
    sorted by name (infra/stacks/network.py carves the subnets in that order, so the order the
    spec lists them in does not count); AmiType: :data:`AMI_TYPE`.
    NodeRole, ClusterName, RemoteAccess, NodegroupName and DiskSize no spec field drives (the
    disk is in the launch template: a new version, not a replacement)."""
    zones = ".".join(sorted(availability_zones))
    return f"{group.instance_type}/{group.capacity}/{gpu_availability_zone}/{zones}/{AMI_TYPE}"


def identity_tags(group: GpuNodeGroupSpec, gpu_availability_zone: str, availability_zones: tuple[str, ...]) -> dict[str, str]:
    """The tags by which verify finds the group again."""
    return {GROUP_TAG: group.name, CREATION_TAG: creation_key(group, gpu_availability_zone, availability_zones)}


def existing(env: Environment, node_group_tags: Iterable[dict[str, str]]) -> frozenset[str]:
    """The names of ``env``'s GPU groups that a deploy updates in place, given the tags of every
    node group of the cluster (EKS DescribeNodegroup ``tags``)."""
    found = {(tags.get(GROUP_TAG), tags.get(CREATION_TAG)) for tags in node_group_tags}
    az, zones = env.cluster.gpu_availability_zone, env.cluster.availability_zones
    return frozenset(g.name for g in env.gpu_node_groups if (g.name, creation_key(g, az, zones)) in found)


def reset_warning(env: Environment) -> str | None:
    """The one line a synth prints when it cannot know which groups exist (no recent verify,
    deployed with the override): every autoscaled group keeps its desired size (safe to create)."""
    # An existing cluster's own groups (``existing``) are not in any template of this app.
    groups = [g.name for g in env.gpu_node_groups if autoscaled(g) and not g.existing]
    if not groups:
        return None
    return (f"warning: {env.source}: no recent `raytrain-eks verify` says which GPU node groups exist, so "
            f"{', '.join(groups)} keep(s) DesiredSize = min_nodes: a later min/max_nodes edit may reset the running "
            f"size to it (run `raytrain-eks verify --env {env.source}` before deploying)")
