"""The values each chart RUNS with: ours merged into the chart's defaults the way Helm merges them.

Oracle: helm/helm v3 pkg/chartutil/coalesce.go ``coalesceValues`` / ``coalesceTablesFullKey``:
user values are merged into the chart's values map by map; a user value of null deletes the
chart's key; any other user value replaces the chart's. Ported below.

Chart defaults: ray-project/kuberay tag v1.7.0 helm-chart/kuberay-operator/values.yaml
(``resources: {limits: {cpu: 100m, memory: 512Mi}, requests: {cpu: 100m, memory: 512Mi}}``).
"""
from __future__ import annotations

import copy
import json

KUBERAY_CHART_RESOURCES = {"limits": {"cpu": "100m", "memory": "512Mi"},
                           "requests": {"cpu": "100m", "memory": "512Mi"}}


def coalesce(chart: dict, user: dict) -> dict:
    """Helm's merge of ``user`` values over a chart's ``chart`` values."""
    out = copy.deepcopy(chart)
    for key, value in user.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def test_the_oracle_merges_maps_and_deletes_on_null():
    assert coalesce({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}}
    assert coalesce({"a": {"x": 1, "y": 2}}, {"a": {"x": None}}) == {"a": {"y": 2}}


def test_the_kuberay_operator_runs_without_a_cpu_limit(default):
    [chart] = [r["Properties"] for r in default.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
               if r["Properties"].get("Chart") == "kuberay-operator"]
    values = json.loads(chart["Values"]) if isinstance(chart["Values"], str) else None
    assert values is not None, "values are a literal JSON string in the template"
    effective = coalesce({"resources": KUBERAY_CHART_RESOURCES}, values)["resources"]
    assert "cpu" not in effective["limits"]
    assert effective["limits"]["memory"] == effective["requests"]["memory"] == "512Mi"
    assert effective["requests"]["cpu"] == "100m"


# prometheus-community/helm-charts tag kube-prometheus-stack-88.5.3 charts/kube-prometheus-stack/values.yaml
PROMETHEUS_CHART_CRDS = {"enabled": True, "upgradeJob": {"enabled": False, "forceConflicts": True,
                                                         "image": {"busybox": {"tag": "latest"}}}}


def test_the_monitoring_stack_upgrades_its_crds_with_each_release(variant):
    charts = [r["Properties"] for r in variant.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
              if r["Properties"].get("Chart") == "kube-prometheus-stack"]
    if not variant.env.observability.enabled:
        assert charts == []
        return
    [chart] = charts
    crds = coalesce({"crds": PROMETHEUS_CHART_CRDS}, json.loads(chart["Values"]))["crds"]
    # the chart's pre-install/pre-upgrade Job applies the version's CRDs server-side, forcing ownership
    assert crds["enabled"] and crds["upgradeJob"]["enabled"] and crds["upgradeJob"]["forceConflicts"]
    assert crds["upgradeJob"]["image"]["busybox"]["tag"] != "latest"
    assert crds["upgradeJob"]["nodeSelector"] == {"raytrain.io/role": "system"}
