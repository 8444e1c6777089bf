"""Every Kubernetes object of the cluster stack waits for the nodes and cluster DNS.

aws-cdk-lib 2.275's aws_eks_v2 makes each ``HelmChart``, ``KubernetesManifest``,
``KubernetesPatch`` and ``KubernetesObjectValue`` depend only on the cluster's kubectl barrier
(``Cluster._dependOnKubectlBarrier``, aws-eks-v2/lib/cluster.js): the control plane is up, but
no node may exist yet. A chart whose install runs hook Jobs (kube-prometheus-stack) then waits
for a pod that cannot be scheduled until Helm's timeout, the custom resource fails and the whole
cluster stack rolls back. So every such custom resource also depends on the system node group
(its nodes are Ready when CloudFormation sees it ACTIVE) and on the CoreDNS add-on (a hook Job
or webhook that resolves a service name needs it).

An aspect rather than a list: it also catches objects added later (``cluster.add_manifest`` in
any construct of the stack), whoever adds them.
"""
from __future__ import annotations

import jsii
from aws_cdk import Aspects, CfnResource, IAspect, Stack
from constructs import IConstruct

KUBERNETES_RESOURCE_TYPES = frozenset({
    "Custom::AWSCDK-EKS-HelmChart",
    "Custom::AWSCDK-EKS-KubernetesResource",
    "Custom::AWSCDK-EKS-KubernetesPatch",
    "Custom::AWSCDK-EKS-KubernetesObjectValue",
})
"""The custom-resource types aws_eks_v2's kubectl provider handles (one per construct class)."""


@jsii.implements(IAspect)
class _AfterNodes:
    def __init__(self, prerequisites: list[CfnResource]) -> None:
        self._prerequisites = prerequisites

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, CfnResource) and node.cfn_resource_type in KUBERNETES_RESOURCE_TYPES:
            for prerequisite in self._prerequisites:
                node.node.add_dependency(prerequisite)


def kubernetes_objects_after(stack: Stack, *prerequisites: CfnResource) -> None:
    """Make every Kubernetes custom resource in ``stack`` depend on each of ``prerequisites``."""
    Aspects.of(stack).add(_AfterNodes(list(prerequisites)))
