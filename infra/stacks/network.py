"""The VPC: public and private subnets in the spec's AZs, NAT, an S3 gateway endpoint, flow logs,
and with ``image.pull_through_cache`` the ECR interface endpoints (ecr.api, ecr.dkr).

GPU nodes go only in the private subnet of ``cluster.gpu_availability_zone``: EFA traffic cannot
cross AZs, and a cluster placement group lives in one AZ anyway.
"""
from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack, aws_ec2 as ec2, aws_logs as logs
from constructs import Construct


VPC_CIDR = "10.0.0.0/16"


class NetworkStack(Stack):
    """VPC for the EKS cluster; exposes :attr:`vpc`, :attr:`private_subnets` and
    :attr:`gpu_subnets` (the ONE private subnet in the GPU AZ)."""

    def __init__(self, scope: Construct, construct_id: str, *, availability_zones: tuple[str, ...],
                 gpu_availability_zone: str, ecr_endpoints: bool = False, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            # Explicit AZs from the spec: no lookup, and the synth is the same with or without
            # an account (env-agnostic stacks would otherwise get only two unnamed AZs). Sorted:
            # CDK carves the subnets' CIDRs in this order, and a reordered list would replace
            # every subnet by one of the same CIDR (EC2 refuses it while the old one exists) and
            # change the subnet ids the cluster stack imports (CloudFormation refuses that too).
            availability_zones=sorted(availability_zones),
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
        self.ecr_endpoints = self._ecr_endpoints() if ecr_endpoints else []
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

    def _ecr_endpoints(self) -> list[ec2.InterfaceVpcEndpoint]:
        """ecr.api (auth token, manifests) and ecr.dkr (the registry) in every private subnet,
        with private DNS: the nodes' pulls from the account's registry resolve to them and never
        reach the NAT. The layers come from S3 (Amazon ECR User Guide, "Interface VPC endpoints":
        ECR stores layers in S3, reached here over the gateway endpoint above). Their security
        group admits HTTPS from the VPC's CIDR only, written as a literal so that cdk-nag's
        EC23 check can read it."""
        group = ec2.SecurityGroup(self, "EcrEndpoints", vpc=self.vpc, allow_all_outbound=False,
                                  description="ECR interface endpoints: HTTPS from the VPC")
        group.add_ingress_rule(ec2.Peer.ipv4(VPC_CIDR), ec2.Port.tcp(443), "image pulls from the nodes")
        return [self.vpc.add_interface_endpoint(
                    name, service=service, private_dns_enabled=True, open=False, security_groups=[group],
                    subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS))
                for name, service in (("EcrApiEndpoint", ec2.InterfaceVpcEndpointAwsService.ECR),
                                      ("EcrDockerEndpoint", ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER))]
