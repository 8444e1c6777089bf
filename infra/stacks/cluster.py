"""The EKS cluster: control plane, system and GPU managed node groups, the Helm add-ons, and
the Ray namespace/service account with its Pod Identity role; with ``image.pull_through_cache``
the ECR pull-through cache of the public registry (:class:`PullThroughCache`).

The pull-through cache rule maps ``<account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<name>`` to
``public.ecr.aws/<name>``: the first pull of an image ECR does not hold yet makes ECR create
the repository ``<prefix>/<name>`` and import the image from upstream, from AWS's addresses
(no NAT, no anonymous rate limit on the node's address); later pulls are served from the cache
(Amazon ECR User Guide, "Using pull through cache rules").

The pull is the node's (kubelet and containerd run with the node role): besides the pull
actions of AmazonEC2ContainerRegistryReadOnly it needs ``ecr:BatchImportUpstreamImage`` and,
while the repository does not exist yet, ``ecr:CreateRepository`` (Amazon ECR User Guide, "IAM
permissions required to sync an upstream registry with an Amazon ECR private registry"). Both
act on repositories, so both are granted on ``repository/<prefix>/*`` only: the nodes cannot
create or import anything outside the cache.

What CloudFormation does not own: the repositories the cache creates. ``cdk destroy`` removes
the rule and leaves them (and the cached image's storage) in the account; a redeploy with the
same prefix finds them again.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable

from aws_cdk import CfnOutput, RemovalPolicy, Stack, aws_ec2 as ec2, aws_ecr as ecr, aws_eks_v2 as eks, aws_iam as iam, \
    aws_lambda, aws_logs as logs
from constructs import Construct

from environment import GpuNodeGroupSpec
from environment.addons import ADDONS_BY_KEY, CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
from environment.contract import CODE_PREFIX, control_plane_log_group
from environment.image_source import CACHE_UPSTREAM_REGISTRY, CACHE_UPSTREAM_URL, PROMOTED_TAG_PREFIX
from environment.model import ClusterSpec, RaySpec, SystemNodeGroupSpec
from infra.constructs.cluster_addons import ClusterAddons, ManagedAddons, ResolvedAddon, kubernetes_objects_after
from infra.constructs.node_groups import EfaSecurityGroup, GpuNodeGroup, node_role, system_launch_template
from infra.constructs.pod_identity import AutoscalerIdentity, RayIdentity
from infra.constructs.submitter_access import SubmitterAccess
from infra.nag import ENDPOINT_RULE, OPEN_TO_ALL, acknowledge, acknowledge_cluster_findings
from infra.stacks.network import NetworkStack

ENDPOINT_ACCESS = {
    "public": eks.EndpointAccess.PUBLIC,
    "private": eks.EndpointAccess.PRIVATE,
    "public_and_private": eks.EndpointAccess.PUBLIC_AND_PRIVATE,
}


def endpoint_access(access: str, public_cidrs: tuple[str, ...]) -> eks.EndpointAccess:
    """The spec's endpoint access; a public endpoint admits only the spec's CIDRs.

    A public-only endpoint is left as it is: aws_eks_v2's ``onlyFrom`` refuses it (it cannot be
    narrowed there), and the spec admits it only open to every address, EKS's default."""
    chosen = ENDPOINT_ACCESS[access]
    return chosen if access in ("private", "public") else chosen.only_from(*public_cidrs)


