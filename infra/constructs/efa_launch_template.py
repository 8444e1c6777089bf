"""The launch template of a GPU node group: EFA interfaces, placement, IMDSv2, gp3 root, the
NVMe instance store as RAID0 and the EFA memlock limit (nodeadm), and the capacity reservation or capacity block."""
from __future__ import annotations

import json

from aws_cdk import Fn, aws_ec2 as ec2
from constructs import Construct

from environment import GpuNodeGroupSpec
from environment.contract import EFA_MEMLOCK_RLIMIT

# The AL2023 EKS AMIs boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"
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
            metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                http_endpoint="enabled",
                http_tokens="required",
                # 1 hop: pods cannot reach IMDS (see infra/constructs/node_security.py).
                http_put_response_hop_limit=1,
            ),
            block_device_mappings=[ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=ROOT_DEVICE,
                ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=group.root_volume_gib, volume_type="gp3", encrypted=True,
                    delete_on_termination=True),
            )],
        )
        if group.capacity == "on-demand":
            # Cluster strategy: all nodes in one rack-local group, lowest latency for NCCL.
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            data["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(
                group_name=self.placement_group.attr_group_name)
        elif group.placement_group:
            # A targeted ODCR made in a placement group can only be used in that group.
            data["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(group_name=group.placement_group)
        if group.instance.instance_store_gb or group.efa_per_node:
            data["user_data"] = Fn.base64(node_config_user_data(
                raid0=bool(group.instance.instance_store_gb), memlock=bool(group.efa_per_node)))
        if group.capacity != "on-demand":
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
