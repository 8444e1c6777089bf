"""The Helm add-ons the cluster runs: ONE table entry per chart.

An entry holds everything about one add-on: where its chart comes from, the release and
namespace, the pinned default version (overridable in environment.toml's ``[versions]`` under
the entry's ``key``), when it is installed, and its values as a function of the environment.
The CDK app installs every enabled entry; the spec loader accepts exactly these keys under
``[versions]``. Adding an add-on is one entry here and nothing else.

Standard library only (the values are plain dictionaries).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from environment import observability
from environment.contract import EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, NODE_ROLE_LABEL

if TYPE_CHECKING:  # the model imports this table; only type checkers need the reverse
    from environment.model import Environment

GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}
SYSTEM_NODES = {NODE_ROLE_LABEL: "system"}


def node_affinity(key: str, value: str) -> dict[str, Any]:
    """A required node affinity on one label value."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}}


def _always(env: "Environment") -> bool:
    return True


def _no_values(env: "Environment") -> dict[str, Any]:
    return {}


def _no_manifests(env: "Environment") -> list[dict[str, Any]]:
    return []


@dataclass(frozen=True, kw_only=True, slots=True)
class HelmAddon:
    """One Helm chart the cluster runs."""

    key: str
    """Its name under environment.toml's ``[versions]`` and its construct id."""
    repository: str
    chart: str
    release: str
    namespace: str
    default_version: str
    """The pinned chart version used when ``[versions]`` does not name one."""
    create_namespace: bool = False
    enabled: Callable[["Environment"], bool] = field(default=_always)
    """Whether this environment installs it (e.g. the EFA plugin only where a group has EFA)."""
    values: Callable[["Environment"], dict[str, Any]] = field(default=_no_values)
    """The chart values, derived from the environment."""
    requires: tuple[str, ...] = ()
    """Keys of add-ons installed before this one (e.g. the CRDs its objects use)."""
    manifests: Callable[["Environment"], list[dict[str, Any]]] = field(default=_no_manifests)
    """Kubernetes objects applied after the chart (e.g. dashboards as ConfigMaps: the chart's
    own extra-objects value runs every string through Helm's template engine, which breaks
    Grafana's ``{{label}}`` legends)."""


def _nvidia_values(env: "Environment") -> dict[str, Any]:
    # The chart's default affinity needs Node Feature Discovery labels that a plain EKS node
    # does not carry: select our own GPU role label instead.
    return {"affinity": node_affinity(NODE_ROLE_LABEL, "gpu"), "tolerations": [GPU_TOLERATION]}


def _efa_instance_types(env: "Environment") -> list[str]:
    return sorted({g.instance_type for g in env.gpu_node_groups if g.efa_per_node})


def _efa_values(env: "Environment") -> dict[str, Any]:
    return {
        "nodeSelector": {EFA_LABEL: "true"},
        "tolerations": [GPU_TOLERATION],
        # The chart also pins an instance-type allow-list; make it exactly ours so a type newer
        # than the chart's list is not silently skipped.
        "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"],
                                    "values": _efa_instance_types(env)},
    }


def _observed(env: "Environment") -> bool:
    return env.observability.enabled


def _dcgm_values(env: "Environment") -> dict[str, Any]:
    return {
        # On the GPU nodes only (the chart's default tolerates only control-plane nodes).
        "affinity": node_affinity(NODE_ROLE_LABEL, "gpu"), "tolerations": [GPU_TOLERATION],
        # Found by the Prometheus of the stack (it selects monitors labelled with its release);
        # honorLabels keeps the exporter's pod/namespace labels: the Ray pod holding each GPU.
        "serviceMonitor": {"enabled": True, "honorLabels": True,
                           "additionalLabels": {"release": observability.PROMETHEUS_RELEASE}},
    }


def _prometheus_values(env: "Environment") -> dict[str, Any]:
    return {
        # No alert receivers are configured: an Alertmanager would only take system-node memory.
        "alertmanager": {"enabled": False},
        "prometheus": {"additionalPodMonitors": observability.ray_pod_monitors(env.ray.namespace)},
        # Dashboards come as labelled ConfigMaps (the entry's manifests) through Grafana's
        # sidecar, which the chart enables by default; the admin password is generated into
        # a Secret (never in the template): see the README.
        "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": observability.DASHBOARD_LABEL,
                                               "labelValue": "1", "searchNamespace": "ALL"}}},
    }


ADDONS: tuple[HelmAddon, ...] = (
    HelmAddon(key="nvidia_device_plugin", repository="https://nvidia.github.io/k8s-device-plugin",
              chart="nvidia-device-plugin", release="nvidia-device-plugin", namespace="kube-system",
              default_version="0.20.0", values=_nvidia_values),
    HelmAddon(key="efa_device_plugin", repository="https://aws.github.io/eks-charts",
              chart="aws-efa-k8s-device-plugin", release="aws-efa-k8s-device-plugin", namespace="kube-system",
              default_version="v0.5.32", enabled=lambda env: bool(_efa_instance_types(env)), values=_efa_values),
    HelmAddon(key="kuberay_operator", repository="https://ray-project.github.io/kuberay-helm/",
              chart="kuberay-operator", release="kuberay-operator", namespace="kuberay-system",
              default_version="1.7.0", create_namespace=True,
              values=lambda env: {"nodeSelector": dict(SYSTEM_NODES)}),
    HelmAddon(key="kube_prometheus_stack", repository="https://prometheus-community.github.io/helm-charts",
              chart="kube-prometheus-stack", release=observability.PROMETHEUS_RELEASE,
              namespace=observability.MONITORING_NAMESPACE, default_version="88.5.3", create_namespace=True, enabled=_observed,
              values=_prometheus_values, manifests=lambda env: observability.dashboard_config_maps(observability.MONITORING_NAMESPACE)),
    HelmAddon(key="dcgm_exporter", repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
              chart="dcgm-exporter", release="dcgm-exporter", namespace=observability.MONITORING_NAMESPACE, create_namespace=True,
              default_version="4.8.2", enabled=_observed, values=_dcgm_values,
              requires=("kube_prometheus_stack",)),  # its ServiceMonitor needs the stack's CRDs
)
"""Every add-on, in install order."""

ADDONS_BY_KEY: dict[str, HelmAddon] = {addon.key: addon for addon in ADDONS}
