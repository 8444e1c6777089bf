"""The cluster's managed node groups: what every node shares, the system group's launch
template, and one GPU group per ``[[gpu_node_groups]]`` entry of the spec with its launch template
(EFA interfaces, placement, IMDSv2, gp3 root, the NVMe instance store as RAID0 and the EFA memlock
limit (nodeadm), and the capacity reservation or capacity block) and EFA's security group.

- The node role carries only what the kubelet and image pulls need. The VPC CNI's
  network-interface permissions are on the CNI's own Pod Identity role
  (:class:`infra.constructs.cluster_addons.ManagedAddons`), not here.
- IMDSv2 only, with a response hop limit of 1: a reply to a container behind the node's network
  namespace (one hop further) is dropped, so a pod cannot fetch the node role's credentials.
  Nothing in a pod needs IMDS: Ray pods get credentials through Pod Identity and their region
  from the environment; the agents that do need it (aws-node, the Pod Identity agent) run in the
  host network namespace.
- EFA's security group: all traffic to and from itself, nothing else (:class:`EfaSecurityGroup`).
"""
from __future__ import annotations

import json

from aws_cdk import Fn, aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment import GpuNodeGroupSpec
from environment.contract import EFA_MEMLOCK_RLIMIT, EFA_RESOURCE, GPU_ACCELERATOR_LABEL, GPU_RESOURCE, gpu_accelerator
from infra.nag import acknowledge_node_role
from infra.verify_gate import AMI_TYPE, autoscaled, identity_tags

# --- What every node shares ------------------------------------------------------------------

NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")
IMDS_HOP_LIMIT = 1


def metadata_options() -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    """IMDSv2 only, unreachable from pod network namespaces (hop limit 1)."""
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT)


# The AL2023 EKS AMIs boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"


def root_volume(disk_gib: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    """An encrypted gp3 root volume of ``disk_gib``, deleted with the instance."""
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE, ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=disk_gib, volume_type="gp3", encrypted=True, delete_on_termination=True))


def node_role(scope: Construct, construct_id: str) -> iam.Role:
    """The role of every managed node group (EKS creates the node access entry for it)."""
    role = iam.Role(scope, construct_id, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                    description="EKS nodes: kubelet and image pulls only (no CNI permissions)",
                    managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in NODE_ROLE_POLICIES])
    acknowledge_node_role(role)
    return role


def system_launch_template(scope: Construct, construct_id: str, *, disk_gib: int) -> ec2.CfnLaunchTemplate:
    """The system node group's launch template: the metadata settings and an encrypted gp3 root
    of ``disk_gib`` (the managed node group fills in the AMI and instance type)."""
    return ec2.CfnLaunchTemplate(scope, construct_id, launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
        metadata_options=metadata_options(), block_device_mappings=[root_volume(disk_gib)]))


class EfaSecurityGroup(Construct):
    """A security group whose members may exchange any traffic with each other.

    EFA's SRD transport is not TCP/UDP on a port: the EFA user guide requires a group that
    allows all inbound and outbound traffic to and from itself. It adds no other rule; the
    nodes' other traffic goes through the EKS cluster security group on the same interface.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(scope, construct_id)
        self.security_group = ec2.SecurityGroup(
            self, "Group", vpc=vpc, allow_all_outbound=False,
            description="EFA: all traffic between GPU nodes of this cluster (self-referencing)")
        self.security_group.add_ingress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA: all traffic from itself")
        self.security_group.add_egress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA: all traffic to itself")


# --- A GPU group's launch template ----------------------------------------------------------

MIME_BOUNDARY = "RAYTRAIN"


EFA_INTERFACE_TYPES = ("efa", "efa-only")
"""The launch template's interface types that each give the node one EFA device."""


def efa_network_interfaces(efa_count: int, security_group_ids: list[str]) -> list:
    """One EFA interface per network card, as the EC2 guide lays out multi-card instances
    ("Maximize network bandwidth on Amazon EC2 instances with multiple network cards",
    docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): card 0, device 0 is
    the primary interface, an EFA with ENA (the node's IP traffic); every other card gets an
    ``efa-only`` interface at device 0: EFA for NCCL without an ENA, so no IP address of the
    subnet and no route the VPC CNI could use is spent on each of p5.48xlarge's 31 others."""
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            device_index=0,
            network_card_index=card,
            interface_type="efa" if card == 0 else "efa-only",
            groups=security_group_ids,
            delete_on_termination=True,
        )
        for card in range(efa_count)
    ]


