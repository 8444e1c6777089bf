"""The Ray namespace, its service account, and the pod role behind it (EKS Pod Identity).

The pod role may read and write objects under ``s3://<bucket>/<prefix>/`` and list that prefix,
nothing else: no ``s3:*``, no ``Resource: *``.
"""
from __future__ import annotations

from aws_cdk import Stack, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

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


def checkpoint_policy_statements(bucket_arn: str, prefix: str) -> list[iam.PolicyStatement]:
    """Least privilege on one prefix of one bucket."""
    return [
        iam.PolicyStatement(
            sid="CheckpointObjects", actions=list(OBJECT_ACTIONS),
            resources=[f"{bucket_arn}/{prefix}/*"]),
        iam.PolicyStatement(
            sid="ListCheckpointPrefix", actions=["s3:ListBucket"], resources=[bucket_arn],
            # Listing is limited to the prefix itself and the keys below it.
            conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}),
    ]


class RayIdentity(Construct):
    """Namespace + service account + pod role. Exposes :attr:`role`, :attr:`service_account`,
    :attr:`namespace` and :attr:`service_account_name`."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster,
                 namespace: str, service_account_name: str, bucket_name: str, prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.namespace = namespace
        self.service_account_name = service_account_name
        self.namespace_manifest = cluster.add_manifest("RayNamespace", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"app.kubernetes.io/part-of": "raytrain-eks"}},
        })
        self.service_account = cluster.add_service_account(
            "RayServiceAccount", name=service_account_name, namespace=namespace,
            identity_type=eks.IdentityType.POD_IDENTITY)
        self.service_account.node.add_dependency(self.namespace_manifest)
        self.role = self.service_account.role
        # The bucket lives in the storage stack; its name is spec-derived, so the ARN is built
        # here instead of imported (no cross-stack export pins the stateful stack).
        partition = Stack.of(self).partition
        bucket_arn = f"arn:{partition}:s3:::{bucket_name}"
        self.policy = iam.Policy(self, "CheckpointAccess",
                                 statements=checkpoint_policy_statements(bucket_arn, prefix))
        self.policy.attach_to_role(self.role)
        acknowledge(
            self.policy, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket_name}/{prefix}/*]",
            "Checkpoint keys are created at run time under the run prefix; the wildcard "
            "is confined to that prefix of the one checkpoint bucket.")
