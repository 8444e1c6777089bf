"""The VPC: public and private subnets in the spec's AZs, NAT, an S3 gateway endpoint, flow logs.

GPU nodes go only in the private subnet of ``cluster.gpu_availability_zone``: EFA traffic cannot
cross AZs, and a cluster placement group lives in one AZ anyway.
"""
from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack, aws_ec2 as ec2, aws_logs as logs
from constructs import Construct


class NetworkStack(Stack):
    """VPC for the EKS cluster; exposes :attr:`vpc`, :attr:`private_subnets` and
    :attr:`gpu_subnets` (the ONE private subnet in the GPU AZ)."""

    def __init__(self, scope: Construct, construct_id: str, *, availability_zones: tuple[str, ...],
                 gpu_availability_zone: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.0.0.0/16"),
            # Explicit AZs from the spec: no lookup, and the synth is the same with or without
            # an account (env-agnostic stacks would otherwise get only two unnamed AZs).
            availability_zones=list(availability_zones),
            # One NAT gateway: only image pulls and AWS APIs go through it (S3 has its own
            # endpoint); a NAT per AZ would double the idle cost for no training benefit.
            nat_gateways=1,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=22),
                # /19: the VPC CNI gives every pod a VPC address; GPU nodes hold many.
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        cidr_mask=19),
            ],
        )
        # Checkpoint traffic to S3 stays off the NAT gateway (no per-GB NAT charge).
        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3)
        flow_log_group = logs.LogGroup(
            self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY)
        self.vpc.add_flow_log(
            "FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT)
        self.private_subnets = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.gpu_subnets = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
            availability_zones=[gpu_availability_zone])
