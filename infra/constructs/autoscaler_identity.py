"""The IAM role of cluster-autoscaler (EKS Pod Identity): describe calls on anything, scaling
only of this cluster's Auto Scaling groups."""
from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from infra.nag import acknowledge

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
