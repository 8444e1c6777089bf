"""The EKS cluster: control plane, system and GPU managed node groups, the Helm add-ons, and
the Ray namespace/service account with its Pod Identity role."""
from __future__ import annotations

from aws_cdk import CfnOutput, Stack, aws_ec2 as ec2, aws_eks_v2 as eks
from constructs import Construct

from infra.constructs.cluster_addons import ClusterAddons
from infra.constructs.efa_security_group import EfaSecurityGroup
from infra.constructs.gpu_node_group import GpuNodeGroup
from infra.constructs.ray_identity import RayIdentity
from infra.kubectl_layer import kubectl_layer_factory
from infra.nag import acknowledge_cluster_findings, acknowledge_node_role
from infra.stacks.network import NetworkStack
from environment import Environment

ENDPOINT_ACCESS = {
    "public": eks.EndpointAccess.PUBLIC,
    "private": eks.EndpointAccess.PRIVATE,
    "public_and_private": eks.EndpointAccess.PUBLIC_AND_PRIVATE,
}
ALL_CONTROL_PLANE_LOGS = [
    eks.ClusterLoggingTypes.API, eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR, eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


class ClusterStack(Stack):
    """Exposes :attr:`cluster`, :attr:`system_nodegroup`, :attr:`gpu_node_groups` (one
    :class:`GpuNodeGroup` per spec entry), :attr:`pod_role`, :attr:`service_account_name`,
    :attr:`service_account_namespace` and :attr:`addons`."""

    def __init__(self, scope: Construct, construct_id: str, *, env_spec: Environment,
                 network: NetworkStack, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        spec = env_spec.cluster
        kubectl_layer = kubectl_layer_factory(env_spec)(self, "KubectlLayer")
        private = spec.endpoint_access == "private"
        self.cluster = eks.Cluster(
            self, "Cluster",
            cluster_name=spec.name,
            version=eks.KubernetesVersion.of(spec.kubernetes_version),
            vpc=network.vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            endpoint_access=ENDPOINT_ACCESS[spec.endpoint_access],
            cluster_logging=ALL_CONTROL_PLANE_LOGS,
            # Managed node groups, not EKS Auto Mode (the default): EFA needs our launch template.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            output_config_command=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer,
                # A private endpoint is reachable only from inside the VPC.
                private_subnets=network.private_subnets.subnets if private else None),
        )
        acknowledge_cluster_findings(self.cluster)
        for i, arn in enumerate(spec.admin_principal_arns):
            self.cluster.grant_cluster_admin(f"Admin{i}", arn)

        sys_spec = env_spec.system_node_group
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "SystemNodes", nodegroup_name="system",
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(sys_spec.instance_type)],
            min_size=sys_spec.nodes, desired_size=sys_spec.nodes, max_size=sys_spec.nodes,
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            labels=sys_spec.labels)
        acknowledge_node_role(self.system_nodegroup)

        self.efa_security_group = EfaSecurityGroup(self, "Efa", vpc=network.vpc).security_group
        # The cluster security group keeps node <-> control plane and pod traffic working;
        # an explicit interface list in a launch template replaces EKS's default groups.
        node_groups = [self.cluster.cluster_security_group_id,
                       self.efa_security_group.security_group_id]
        self.gpu_node_groups = [
            GpuNodeGroup(self, f"Gpu-{group.name}", cluster=self.cluster, group=group,
                         subnets=ec2.SubnetSelection(subnets=network.gpu_subnets.subnets),
                         security_group_ids=node_groups)
            for group in env_spec.gpu_node_groups
        ]
        self.gpu_nodegroups = [g.nodegroup for g in self.gpu_node_groups]
        for nodegroup in self.gpu_nodegroups:
            acknowledge_node_role(nodegroup)

        self.addons = ClusterAddons(self, "Addons", cluster=self.cluster, env_spec=env_spec)
        identity = RayIdentity(
            self, "Ray", cluster=self.cluster, namespace=env_spec.ray.namespace,
            service_account_name=env_spec.ray.service_account,
            bucket_name=env_spec.bucket_name, prefix=env_spec.storage.prefix,
            read_only_prefixes=env_spec.storage.read_only_prefixes)
        self.ray_identity = identity
        self.pod_role = identity.role
        self.service_account_name = identity.service_account_name
        self.service_account_namespace = identity.namespace

        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
        CfnOutput(self, "UpdateKubeconfigCommand",
                  value=f"aws eks update-kubeconfig --name {spec.name} --region {spec.region}")
        CfnOutput(self, "PodRoleArn", value=self.pod_role.role_arn,
                  description=f"Role of service account {env_spec.ray.namespace}/{env_spec.ray.service_account}")
