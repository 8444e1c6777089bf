"""The security group EFA needs: all traffic to and from itself, nothing else."""
from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct


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
