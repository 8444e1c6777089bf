"""The cluster stack of an environment installed onto an EKS cluster a team already has
(``cluster.existing``, environment/existing.py): only what that cluster lacks.

It creates: the kubectl handler and its one access entry, the Ray namespace with its network
policies and service account, the pod role and its Pod Identity association, new GPU node
groups (with their node role, launch templates and EFA security group), and each Helm add-on
of the table that ``cluster.present_addons`` does not name (with cluster-autoscaler's role when
that add-on is installed here), and the objects of a present add-on that are this app's own
(Kueue's queue objects: every queued RayJob names the LocalQueue). It creates no VPC, no cluster, no system node group, no EKS
managed add-on and no access entry for a person: those are the cluster owner's, and
CloudFormation deletes on ``cdk destroy`` only what its template holds.

What aws-cdk-lib 2.275's aws_eks_v2 gives an imported cluster, and what this stack adds
(aws-eks-v2/lib/cluster.js ``ImportedCluster``, kubectl-provider.js, managed-nodegroup.js):

- ``Cluster.fromClusterAttributes`` keeps ``kubectlProvider`` and ignores
  ``kubectlProviderOptions`` (the constructor reads only the former): a ``KubectlProvider`` is
  made here, for a first import, and handed to a second import of the same cluster.
- ``KubectlProvider.getKubectlProvider`` orders a chart or manifest after the kubectl barrier
  (the handler's cluster-admin access entry) only for a ``Cluster``: here every Kubernetes
  custom resource is made to wait for the handler's access entry (infra/constructs/cluster_addons.py).
- the handler's role gets that access entry here (a new ``Cluster`` grants it itself): EKS
  access entries need the cluster's authentication mode ``API`` or ``API_AND_CONFIG_MAP``
  (verify checks it).
- ``KubectlProvider`` with private subnets uses ``cluster.vpc`` and ``cluster.clusterSecurityGroup``;
  a ``Nodegroup`` selects its subnets through ``cluster.vpc``: both are imported from the spec.
"""
from __future__ import annotations

from typing import Callable

from aws_cdk import CfnOutput, Stack, aws_ec2 as ec2, aws_eks_v2 as eks, aws_lambda
from constructs import Construct

from environment import GpuNodeGroupSpec
from environment.addons import ADDONS_BY_KEY, CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
from environment.contract import CODE_PREFIX
from environment.model import ClusterSpec, RaySpec
from infra.constructs.cluster_addons import ClusterAddons, ResolvedAddon, kubernetes_objects_after
from infra.constructs.node_groups import EfaSecurityGroup, GpuNodeGroup, node_role
from infra.constructs.pod_identity import AutoscalerIdentity, RayIdentity
from infra.constructs.submitter_access import SubmitterAccess
from infra.nag import acknowledge_kubectl_provider

CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
"""What aws_eks_v2 grants a new cluster's kubectl handler (cluster.js ``grantClusterAdmin``)."""


def imported_vpc(scope: Construct, spec: ClusterSpec) -> ec2.IVpc:
    """The existing cluster's VPC and its private subnets, one per AZ, from the spec (no lookup)."""
    return ec2.Vpc.from_vpc_attributes(
        scope, "Vpc", vpc_id=spec.vpc_id, availability_zones=list(spec.availability_zones),
        private_subnet_ids=list(spec.private_subnet_ids))


