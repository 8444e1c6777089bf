"""The EKS managed add-ons the cluster runs instead of the self-managed bootstrap copies: the
Pod Identity agent, the VPC CNI (with network-policy enforcement and a Pod Identity role of its
own), kube-proxy and CoreDNS, each pinned for the spec's Kubernetes version
(:data:`environment.addons.EKS_ADDONS`).

The CNI's EC2 network-interface permissions live on its own role, assumed only by the
``kube-system/aws-node`` service account through Pod Identity; the node role no longer carries
them, so a pod that reached the node's credentials could not use them.
"""
from __future__ import annotations

import json

from aws_cdk import aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from environment.addons import EKS_ADDONS_BY_NAME
from infra.nag import MANAGED, acknowledge

CNI_SERVICE_ACCOUNT = "aws-node"
CNI_POLICY = "AmazonEKS_CNI_Policy"
CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}
"""The VPC CNI's network-policy agent enforces NetworkPolicies (the value is the STRING "true")."""


class ManagedAddons(Construct):
    """Exposes :attr:`addons` (EKS add-on name -> ``CfnAddon``), :attr:`pod_identity_agent`,
    :attr:`cni_role`, and :attr:`before_nodes` (the add-ons nodes need to become Ready)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster,
                 kubernetes_version: str) -> None:
        super().__init__(scope, construct_id)
        self.cni_role = iam.Role(
            self, "CniRole", description="VPC CNI (kube-system/aws-node) through EKS Pod Identity",
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(CNI_POLICY)])
        acknowledge(self.cni_role, MANAGED.format(CNI_POLICY),
                    "The AWS managed policy EKS documents for the VPC CNI (ENI and IP assignment); "
                    "on a role only kube-system/aws-node can assume, no longer on the node role.")
        extra = {
            "vpc-cni": dict(configuration_values=json.dumps(CNI_CONFIGURATION),
                            pod_identity_associations=[eks.CfnAddon.PodIdentityAssociationProperty(
                                role_arn=self.cni_role.role_arn, service_account=CNI_SERVICE_ACCOUNT)]),
        }
        self.addons: dict[str, eks.CfnAddon] = {}
        for name in ("eks-pod-identity-agent", "vpc-cni", "kube-proxy", "coredns"):
            self.addons[name] = eks.CfnAddon(
                self, name, cluster_name=cluster.cluster_name, addon_name=name,
                addon_version=EKS_ADDONS_BY_NAME[name].versions[kubernetes_version],
                # Take over whatever a previous install left (e.g. the bootstrap copies).
                resolve_conflicts="OVERWRITE", **extra.get(name, {}))
        # The CNI's credentials come through the agent's association.
        self.addons["vpc-cni"].node.add_dependency(self.addons["eks-pod-identity-agent"])
        self.pod_identity_agent = self.addons["eks-pod-identity-agent"]
        self.before_nodes = [self.addons[n] for n in ("eks-pod-identity-agent", "vpc-cni", "kube-proxy")]
        """DaemonSets a node needs to become Ready; CoreDNS (a Deployment) needs nodes instead."""
