"""What the nodes of the cluster share: the node role, the instance metadata settings, and (the
GPU nodes) the security group EFA needs.

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

from aws_cdk import aws_ec2 as ec2, aws_iam as iam
from constructs import Construct

from infra.constructs.gpu_node_group import ROOT_DEVICE
from infra.nag import acknowledge_node_role

NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")
IMDS_HOP_LIMIT = 1


def metadata_options() -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    """IMDSv2 only, unreachable from pod network namespaces (hop limit 1)."""
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT)


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
        metadata_options=metadata_options(),
        block_device_mappings=[ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
            device_name=ROOT_DEVICE, ebs=ec2.CfnLaunchTemplate.EbsProperty(
                volume_size=disk_gib, volume_type="gp3", encrypted=True, delete_on_termination=True))]))


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