ALL_CONTROL_PLANE_LOGS = [
    eks.ClusterLoggingTypes.API, eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR, eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


NODE_CACHE_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")
CACHE_KEEP_IMAGES = 3
"""Images each cache repository keeps besides the promoted ones (the candidates the pipeline's
smoke runs pulled); older ones expire (:class:`PullThroughCache`)."""
CACHE_KEEP_PROMOTED = 3
"""Promoted digests each cache repository keeps, newest first: the one the pipeline promotes now,
the one before it (a rollback's target) and one a promotion that lost its compare-and-swap tagged
(Promote tags before it swaps)."""


class PullThroughCache(Construct):
    """Exposes :attr:`rule` (the ``AWS::ECR::PullThroughCacheRule``) and :attr:`policy` (the
    node role's statements, scoped to the rule's prefix)."""

    def __init__(self, scope: Construct, construct_id: str, *, prefix: str, node_role: iam.IRole) -> None:
        super().__init__(scope, construct_id)
        # No credential: ECR Public needs none (a CredentialArn is only for registries that do).
        self.rule = ecr.CfnPullThroughCacheRule(
            self, "Rule", ecr_repository_prefix=prefix,
            upstream_registry_url=CACHE_UPSTREAM_URL, upstream_registry=CACHE_UPSTREAM_REGISTRY)
        # The cache makes one repository per upstream image on its first pull and keeps every
        # digest pulled through it (~20 GB each for the DLC), billed for ever. A creation template
        # for the prefix gives each such repository a lifecycle policy (ECR User Guide,
        # "Repository creation templates": appliedFor PULL_THROUGH_CACHE).
        # An expired digest does NOT come back on its next use: the cache fills by tag only
        # (raytrain_eks/pipeline/smoke.py warm_cache) and the tag has moved on by then. So the
        # digests the pipeline promotes (tagged PROMOTED_TAG_PREFIX by its Promote step) are
        # selected by a rule of a higher priority, and "an image that matches the tagging
        # requirements of a higher priority rule cannot be expired by a rule with a lower priority"
        # (ECR User Guide, "Lifecycle policy evaluation rules"); the `any` rule must come last
        # ("Lifecycle policy properties": rulePriority).
        self.lifecycle = ecr.CfnRepositoryCreationTemplate(
            self, "Lifecycle", prefix=prefix, applied_for=["PULL_THROUGH_CACHE"],
            description="raytrain-eks: keep the promoted digests and the newest cached images",
            lifecycle_policy=json.dumps({"rules": [{
                "rulePriority": 1, "description": f"keep the newest {CACHE_KEEP_PROMOTED} promoted digests",
                "selection": {"tagStatus": "tagged", "tagPrefixList": [PROMOTED_TAG_PREFIX],
                              "countType": "imageCountMoreThan", "countNumber": CACHE_KEEP_PROMOTED},
                "action": {"type": "expire"}}, {
                "rulePriority": 2, "description": f"keep the newest {CACHE_KEEP_IMAGES} other images",
                "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": CACHE_KEEP_IMAGES},
                "action": {"type": "expire"}}]}))
        repositories = Stack.of(self).format_arn(service="ecr", resource="repository", resource_name=f"{prefix}/*")
        self.policy = iam.Policy(self, "NodePolicy", roles=[node_role], statements=[iam.PolicyStatement(
            actions=list(NODE_CACHE_ACTIONS), resources=[repositories])])
        stack = Stack.of(self)
        finding = f"arn:<AWS::Partition>:ecr:{stack.region}:{stack.account}:repository/{prefix}/*"
        acknowledge(self.policy, f"AwsSolutions-IAM5[Resource::{finding}]",
                    f"The cache creates one repository per upstream image under the prefix {prefix}/ on the "
                    "first pull, so the node role may create and import only there (a pull-through cache "
                    "rule cannot name its repositories in advance).")


