"""The Helm charts the cluster needs for GPU training: NVIDIA and EFA device plugins on the GPU
nodes, the KubeRay operator on the system nodes. Versions come from the spec's [versions]."""
from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from environment import Environment
from environment.contract import EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, NODE_ROLE_LABEL

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EKS_CHARTS_REPOSITORY = "https://aws.github.io/eks-charts"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"
KUBERAY_NAMESPACE = "kuberay-system"

GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def _node_affinity(key: str, value: str) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]}]}]}}}


class ClusterAddons(Construct):
    """Installs the three charts; exposes them as :attr:`nvidia_device_plugin`,
    :attr:`efa_device_plugin` and :attr:`kuberay_operator`."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster,
                 env_spec: Environment) -> None:
        super().__init__(scope, construct_id)
        versions = env_spec.versions
        self.nvidia_device_plugin = eks.HelmChart(
            self, "NvidiaDevicePlugin", cluster=cluster,
            repository=NVIDIA_REPOSITORY, chart="nvidia-device-plugin",
            release="nvidia-device-plugin", version=versions.nvidia_device_plugin,
            namespace="kube-system",
            values={
                # The chart's default affinity needs Node Feature Discovery labels that a plain
                # EKS node does not carry: select our own GPU role label instead.
                "affinity": _node_affinity(NODE_ROLE_LABEL, "gpu"),
                "tolerations": [GPU_TOLERATION],
            })
        efa_types = sorted({g.instance_type for g in env_spec.gpu_node_groups if g.efa_per_node})
        self.efa_device_plugin = eks.HelmChart(
            self, "EfaDevicePlugin", cluster=cluster,
            repository=EKS_CHARTS_REPOSITORY, chart="aws-efa-k8s-device-plugin",
            release="aws-efa-k8s-device-plugin", version=versions.efa_device_plugin,
            namespace="kube-system",
            values={
                "nodeSelector": {EFA_LABEL: "true"},
                "tolerations": [GPU_TOLERATION],
                # The chart also pins an instance-type allow-list; make it exactly ours so a
                # type newer than the chart's list is not silently skipped.
                "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"],
                                            "values": efa_types},
            })
        self.kuberay_operator = eks.HelmChart(
            self, "KubeRayOperator", cluster=cluster,
            repository=KUBERAY_REPOSITORY, chart="kuberay-operator",
            release="kuberay-operator", version=versions.kuberay_operator,
            namespace=KUBERAY_NAMESPACE, create_namespace=True,
            values={"nodeSelector": {NODE_ROLE_LABEL: "system"}})
