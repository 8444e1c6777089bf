"""The AWS identities of the cluster's workloads, through EKS Pod Identity: the Ray pods'
(:class:`RayIdentity`: the Ray namespace, its network policies, its service account, and the pod
role behind it) and cluster-autoscaler's (:class:`AutoscalerIdentity`: describe calls on
anything, scaling only of this cluster's Auto Scaling groups).

The pod role may read and write objects under ``s3://<bucket>/<prefix>/``, list the one bucket,
READ the spec's read-only prefixes (the code archive, base models, datasets), and
nothing else: no ``s3:*``, no ``Resource: *``; every statement holds only for a bucket owned by
this account (``s3:ResourceAccount``), so a same-named bucket elsewhere is never trusted.

The namespace comes with its default-deny ingress and the two admitted outside callers
(:func:`environment.network_policy.namespace_policies`), so no Ray pod ever runs unprotected.
"""
from __future__ import annotations

from aws_cdk import Stack, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment.contract import PART_OF, POD_SECURITY_LABELS
from environment.network_policy import namespace_policies
from infra.nag import acknowledge

# Object-level actions Ray Train's pyarrow S3 filesystem uses for checkpoints: read, write,
# delete (num_to_keep prunes old checkpoints), and the multipart calls big uploads need.
OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def same_account(account: str) -> dict:
    """The condition that pins S3 access to buckets owned by ``account``."""
    return {"StringEquals": {"s3:ResourceAccount": account}}


def checkpoint_policy_statements(bucket_arn: str, prefix: str, account: str,
                                 read_only_prefixes: tuple[str, ...] = ()) -> list[iam.PolicyStatement]:
    """Least privilege on one bucket of ``account``: read/write one prefix, read-only on a few others."""
    owned = same_account(account)
    statements = [
        iam.PolicyStatement(
            sid="CheckpointObjects", actions=list(OBJECT_ACTIONS),
            resources=[f"{bucket_arn}/{prefix}/*"], conditions=owned),
    ]
    if read_only_prefixes:
        # Ray's runtime-env agent downloads the code archive (working_dir) with the pod's
        # credentials; jobs read their base model and data from here. Never written by pods.
        statements.append(iam.PolicyStatement(
            sid="ReadJobInputs", actions=["s3:GetObject"],
            resources=[f"{bucket_arn}/{p}/*" for p in read_only_prefixes], conditions=owned))
    statements.append(iam.PolicyStatement(
        # On the one bucket, without an s3:prefix condition: HeadBucket (pyarrow's and Ray's
        # "does the bucket exist" check before every write) is authorised by s3:ListBucket and
        # sends no prefix, so a prefix-conditioned grant would deny it and every run would fail
        # at start. Listing reveals key names only; objects stay confined to the prefixes above.
        sid="ListCheckpointBucket", actions=["s3:ListBucket"], resources=[bucket_arn], conditions=owned))
    return statements


class RayIdentity(Construct):
    """Namespace + service account + pod role + Pod Identity association. Exposes :attr:`role`,
    :attr:`manifest`, :attr:`association`, :attr:`namespace` and :attr:`service_account_name`.

    Built from parts instead of ``cluster.add_service_account(identity_type=POD_IDENTITY)``:
    that helper also annotates the service account with the IRSA ``eks.amazonaws.com/role-arn``,
    and an IRSA web-identity token comes first in the AWS SDKs' credential chain, for a role
    whose trust policy (rightly) does not accept it.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster,
                 namespace: str, service_account_name: str, bucket_name: str, prefix: str,
                 pod_identity_agent: Construct | None, operator_namespace: str,
                 read_only_prefixes: tuple[str, ...] = ()) -> None:
        super().__init__(scope, construct_id)
        self.namespace = namespace
        self.service_account_name = service_account_name
        labels = dict(PART_OF)
        # One manifest, applied in order: the namespace, its network policies, then the service
        # account (no token automount: nothing in the Ray pods calls the Kubernetes API).
        self.network_policies = namespace_policies(namespace, operator_namespace)
        self.manifest = cluster.add_manifest(
            "RayNamespaceAndServiceAccount",
            # Pod Security: baseline enforced, restricted warned and audited.
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": namespace, "labels": {**labels, **POD_SECURITY_LABELS}}},
            *self.network_policies,
            {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
             "metadata": {"name": service_account_name, "namespace": namespace, "labels": labels}})
        self.role = iam.Role(
            self, "PodRole",
            description=f"Ray pods ({namespace}/{service_account_name}): checkpoints under one prefix, read-only inputs",
            # EKS Pod Identity assumes the role with session tags: both actions are required.
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")))
        self.association = eks.CfnPodIdentityAssociation(
            self, "Association", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=service_account_name, role_arn=self.role.role_arn)
        if pod_identity_agent is not None:  # None: an existing cluster's agent (verify checks it)
            self.association.node.add_dependency(pod_identity_agent)
        # The bucket lives in the storage stack; its name is spec-derived, so the ARN is built
        # here instead of imported (no cross-stack export pins the stateful stack).
        stack = Stack.of(self)
        bucket_arn = f"arn:{stack.partition}:s3:::{bucket_name}"
        self.policy = iam.Policy(self, "CheckpointAccess", statements=checkpoint_policy_statements(
            bucket_arn, prefix, stack.account, read_only_prefixes))
        self.policy.attach_to_role(self.role)
        acknowledge(
            self.policy, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/*]",
            "Checkpoint keys are created at run time under the run prefix; the wildcard "
            "is confined to that prefix of the one checkpoint bucket.")
        for ro in read_only_prefixes:
            acknowledge(
                self.policy, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{ro}/*]",
                f"Read-only (s3:GetObject) on the '{ro}/' inputs prefix of the one bucket: content-"
                "addressed code archives, base models and datasets named at run time.")


# cluster-autoscaler's AWS README ("Full Cluster Autoscaler Features Policy").
READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
WRITE_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")


class AutoscalerIdentity(Construct):
    """Role + Pod Identity association for ``kube-system/<service_account>``."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster, cluster_name: str,
                 namespace: str, service_account: str) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self, "Role", description=f"cluster-autoscaler of EKS cluster {cluster_name}",
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")))
        policy = iam.Policy(self, "Scaling", statements=[
            iam.PolicyStatement(sid="Describe", actions=list(READ_ACTIONS), resources=["*"]),
            # EKS tags every managed node group's ASG with k8s.io/cluster-autoscaler/<cluster>.
            iam.PolicyStatement(
                sid="ScaleThisClustersGroups", actions=list(WRITE_ACTIONS), resources=["*"],
                conditions={"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}}),
        ])
        policy.attach_to_role(self.role)
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "Describe calls have no resource-level permissions; the two scaling actions "
                    "are limited by condition to Auto Scaling groups tagged as this cluster's.")
        self.association = eks.CfnPodIdentityAssociation(
            self, "Association", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=service_account, role_arn=self.role.role_arn)