class ClusterStack(Stack):
    """Exposes :attr:`cluster`, :attr:`system_nodegroup`, :attr:`gpu_node_groups` (one
    :class:`GpuNodeGroup` per spec entry), :attr:`pod_role`, :attr:`service_account_name`,
    :attr:`service_account_namespace`, :attr:`addons`, :attr:`autoscaler`, :attr:`log_group` and
    :attr:`image_cache` (a :class:`PullThroughCache`, or None).

    Node groups have no fixed name: CloudFormation names them, so a change to a create-only
    property replaces a group instead of colliding with the name the old one still holds."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: ClusterSpec,
                 system: SystemNodeGroupSpec, gpu_groups: tuple[GpuNodeGroupSpec, ...],
                 ray: RaySpec, addons: list[ResolvedAddon], bucket_name: str, storage_prefix: str,
                 read_only_prefixes: tuple[str, ...],
                 kubectl_layer: Callable[[Construct, str], aws_lambda.ILayerVersion],
                 network: NetworkStack, existing_gpu_groups: frozenset[str] = frozenset(),
                 image_cache_prefix: str | None = None, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        layer = kubectl_layer(self, "KubectlLayer")
        private = spec.endpoint_access == "private"
        # EKS writes control-plane logs to this group; created first, with a retention, it is
        # not created by EKS without one.
        self.log_group = logs.LogGroup(
            self, "ControlPlaneLogs", log_group_name=control_plane_log_group(spec.name),
            removal_policy=RemovalPolicy.DESTROY)
        self.log_group.node.default_child.retention_in_days = retention_days(spec.log_retention_days)
        self.cluster = eks.Cluster(
            self, "Cluster",
            cluster_name=spec.name,
            version=eks.KubernetesVersion.of(spec.kubernetes_version),
            vpc=network.vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            endpoint_access=endpoint_access(spec.endpoint_access, spec.public_access_cidrs),
            # No self-managed vpc-cni/CoreDNS/kube-proxy: ManagedAddons installs them as EKS
            # add-ons (upgraded by EKS, the CNI on its own role).
            bootstrap_self_managed_addons=False,
            cluster_logging=ALL_CONTROL_PLANE_LOGS,
            # Managed node groups, not EKS Auto Mode (the default): EFA needs our launch template.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            output_config_command=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=layer,
                # aws-cdk-lib 2.275.0 aws-eks-v2/lib/cluster.ts puts the kubectl handler into the
                # cluster's private subnets whenever the private endpoint is on (private and
                # public_and_private alike); named here for a private-only endpoint, the same subnets.
                private_subnets=network.private_subnets.subnets if private else None),
        )
        self.cluster.node.add_dependency(self.log_group)
        acknowledge_cluster_findings(self.cluster)
        if spec.endpoint_access != "private" and OPEN_TO_ALL in spec.public_access_cidrs:
            # The spec chose it; an endpoint open to all that the spec did not ask for still fails.
            acknowledge(self.cluster, ENDPOINT_RULE,
                        f"cluster.public_access_cidrs lists {OPEN_TO_ALL} in the spec: the API endpoint is open "
                        "to every address by the user's choice (authentication still required); narrow it there.")
        # The people who run kubectl (build_app refuses an empty list): EKS's own "creator is
        # admin" names CloudFormation's execution role, not whoever ran cdk deploy.
        for arn in spec.admin_principal_arns:
            self.cluster.grant_cluster_admin(admin_construct_id(arn), arn)

        self.managed_addons = ManagedAddons(self, "ManagedAddons", cluster=self.cluster,
                                            kubernetes_version=spec.kubernetes_version)
        self.node_role = node_role(self, "NodeRole")
        # The image through the account's ECR (image.pull_through_cache): the rule, and the node
        # role's right to fill the cache under its prefix only.
        self.image_cache = (PullThroughCache(self, "ImageCache", prefix=image_cache_prefix, node_role=self.node_role)
                            if image_cache_prefix else None)
        # The disk is in the launch template (EKS refuses a disk size beside one).
        system_template = system_launch_template(self, "SystemLaunchTemplate", disk_gib=system.disk_gib)
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "SystemNodes", node_role=self.node_role,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(system.instance_type)],
            min_size=system.nodes, desired_size=system.nodes, max_size=system.nodes,
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            labels=system.labels,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=system_template.ref, version=system_template.attr_latest_version_number))

        self.efa_security_group = EfaSecurityGroup(self, "Efa", vpc=network.vpc).security_group
        # The cluster security group keeps node <-> control plane and pod traffic working;
        # an explicit interface list in a launch template replaces EKS's default groups.
        node_groups = [self.cluster.cluster_security_group_id,
                       self.efa_security_group.security_group_id]
        self.gpu_node_groups = [
            GpuNodeGroup(self, f"Gpu-{group.name}", cluster=self.cluster, group=group,
                         subnets=ec2.SubnetSelection(subnets=network.gpu_subnets.subnets),
                         security_group_ids=node_groups, node_role=self.node_role,
                         availability_zone=spec.gpu_availability_zone, availability_zones=spec.availability_zones,
                         exists=group.name in existing_gpu_groups)
            for group in gpu_groups
        ]
        self.gpu_nodegroups = [g.nodegroup for g in self.gpu_node_groups]
        # Nodes become Ready only with the CNI and kube-proxy running; CoreDNS needs a node.
        for nodegroup in [self.system_nodegroup, *self.gpu_nodegroups]:
            nodegroup.node.add_dependency(*self.managed_addons.before_nodes)
        self.managed_addons.addons["coredns"].node.add_dependency(self.system_nodegroup)
        # Every chart and manifest after both (aws_eks_v2 orders them after the control plane only).
        kubernetes_objects_after(self, self.system_nodegroup.node.default_child,
                                 self.managed_addons.addons["coredns"])

        identity = RayIdentity(
            self, "Ray", cluster=self.cluster, cluster_name=spec.name, namespace=ray.namespace,
            service_account_name=ray.service_account, bucket_name=bucket_name, prefix=storage_prefix,
            pod_identity_agent=self.managed_addons.pod_identity_agent,
            operator_namespace=ADDONS_BY_KEY["kuberay_operator"].namespace, raycluster_name=spec.name,
            read_only_prefixes=read_only_prefixes, tracking_server_arn=ray.mlflow_tracking_server_arn)
        self.autoscaler = AutoscalerIdentity(
            self, "ClusterAutoscaler", cluster=self.cluster, cluster_name=spec.name,
            namespace="kube-system", service_account=CLUSTER_AUTOSCALER_SERVICE_ACCOUNT)
        self.autoscaler.association.node.add_dependency(self.managed_addons.pod_identity_agent)
        self.addons = ClusterAddons(self, "Addons", cluster=self.cluster, addons=addons)
        # On delete, the Ray namespace goes while the operator still runs: KubeRay puts a finalizer
        # on every RayJob (ray.io/rayjob-finalizer) that only the operator removes, and kubectl
        # delete of a namespace holding one waits past the kubectl handler's 15 minutes.
        identity.manifest.node.add_dependency(self.addons.charts["kuberay_operator"])
        self.addons.objects_after(ray.namespace, identity.manifest)
        if "cluster_autoscaler" in self.addons.charts:
            self.addons.charts["cluster_autoscaler"].node.add_dependency(self.autoscaler.association)
        self.ray_identity = identity
        self.submitters = SubmitterAccess(
            self, "Submitters", cluster=self.cluster, cluster_name=spec.name, namespace=ray.namespace,
            principals=spec.submitter_principal_arns, bucket_name=bucket_name, prefix=storage_prefix,
            code_prefix=CODE_PREFIX, run_role=identity.run_role)
        self.submitters.manifest.node.add_dependency(identity.manifest)  # the namespace first
        self.pod_role = identity.role
        self.service_account_name = identity.service_account_name
        self.service_account_namespace = identity.namespace

        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
        CfnOutput(self, "UpdateKubeconfigCommand",
                  value=f"aws eks update-kubeconfig --name {spec.name} --region {spec.region}")
        CfnOutput(self, "PodRoleArn", value=self.pod_role.role_arn,
                  description=f"Role of service account {ray.namespace}/{ray.service_account}")
        CfnOutput(self, "SmokeRoleArn", value=identity.smoke_role.role_arn,
                  description="Role of the pipeline's smoke runs (their folders only)")
        CfnOutput(self, "RunRoleArn", value=identity.run_role.role_arn,
                  description=f"Role of each run's own service account {ray.namespace}/<run> (submit associates it)")


def admin_construct_id(arn: str) -> str:
    """A construct id that follows the principal, not its place in the list: an access entry's
    PrincipalArn is create-only, so with ids by position, reordering the list would replace each
    entry by one for a principal whose old entry still exists, and EKS refuses the duplicate."""
    return "Admin" + hashlib.sha256(arn.encode()).hexdigest()[:12]


# The values CloudWatch Logs accepts for RetentionInDays.
RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                  2557, 2922, 3288, 3653)


def retention_days(days: int) -> int:
    """The smallest retention CloudWatch accepts that keeps ``days``."""
    return next((d for d in RETENTION_DAYS if d >= days), RETENTION_DAYS[-1])
