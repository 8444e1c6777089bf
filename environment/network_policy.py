"""The NetworkPolicies of the Ray namespace, as plain Kubernetes JSON (standard library only).

Two layers, enforced by the EKS VPC CNI's network-policy agent (``enableNetworkPolicy``):

- :func:`namespace_policies`, installed by the CDK app with the namespace itself: every ingress
  to a pod of the namespace is denied unless a policy admits it; the KubeRay operator's
  namespace may reach the Ray heads' dashboard (it polls the job API of every RayJob); the
  monitoring namespace may scrape Ray's metrics port. Nothing else from outside the namespace.
- :func:`ray_cluster_policy`, one per Ray cluster (written by ``cdk8s synth`` beside the
  manifests): the pods carrying one value of :data:`RAY_PEER_LABEL` (its head, its workers,
  and the submitter of a job on it) may reach each other on every port. Ray's raylets, object
  managers and workers listen on ports chosen at run time, so ports cannot be listed here;
  the boundary is the cluster, not the port.

Only ingress is restricted: the pods need DNS, S3, STS and the image registry.
"""
from __future__ import annotations

from typing import Any

from environment.contract import PART_OF, RAY_DASHBOARD_PORT, RAY_METRICS_PORT, RAY_NODE_TYPE_LABEL, RAY_PEER_LABEL
from environment.observability import MONITORING_NAMESPACE

API_VERSION = "networking.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by Kubernetes on every namespace (immutable): selects a namespace by its name."""
RAY_HEAD_SELECTOR = {RAY_NODE_TYPE_LABEL: "head"}
"""KubeRay labels every head pod so (and no user label may override it)."""


def raycluster_label(cluster: str) -> str:
    """The Ray-cluster label value of the long-lived RayCluster ``cluster`` (at most 51 chars)."""
    return f"raycluster-{cluster}"


def rayjob_label(job: str) -> str:
    """The Ray-cluster label value of the cluster a RayJob brings (KubeRay names that cluster
    with a random suffix at run time, so the value is the job's, not the cluster's name)."""
    return f"rayjob-{job}"


def _policy(name: str, namespace: str, pod_selector: dict, ingress: list[dict]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(PART_OF)},
            "spec": {"podSelector": pod_selector, "policyTypes": ["Ingress"], "ingress": ingress}}


def _from_namespace(name: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def namespace_policies(namespace: str, operator_namespace: str) -> list[dict[str, Any]]:
    """Default-deny ingress, plus the two admitted callers from other namespaces."""
    any_ray_pod = {"matchExpressions": [{"key": RAY_PEER_LABEL, "operator": "Exists"}]}
    return [
        _policy("default-deny-ingress", namespace, {}, []),
        _policy("ray-dashboard-from-kuberay-operator", namespace, {"matchLabels": dict(RAY_HEAD_SELECTOR)},
                [{"from": [_from_namespace(operator_namespace)],
                  "ports": [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}]}]),
        _policy("ray-metrics-from-monitoring", namespace, any_ray_pod,
                [{"from": [_from_namespace(MONITORING_NAMESPACE)],
                  "ports": [{"protocol": "TCP", "port": RAY_METRICS_PORT}]}]),
    ]


def ray_cluster_policy(cluster_label: str, namespace: str) -> dict[str, Any]:
    """Pods of one Ray cluster (and its submitters) reach each other on every port; a peer
    selector without a namespace selector means this namespace only."""
    members = {"matchLabels": {RAY_PEER_LABEL: cluster_label}}
    return _policy(f"ray-{cluster_label}", namespace, members, [{"from": [{"podSelector": members}]}])
