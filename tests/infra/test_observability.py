"""The monitoring add-ons in the cluster template: kube-prometheus-stack scraping the Ray pods, the
DCGM exporter on the GPU nodes, the dashboards as Grafana ConfigMaps; none of it when the spec's
``[observability] enabled = false`` (the alternative variant)."""
from __future__ import annotations

import json

from environment.contract import (
    GPU_TAINT_KEY, NODE_ROLE_LABEL, RAY_METRICS_PORT_NAME, RAY_NODE_TYPE_LABEL,
)
from environment.observability import DASHBOARD_LABEL, PROMETHEUS_RELEASE, dashboards

HELM = "Custom::AWSCDK-EKS-HelmChart"
MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"


def _charts(synth) -> dict[str, tuple[str, dict]]:
    return {r["Properties"]["Chart"]: (logical_id, r)  # charts from a repository (not the CRD charts)
            for logical_id, r in synth.resources("cluster", HELM).items() if "Chart" in r["Properties"]}


def _manifests(synth) -> dict[str, tuple[list, dict]]:
    out = {}
    for logical_id, resource in synth.resources("cluster", MANIFEST).items():
        body = resource["Properties"]["Manifest"]
        out[logical_id] = (json.loads(body) if isinstance(body, str) else body, resource)
    return out


def test_prometheus_stack_pinned_and_scraping_the_ray_head_and_workers(default):
    # given the default spec, kube-prometheus-stack is installed at its pinned version and its
    # Prometheus scrapes the metrics port of the Ray head and workers in the Ray namespace
    _, stack = _charts(default)["kube-prometheus-stack"]
    props = stack["Properties"]
    assert props["Version"] == default.env.versions.kube_prometheus_stack == "88.5.3"
    assert props["Repository"] == "https://prometheus-community.github.io/helm-charts"
    assert props["Release"] == PROMETHEUS_RELEASE
    values = json.loads(props["Values"])
    monitors = {m["selector"]["matchLabels"][RAY_NODE_TYPE_LABEL]: m for m in values["prometheus"]["additionalPodMonitors"]}
    assert set(monitors) == {"head", "worker"}
    for monitor in monitors.values():
        assert monitor["namespaceSelector"] == {"matchNames": [default.env.ray.namespace]}
        [endpoint] = monitor["podMetricsEndpoints"]
        assert endpoint["port"] == RAY_METRICS_PORT_NAME
    assert values["grafana"]["sidecar"]["dashboards"]["label"] == DASHBOARD_LABEL
    assert "adminPassword" not in values["grafana"]  # generated into a Secret, never in the template


def test_dcgm_exporter_on_gpu_nodes_found_by_the_stack(default):
    charts = _charts(default)
    stack_id, _ = charts["kube-prometheus-stack"]
    _, dcgm = charts["dcgm-exporter"]
    assert dcgm["Properties"]["Version"] == default.env.versions.dcgm_exporter == "4.8.2"
    assert dcgm["Properties"]["Repository"] == "https://nvidia.github.io/dcgm-exporter/helm-charts"
    values = json.loads(dcgm["Properties"]["Values"])
    assert [t["key"] for t in values["tolerations"]] == [GPU_TAINT_KEY]
    [term] = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": NODE_ROLE_LABEL, "operator": "In", "values": ["gpu"]}]
    # its ServiceMonitor carries the label the stack's Prometheus selects, and needs the stack's CRDs first
    assert values["serviceMonitor"]["additionalLabels"] == {"release": PROMETHEUS_RELEASE}
    assert stack_id in dcgm["DependsOn"]


def test_one_dcgm_host_engine_per_gpu_node_the_monitoring_agents(default):
    """The node monitoring agent's dcgm-server runs nv-hostengine on hostPort 5555
    (aws/eks-node-monitoring-agent charts/.../templates/dcgm-daemonset.yaml); dcgm-exporter
    connects to it on the node's address (its -r flag, DCGM_REMOTE_HOSTENGINE_INFO) instead of
    embedding a second engine (aws/containers-roadmap issue 2555), and both agent DaemonSets
    tolerate the GPU taint (issue 2567)."""
    _, dcgm = _charts(default)["dcgm-exporter"]
    env = {e["name"]: e for e in json.loads(dcgm["Properties"]["Values"])["extraEnv"]}
    assert env["NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["DCGM_REMOTE_HOSTENGINE_INFO"]["value"] == "$(NODE_IP):5555"
    [agent] = [r for r in default.resources("cluster", "AWS::EKS::Addon").values()
               if r["Properties"]["AddonName"] == "eks-node-monitoring-agent"]
    config = json.loads(agent["Properties"]["ConfigurationValues"])
    assert set(config) == {"nodeAgent", "dcgmAgent"}  # only keys the add-on's configuration schema accepts
    for part in ("nodeAgent", "dcgmAgent"):
        assert [t["key"] for t in config[part]["tolerations"]] == [GPU_TAINT_KEY]


def test_dashboards_applied_as_labelled_config_maps_after_the_stack(default):
    stack_id, _ = _charts(default)["kube-prometheus-stack"]
    [(objects, resource)] = [(m, r) for m, r in _manifests(default).values()
                             if any(o.get("kind") == "ConfigMap" and DASHBOARD_LABEL in o["metadata"].get("labels", {})
                                    for o in m)]
    assert stack_id in resource["DependsOn"]
    assert {name for o in objects for name in o["data"]} == set(dashboards())
    assert {o["metadata"]["namespace"] for o in objects} == {"monitoring"}


def test_switched_off_nothing_is_installed(alternative):
    assert not alternative.env.observability.enabled
    assert {"kube-prometheus-stack", "dcgm-exporter"}.isdisjoint(_charts(alternative))
    assert not [m for m, _ in _manifests(alternative).values()
                if any(DASHBOARD_LABEL in o.get("metadata", {}).get("labels", {}) for o in m)]
