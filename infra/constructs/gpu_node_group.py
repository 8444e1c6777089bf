"""One GPU managed node group from a ``[[gpu_node_groups]]`` entry of the spec."""
from __future__ import annotations

from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment import GpuNodeGroupSpec
from environment.contract import EFA_RESOURCE, GPU_ACCELERATOR_LABEL, GPU_RESOURCE, gpu_accelerator
from infra.constructs.efa_launch_template import EfaLaunchTemplate
from infra.verify_gate import AMI_TYPE, autoscaled, identity_tags

NODE_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"
UPDATE_STRATEGY = "MINIMAL"
"""How EKS replaces a GPU group's nodes on a version update (a new launch template version, a
new AMI release): the old node first, then its successor. EKS's DEFAULT launches the new
instances first, and in a capacity reservation or capacity block sized to the group (or a full
cluster placement group) there is no slot for them: the update fails and rolls back."""

# Kubernetes spells taint effects in PascalCase, the EKS API in UPPER_SNAKE.
_TAINT_EFFECTS = {"NoSchedule": eks.TaintEffect.NO_SCHEDULE,
                  "PreferNoSchedule": eks.TaintEffect.PREFER_NO_SCHEDULE,
                  "NoExecute": eks.TaintEffect.NO_EXECUTE}

CAPACITY_TYPES = {"on-demand": eks.CapacityType.ON_DEMAND,
                  # A targeted On-Demand Capacity Reservation is still On-Demand capacity;
                  # the reservation id lives in the launch template.
                  "capacity-reservation": eks.CapacityType.ON_DEMAND,
                  "capacity-block": eks.CapacityType.CAPACITY_BLOCK}


def taint_specs(group: GpuNodeGroupSpec) -> list[eks.TaintSpec]:
    """The spec's taints (``nvidia.com/gpu=true:NoSchedule``) in the EKS API's form."""
    return [eks.TaintSpec(key=t["key"], value=t["value"], effect=_TAINT_EFFECTS[t["effect"]])
            for t in group.taints]


def node_labels(group: GpuNodeGroupSpec) -> dict[str, str]:
    """The group's labels and cluster-autoscaler's GPU label. Kept off ``group.labels``: the
    RayCluster selects nodes by those, and a changed selector recreates every Ray pod."""
    return {**group.labels, GPU_ACCELERATOR_LABEL: gpu_accelerator(group.instance.gpu_model)}


def node_template_tags(group: GpuNodeGroupSpec) -> dict[str, str]:
    """What cluster-autoscaler must know to scale a 0-node group up: it reads a managed group's
    labels and taints from DescribeNodegroup and its extended resources from the node group's
    own node-template tags (EFA is in no instance table it has). Labels and taints are tagged
    too, so an ASG-only reader sees the same node."""
    tags = {f"{NODE_TEMPLATE}/label/{k}": v for k, v in node_labels(group).items()}
    tags |= {f"{NODE_TEMPLATE}/taint/{t['key']}": f"{t['value']}:{t['effect']}" for t in group.taints}
    tags[f"{NODE_TEMPLATE}/resources/{GPU_RESOURCE}"] = str(group.gpus_per_node)
    if group.efa_per_node:
        tags[f"{NODE_TEMPLATE}/resources/{EFA_RESOURCE}"] = str(group.efa_per_node)
    return tags


class GpuNodeGroup(Construct):
    """An EFA-enabled ``AL2023_X86_64_NVIDIA`` managed node group in ONE subnet, with its
    launch template (and placement group when on-demand). Exposes :attr:`nodegroup`,
    :attr:`launch_template` and :attr:`placement_group`.

    ``exists``: the group is already deployed with this spec's create-only inputs
    (infra/verify_gate.py); an autoscaled one then carries no desired size.

    No node group name: CloudFormation generates one, so a change to a create-only property
    (instance type, capacity type, subnets, disk, AMI type) replaces the group instead of failing
    on a name the old group still holds.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster,
                 group: GpuNodeGroupSpec, subnets: ec2.SubnetSelection,
                 security_group_ids: list[str], node_role: iam.IRole, availability_zone: str,
                 availability_zones: tuple[str, ...], exists: bool = False) -> None:
        super().__init__(scope, construct_id)
        template = EfaLaunchTemplate(self, "Template", group=group,
                                     security_group_ids=security_group_ids)
        self.launch_template = template.launch_template
        self.placement_group = template.placement_group
        self.spec = group
        block = group.capacity == "capacity-block"
        self.nodegroup = eks.Nodegroup(
            self, "Nodegroup",
            cluster=cluster,
            node_role=node_role,
            # A capacity block's type is in the launch template; EKS refuses it in both places.
            instance_types=None if block else [ec2.InstanceType(group.instance_type)],
            capacity_type=CAPACITY_TYPES[group.capacity],
            min_size=group.min_nodes,
            desired_size=group.desired_nodes,
            max_size=group.max_nodes,
            subnets=subnets,
            labels=node_labels(group),
            taints=taint_specs(group),
            # What the instance type implies, visible in the console and the template.
            tags={"raytrain:gpus-per-node": str(group.gpus_per_node),
                  "raytrain:efa-per-node": str(group.efa_per_node),
                  **node_template_tags(group), **identity_tags(group, availability_zone, availability_zones)},
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number),
            # One node at a time (EKS requires a maximum unavailable beside the strategy).
            max_unavailable=1,
        )
        cfn = self.nodegroup.node.default_child
        cfn.add_property_override("UpdateConfig.UpdateStrategy", UPDATE_STRATEGY)
        if autoscaled(group) and exists:
            # aws-cdk-lib 2.275.0 aws-eks-v2/lib/managed-nodegroup.ts always writes a desiredSize
            # (props.desiredSize ?? props.minSize ?? 2), and CloudFormation sends it with every
            # ScalingConfig update: a max_nodes edit would reset cluster-autoscaler's running
            # nodes to it. Without it "no action occurs" on the running size (EKS API Reference,
            # NodegroupScalingConfig). Only once the group exists: a creation needs all three.
            cfn.add_property_deletion_override("ScalingConfig.DesiredSize")
        # Set on the L1: aws-cdk-lib 2.275 checks ami_type against its own list of GPU
        # instance families, which lacks P5 (p5.48xlarge would be refused as "not GPU").
        cfn.add_property_override("AmiType", AMI_TYPE)
