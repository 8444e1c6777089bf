"""The launch template of a GPU node group: EFA interfaces, placement group, IMDSv2, gp3 root,
and the capacity reservation or capacity block from the spec."""
from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from environment import GpuNodeGroupSpec

# The AL2023 EKS AMIs boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"


def efa_network_interfaces(efa_count: int, security_group_ids: list[str]) -> list:
    """One EFA interface per network card: card 0 is the primary (device 0), the others are
    device 1 on their own card, as the EFA guide lays out multi-card instances."""
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            device_index=0 if card == 0 else 1,
            network_card_index=card,
            interface_type="efa",
            groups=security_group_ids,
            delete_on_termination=True,
        )
        for card in range(efa_count)
    ]


class EfaLaunchTemplate(Construct):
    """A launch template for one GPU node group (no AMI: the managed node group's
    ``AL2023_X86_64_NVIDIA`` AMI type fills it in) plus its cluster placement group."""

    def __init__(self, scope: Construct, construct_id: str, *, group: GpuNodeGroupSpec,
                 security_group_ids: list[str]) -> None:
        super().__init__(scope, construct_id)
        # Cluster strategy: all nodes in one rack-local group, lowest latency for NCCL.
        self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
        data = dict(
            network_interfaces=efa_network_interfaces(group.efa_per_node, security_group_ids),
            placement=ec2.CfnLaunchTemplate.PlacementProperty(
                group_name=self.placement_group.attr_group_name),
            metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                http_endpoint="enabled",
                http_tokens="required",
                # 2 hops: containers behind the node's network namespace still reach IMDS.
                http_put_response_hop_limit=2,
            ),
            block_device_mappings=[ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=ROOT_DEVICE,
                ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=group.root_volume_gib, volume_type="gp3", encrypted=True,
                    delete_on_termination=True),
            )],
        )
        if group.capacity != "on-demand":
            data["capacity_reservation_specification"] = (
                ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                    capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                        capacity_reservation_id=group.capacity_reservation_id)))
        if group.capacity == "capacity-block":
            data["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
                market_type="capacity-block")
        self.launch_template = ec2.CfnLaunchTemplate(
            self, "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(**data))
