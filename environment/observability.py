"""What the monitoring add-ons scrape and show: the Ray pod monitors, the dashboards (JSON files
in ``dashboards/``, loaded into Grafana as labelled ConfigMaps) and every metric name the
dashboards may use from an exporter other than the job itself, with where it is documented.

Standard library only. The job's own metric names live in ``training/contract.py``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from environment.contract import RAY_CLUSTER_LABEL, RAY_METRICS_PORT_NAME, RAY_NODE_TYPE_LABEL

MONITORING_NAMESPACE = "monitoring"
PROMETHEUS_RELEASE = "kube-prometheus-stack"
"""Helm release of kube-prometheus-stack: its Prometheus selects monitors labelled
``release: <this>``; Grafana is ``svc/<this>-grafana``, Prometheus ``svc/<this>-prometheus``."""
DASHBOARD_LABEL = "grafana_dashboard"
"""ConfigMaps with this label (value "1") are loaded by Grafana's dashboard sidecar."""
DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "dashboards"
RAY_SCRAPE_INTERVAL = "15s"
"""Ray's agent refreshes its figures every 10 s (metrics_report_interval_ms); scraping more
often only repeats them."""


def _meta_label(label: str) -> str:
    """Prometheus's service-discovery name of a pod label (``ray.io/cluster`` ->
    ``__meta_kubernetes_pod_label_ray_io_cluster``)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def ray_pod_monitors(ray_namespace: str) -> list[dict[str, Any]]:
    """kube-prometheus-stack ``prometheus.additionalPodMonitors``: the Ray head and the Ray
    workers, on the metrics port KubeRay adds to every Ray pod (as KubeRay's own
    config/prometheus/podMonitor.yaml does, with the cluster name as ``ray_io_cluster``)."""
    relabel = [{"sourceLabels": [_meta_label(RAY_CLUSTER_LABEL)], "targetLabel": "ray_io_cluster"}]
    return [{
        "name": f"ray-{node_type}",
        "namespaceSelector": {"matchNames": [ray_namespace]},
        "selector": {"matchLabels": {RAY_NODE_TYPE_LABEL: node_type}},
        "podMetricsEndpoints": [{"port": RAY_METRICS_PORT_NAME, "interval": RAY_SCRAPE_INTERVAL,
                                 "relabelings": relabel}],
    } for node_type in ("head", "worker")]


def dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, str]:
    """``{file name: JSON text}`` of every dashboard in the repository (checked to parse)."""
    found = {}
    for path in sorted(directory.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        json.loads(text)  # a broken file fails the synth, not Grafana at run time
        found[path.name] = text
    return found


def dashboard_config_maps(namespace: str, directory: Path = DASHBOARDS_DIR) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard (the ~1 MiB object limit is per ConfigMap)."""
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"raytrain-dashboard-{Path(name).stem}", "namespace": namespace,
                     "labels": {DASHBOARD_LABEL: "1"}},
        "data": {name: text},
    } for name, text in dashboards(directory).items()]


# --- metric names other exporters document (the dashboards may use these and the job's own) ---
RAY_SYSTEM_METRICS = frozenset({
    "ray_tasks", "ray_actors", "ray_resources", "ray_object_store_memory", "ray_placement_groups",
    "ray_memory_manager_worker_eviction_total", "ray_node_cpu_utilization", "ray_node_cpu_count",
    "ray_node_gpus_utilization", "ray_node_gpus_available", "ray_node_disk_usage", "ray_node_disk_free",
    "ray_node_disk_write_iops", "ray_node_disk_io_write_speed", "ray_node_disk_read_iops",
    "ray_node_disk_io_read_speed", "ray_node_mem_available", "ray_node_mem_shared_bytes", "ray_node_mem_used",
    "ray_node_mem_total", "ray_component_uss_mb", "ray_component_cpu_percentage", "ray_node_gram_available",
    "ray_node_gram_used", "ray_node_gpu_power_milliwatts", "ray_node_gpu_temperature_celsius",
    "ray_node_network_received", "ray_node_network_sent", "ray_node_network_receive_speed",
    "ray_node_network_send_speed", "ray_cluster_active_nodes", "ray_cluster_failed_nodes",
    "ray_cluster_pending_nodes",
})
RAY_TRAIN_METRICS = frozenset({
    "ray_train_controller_state", "ray_train_worker_group_start_total_time_s",
    "ray_train_worker_group_shutdown_total_time_s", "ray_train_report_total_blocked_time_s",
    "ray_train_checkpoint_sync_total_time_s", "ray_train_checkpoint_transfer_total_time_s",
})
DCGM_METRICS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
})
NODE_EXPORTER_METRICS = frozenset({
    "node_infiniband_info", "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total", "node_infiniband_port_packets_received_total",
    "node_infiniband_port_packets_transmitted_total", "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
})

DOCUMENTED_METRICS: dict[str, frozenset[str]] = {
    "Ray 2.58.0 system metrics: doc/source/ray-observability/reference/system-metrics.rst and "
    "ray/dashboard/modules/reporter/reporter_agent.py": RAY_SYSTEM_METRICS,
    "Ray Train 2.58.0: ray/train/v2/_internal/metrics/controller.py and worker.py (ray_ prefix added by "
    "the exporter)": RAY_TRAIN_METRICS,
    "dcgm-exporter Helm chart 4.8.2 (tag 4.5.3-4.8.2): deployment/templates/metrics-configmap.yaml, the "
    "counters it enables": DCGM_METRICS,
    "node_exporter v1.12.1 (kube-prometheus-stack 88.5.3's prometheus-node-exporter 4.56.1): "
    "collector/infiniband_linux.go and netdev_common.go, both enabled by default": NODE_EXPORTER_METRICS,
}
"""Metric names the dashboards may use besides the job's own, by the source that documents them.
Only names verified in those sources; EFA's rdma_read/write byte counters are not among them
(no exporter pinned here reads them: see dashboards/efa.json)."""