class AttachedClusterStack(Stack):
    """Exposes what :class:`infra.stacks.cluster.ClusterStack` does for the rest of the app:
    :attr:`cluster` (imported), :attr:`kubectl_provider`, :attr:`kubectl_access`,
    :attr:`gpu_node_groups` (the NEW groups only), :attr:`pod_role`, :attr:`service_account_name`,
    :attr:`service_account_namespace`, :attr:`addons`, :attr:`autoscaler` (None unless installed here)."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: ClusterSpec,
                 gpu_groups: tuple[GpuNodeGroupSpec, ...], ray: RaySpec, addons: list[ResolvedAddon],
                 bucket_name: str, storage_prefix: str, read_only_prefixes: tuple[str, ...],
                 kubectl_layer: Callable[[Construct, str], aws_lambda.ILayerVersion],
                 existing_gpu_groups: frozenset[str] = frozenset(), present_addons: list[ResolvedAddon] = (),
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        vpc = imported_vpc(self, spec)
        attributes = dict(cluster_name=spec.existing, vpc=vpc,
                          cluster_security_group_id=spec.cluster_security_group_id)
        # In the VPC whenever the private endpoint is on, as aws_eks_v2 places a new cluster's
        # handler (cluster.js): a public endpoint narrowed to CIDRs does not admit Lambda.
        in_vpc = spec.endpoint_access != "public"
        self.kubectl_provider = eks.KubectlProvider(
            self, "KubectlProvider", cluster=eks.Cluster.from_cluster_attributes(self, "Existing", **attributes),
            kubectl_layer=kubectl_layer(self, "KubectlLayer"),
            private_subnets=vpc.private_subnets if in_vpc else None)
        acknowledge_kubectl_provider(self.kubectl_provider)
        self.cluster = eks.Cluster.from_cluster_attributes(self, "Cluster", **attributes,
                                                           kubectl_provider=self.kubectl_provider)
        self.kubectl_access = eks.AccessEntry(
            self, "KubectlAccess", cluster=self.cluster, principal=self.kubectl_provider.role.role_arn,
            access_policies=[eks.AccessPolicy.from_access_policy_name(
                CLUSTER_ADMIN_POLICY, access_scope_type=eks.AccessScopeType.CLUSTER)])
        kubernetes_objects_after(self, self.kubectl_access.node.default_child)

        new_groups = [g for g in gpu_groups if not g.existing]
        self.gpu_node_groups: list[GpuNodeGroup] = []
        if new_groups:
            self.node_role = node_role(self, "NodeRole")
            efa = EfaSecurityGroup(self, "Efa", vpc=vpc).security_group
            gpu_subnets = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                             availability_zones=[spec.gpu_availability_zone])
            self.gpu_node_groups = [
                GpuNodeGroup(self, f"Gpu-{group.name}", cluster=self.cluster, group=group,
                             subnets=ec2.SubnetSelection(subnets=gpu_subnets.subnets),
                             security_group_ids=[spec.cluster_security_group_id, efa.security_group_id],
                             node_role=self.node_role, availability_zone=spec.gpu_availability_zone,
                             availability_zones=spec.availability_zones, exists=group.name in existing_gpu_groups,
                             private_subnet_ids=tuple(spec.private_subnet_ids))
                for group in new_groups]
        self.gpu_nodegroups = [g.nodegroup for g in self.gpu_node_groups]

        self.addons = ClusterAddons(self, "Addons", cluster=self.cluster, addons=addons, present=present_addons)
        identity = RayIdentity(
            self, "Ray", cluster=self.cluster, cluster_name=spec.existing, namespace=ray.namespace,
            service_account_name=ray.service_account, bucket_name=bucket_name, prefix=storage_prefix,
            pod_identity_agent=None, operator_namespace=ADDONS_BY_KEY["kuberay_operator"].namespace, raycluster_name=spec.name,
            read_only_prefixes=read_only_prefixes, tracking_server_arn=ray.mlflow_tracking_server_arn)
        if "kuberay_operator" in self.addons.charts:
            # Deleted before the operator, which alone removes the RayJobs' finalizers (cluster.py).
            identity.manifest.node.add_dependency(self.addons.charts["kuberay_operator"])
        self.addons.objects_after(ray.namespace, identity.manifest)
        self.autoscaler = None
        if "cluster_autoscaler" in self.addons.charts:
            self.autoscaler = AutoscalerIdentity(
                self, "ClusterAutoscaler", cluster=self.cluster, cluster_name=spec.existing,
                namespace="kube-system", service_account=CLUSTER_AUTOSCALER_SERVICE_ACCOUNT)
            self.addons.charts["cluster_autoscaler"].node.add_dependency(self.autoscaler.association)
        self.ray_identity = identity
        self.submitters = SubmitterAccess(
            self, "Submitters", cluster=self.cluster, cluster_name=spec.existing, namespace=ray.namespace,
            principals=spec.submitter_principal_arns, bucket_name=bucket_name, prefix=storage_prefix,
            code_prefix=CODE_PREFIX, run_role=identity.run_role)
        self.submitters.manifest.node.add_dependency(identity.manifest)  # the namespace first
        self.pod_role = identity.role
        self.service_account_name = identity.service_account_name
        self.service_account_namespace = identity.namespace

        CfnOutput(self, "ClusterName", value=spec.existing)
        CfnOutput(self, "UpdateKubeconfigCommand",
                  value=f"aws eks update-kubeconfig --name {spec.existing} --region {spec.region}")
        CfnOutput(self, "PodRoleArn", value=self.pod_role.role_arn,
                  description=f"Role of service account {ray.namespace}/{ray.service_account}")
        CfnOutput(self, "SmokeRoleArn", value=identity.smoke_role.role_arn,
                  description="Role of the pipeline's smoke runs (their folders only)")
        CfnOutput(self, "RunRoleArn", value=identity.run_role.role_arn,
                  description=f"Role of each run's own service account {ray.namespace}/<run> (submit associates it)")