NODEADM_DEFAULT_RLIMITS = [{"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}]
"""``process.rlimits`` of nodeadm's default containerd base runtime spec
(awslabs/amazon-eks-ami ``nodeadm/internal/containerd/base-runtime-spec.json``). nodeadm merges a
NodeConfig's ``baseRuntimeSpec`` into that default with mergo's override (``nodeadm/internal/util/
merge.go``): objects merge key by key but a list REPLACES the default's, so a spec that lists
RLIMIT_MEMLOCK must list RLIMIT_NOFILE again or every container falls back to containerd's own."""


def node_config_user_data(*, raid0: bool, memlock: bool) -> str:
    """MIME multi-part user data with one nodeadm NodeConfig part (EKS merges its own NodeConfig,
    cluster endpoint and CA, into this partial one):

    - ``raid0``: the instance-store NVMe disks become one RAID0 array at /mnt/k8s-disks/0, and
      nodeadm moves the kubelet's, containerd's and the pod logs' directories onto it (image
      pulls and emptyDirs stop hitting the gp3 root);
    - ``memlock``: containerd's base runtime spec gives every container
      :data:`environment.contract.EFA_MEMLOCK_RLIMIT` (and nodeadm's default RLIMIT_NOFILE, see
      :data:`NODEADM_DEFAULT_RLIMITS`): libfabric's EFA provider pins what it registers."""
    spec = []
    if raid0:
        spec += ["  instance:", "    localStorage:", "      strategy: RAID0"]
    if memlock:
        rlimits = json.dumps(NODEADM_DEFAULT_RLIMITS + [EFA_MEMLOCK_RLIMIT])
        spec += ["  containerd:", "    baseRuntimeSpec:", "      process:", f"        rlimits: {rlimits}"]
    return "\n".join([
        "MIME-Version: 1.0",
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"',
        "",
        f"--{MIME_BOUNDARY}",
        "Content-Type: application/node.eks.aws",
        "",
        "apiVersion: node.eks.aws/v1alpha1",
        "kind: NodeConfig",
        "spec:",
        *spec,
        "",
        f"--{MIME_BOUNDARY}--",
        "",
    ])


class EfaLaunchTemplate(Construct):
    """A launch template for one GPU node group (no AMI: the managed node group's
    ``AL2023_X86_64_NVIDIA`` AMI type fills it in). :attr:`placement_group` is the cluster
    placement group created for an on-demand group, else None."""

    def __init__(self, scope: Construct, construct_id: str, *, group: GpuNodeGroupSpec,
                 security_group_ids: list[str]) -> None:
        super().__init__(scope, construct_id)
        self.placement_group: ec2.CfnPlacementGroup | None = None
        data = dict(
            network_interfaces=efa_network_interfaces(group.efa_per_node, security_group_ids),
            metadata_options=metadata_options(),  # pods cannot reach IMDS (the module docstring)
            block_device_mappings=[root_volume(group.root_volume_gib)],
        )
        if group.capacity in ("on-demand", "spot"):
            # Cluster strategy: all nodes in one rack-local group, lowest latency for NCCL. Spot
            # may launch there too: EC2 refuses only a Spot Instance that stops or hibernates on
            # interruption in a placement group ("Placement group rules and limitations", EC2
            # User Guide); a managed node group's spot instances terminate. A cluster group
            # narrows the pools a spot request can draw from: more instance types offset it.
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            data["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(
                group_name=self.placement_group.attr_group_name)
        elif group.placement_group:
            # A targeted ODCR made in a placement group can only be used in that group.
            data["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(group_name=group.placement_group)
        if group.instance.instance_store_gb or group.efa_per_node:
            data["user_data"] = Fn.base64(node_config_user_data(
                raid0=bool(group.instance.instance_store_gb), memlock=bool(group.efa_per_node)))
        if group.capacity not in ("on-demand", "spot"):
            data["capacity_reservation_specification"] = (
                ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                    capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                        capacity_reservation_id=group.capacity_reservation_id)))
        if group.capacity == "capacity-block":
            # EKS requires a capacity block's instance type in the launch template (and then
            # none on the node group) and the capacity-block market type.
            data["instance_type"] = group.instance_type
            data["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
                market_type="capacity-block")
        self.launch_template = ec2.CfnLaunchTemplate(
            self, "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(**data))


# --- A GPU node group -------------------------------------------------------------------------

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
                  "capacity-block": eks.CapacityType.CAPACITY_BLOCK,
                  # EKS picks the pool (price-capacity-optimized) among the group's instance
                  # types and drains a node on its interruption notice.
                  "spot": eks.CapacityType.SPOT}


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
                 availability_zones: tuple[str, ...], exists: bool = False,
                 private_subnet_ids: tuple[str, ...] = ()) -> None:
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
            instance_types=None if block else [ec2.InstanceType(t) for t in group.all_instance_types],
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
                  **node_template_tags(group),
                  **identity_tags(group, availability_zone, availability_zones, private_subnet_ids)},
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number),
            # One node at a time (EKS requires a maximum unavailable beside the strategy).
            max_unavailable=1,
            # NodeRepairConfig {Enabled: true}: EKS replaces a node the node monitoring agent
            # (the eks-node-monitoring-agent add-on, infra/constructs/cluster_addons.py) reports
            # unhealthy (an XID 79 GPU fallen off the bus, a failed NVLink, a kernel hang), so the
            # next attempt of a run does not land on it again, without a person.
            enable_node_auto_repair=True,
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
