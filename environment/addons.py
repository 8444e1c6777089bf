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
from pathlib import Path
from typing import Any, Callable

from environment import observability, queueing
from environment.contract import EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, NODE_ROLE_LABEL

Environment = Any
"""An :class:`environment.model.Environment`. Not imported: the model reads this table (default
chart versions), so importing it back would make the two modules a cycle."""

CRD_DIR = Path(__file__).resolve().parents[1] / "charts" / "crds"
"""The pinned CRD files (one per chart version); the cdk8s bindings are generated from them too."""

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
class AddonPod:
    """What one add-on workload asks of a node, for the scheduling-fit check. Where it lands
    (node selector, affinity, tolerations) is read from the add-on's own values, never retyped."""

    name: str
    kind: str
    """``DaemonSet`` (one per matching node) or ``Deployment``."""
    cpu_m: int = 0
    """CPU request in millicores (0 = none set)."""
    memory_mi: int = 0
    """Memory request in MiB (0 = none set)."""
    replicas: int = 1
    source: str = ""
    """Where the figure comes from (the chart's values, or ours when the values set it)."""
    placement: dict[str, Any] | None = None
    """nodeSelector / affinity / tolerations when they are not the add-on's top-level values
    (a chart of several workloads); None = the add-on's values."""

    def requests(self) -> dict[str, str]:
        out = {}
        if self.cpu_m:
            out["cpu"] = f"{self.cpu_m}m"
        if self.memory_mi:
            out["memory"] = f"{self.memory_mi}Mi"
        return out

    def resources(self) -> dict[str, dict[str, str]]:
        """requests, and a memory limit equal to the request (the values we set ourselves)."""
        return {"requests": self.requests(), "limits": {"memory": f"{self.memory_mi}Mi"}}


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
    pods: tuple[AddonPod, ...] = ()
    """Its workloads and their requests (the scheduling-fit check places them)."""
    helm_timeout_s: int = 0
    """What Helm may wait (``--timeout``), sized to what the chart does at install; 0 = the
    chart only applies objects (no hook Jobs, no ``--wait``): :data:`APPLY_ONLY_TIMEOUT_S`."""
    crds: Callable[[str], Path] | None = None
    """chart version -> the file of the CRDs this chart ships, if Helm must UPGRADE them: Helm
    installs a chart's ``crds/`` once and never upgrades them, so these are installed as a chart
    of their own (as templates, which ``helm upgrade`` does upgrade) before the add-on."""
    wait: bool = False
    """Helm waits (``--wait``) for the chart's workloads to be ready before its ``manifests``
    are applied: a chart whose webhooks (``failurePolicy: Fail``) check those objects."""
    manifests_when_present: bool = False
    """Its ``manifests`` are this app's own objects, still needed where the cluster already
    runs the add-on (``cluster.present_addons``): Kueue's queue objects, which every queued
    RayJob names (environment/queueing.py)."""


# Helm's own default is 300 s (helm/helm v3 cmd/helm/install.go ``--timeout``); aws-cdk-lib
# 2.275's aws_eks_v2 HelmChart passes ``--timeout`` only when a timeout is set and never
# ``--wait`` by default, and its handler is a Lambda function of 15 minutes that also runs
# ``aws eks update-kubeconfig`` first: a Helm timeout must stay well below 900 s.
APPLY_ONLY_TIMEOUT_S = 180
"""A chart with no hook Jobs, installed without ``--wait``: Helm only sends objects to the API."""
HOOK_JOBS_TIMEOUT_S = 600
"""A chart whose install runs hook Jobs (Helm waits for each to complete): each Job's pod is
scheduled on a system node and pulls its image there before it runs; the nodes are already
Ready (every chart depends on the system node group and CoreDNS)."""
HANDLER_LIMIT_S = 900
"""The kubectl handler Lambda function's timeout (aws-cdk-lib 2.275 kubectl-provider.js)."""


def helm_timeout_s(addon: "HelmAddon") -> int:
    """The ``--timeout`` Helm gets for ``addon``'s release."""
    return addon.helm_timeout_s or APPLY_ONLY_TIMEOUT_S


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
        # One DCGM host engine per node: the node monitoring agent's (node_monitoring_configuration),
        # reached on the node's own address; dcgm-exporter's -r / DCGM_REMOTE_HOSTENGINE_INFO
        # (NVIDIA/dcgm-exporter cmd flags: "Connect to remote hostengine at <HOST>:<PORT>").
        "extraEnv": [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                     {"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": f"$(NODE_IP):{DCGM_HOSTENGINE_PORT}"}],
    }


def _prometheus_values(env: "Environment") -> dict[str, Any]:
    return {
        # No alert receivers are configured: an Alertmanager would only take system-node memory.
        "alertmanager": {"enabled": False},
        # Helm installs a chart's crds/ once and never upgrades them; this chart's own remedy
        # (its crds subchart, templates/upgrade/job.yaml) is a pre-install/pre-upgrade hook Job
        # that server-side applies the CRDs of this chart version, forcing ownership. It runs
        # on the system nodes; busybox pinned (the chart's default tag is "latest").
        "crds": {"upgradeJob": {"enabled": True, "nodeSelector": dict(SYSTEM_NODES),
                                "image": {"busybox": {"tag": PROMETHEUS_CRD_JOB_BUSYBOX}}}},
        "prometheus": {"additionalPodMonitors": observability.ray_pod_monitors(env.ray.namespace)},
        # Dashboards come as labelled ConfigMaps (the entry's manifests) through Grafana's
        # sidecar, which the chart enables by default; the admin password is generated into
        # a Secret (never in the template): see the README.
        "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": observability.DASHBOARD_LABEL,
                                               "labelValue": "1", "searchNamespace": "ALL"}}},
    }


PROMETHEUS_CRD_JOB_BUSYBOX = "1.37.0"
_NO_REQUESTS = "kube-prometheus-stack: no requests set by its values (none counted; not re-checked here)"
_PROMETHEUS_PODS = (
    AddonPod(name="prometheus", kind="Deployment", source=_NO_REQUESTS, placement={}),
    AddonPod(name="grafana", kind="Deployment", source=_NO_REQUESTS, placement={}),
    AddonPod(name="prometheus-operator", kind="Deployment", source=_NO_REQUESTS, placement={}),
    AddonPod(name="kube-state-metrics", kind="Deployment", source=_NO_REQUESTS, placement={}),
    AddonPod(name="prometheus-node-exporter", kind="DaemonSet", source=_NO_REQUESTS,
             placement={"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}),
)


KUBERAY_OPERATOR_POD = AddonPod(
    name="kuberay-operator", kind="Deployment", cpu_m=100, memory_mi=512,
    source="set in our values (the chart's own default is a 100m / 512Mi limit)")
CLUSTER_AUTOSCALER_POD = AddonPod(
    name="cluster-autoscaler", kind="Deployment", cpu_m=100, memory_mi=600,
    source="set in our values (the autoscaler FAQ's figure; the chart sets none)")
CLUSTER_AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"
# Cluster-autoscaler's minor version follows the Kubernetes minor; the chart's default image is
# v1.35.0. Versions without an entry keep the chart's default.
CLUSTER_AUTOSCALER_IMAGE_TAGS = {"1.36": "v1.36.1", "1.35": "v1.35.0"}
SCALE_UP_MINUTES = 6.0
"""GPU nodes start at zero for every job: cluster-autoscaler's reaction (~1 min), EC2 launch and
node join (~3 min), the DLC image pull onto the NVMe RAID0 (~2 min for ~20 GB). An estimate:
the preflight's cost line counts it, the RayJobs' preRunningDeadlineSeconds derive from it."""
SCALE_DOWN_UNNEEDED = "5m"
"""How long a GPU node must be idle before cluster-autoscaler removes it."""


CHART_DEFAULT_DELETED = None
"""A value that removes the chart's default for that key: Helm merges user values into the
chart's map by map and deletes a key whose user value is null (helm/helm v3
pkg/chartutil/coalesce.go ``coalesceValues``: "if the value is nil, delete the key")."""


def _kuberay_values(env: "Environment") -> dict[str, Any]:
    resources = KUBERAY_OPERATOR_POD.resources()
    # The chart's values.yaml sets limits {cpu: 100m, memory: 512Mi}: without this the merge keeps
    # its CPU limit, and the operator is throttled reconciling many pods at once.
    resources["limits"]["cpu"] = CHART_DEFAULT_DELETED
    return {"nodeSelector": dict(SYSTEM_NODES), "resources": resources}


KUEUE_POD = AddonPod(
    name="kueue-controller-manager", kind="Deployment", cpu_m=500, memory_mi=512,
    source="kueue chart v0.19.2 values.yaml controllerManager.manager.resources: requests 500m / 512Mi")


def _kueue_values(env: "Environment") -> dict[str, Any]:
    return queueing.kueue_values(env, env.versions.chart("kueue"), SYSTEM_NODES)


def _autoscaler_values(env: "Environment") -> dict[str, Any]:
    values: dict[str, Any] = {
        "cloudProvider": "aws",
        "awsRegion": env.cluster.region,
        # Discovers every ASG tagged k8s.io/cluster-autoscaler/<cluster> (EKS tags a managed
        # node group's ASG with it) and reads a 0-node managed group's labels and taints from
        # DescribeNodegroup, its EFA resource from the node group's node-template tags.
        "autoDiscovery": {"clusterName": env.cluster.eks_name},
        "rbac": {"serviceAccount": {"create": True, "name": CLUSTER_AUTOSCALER_SERVICE_ACCOUNT}},
        "extraArgs": {
            "expander": "least-waste",
            "balance-similar-node-groups": "false",
            "skip-nodes-with-local-storage": "false",
            "scale-down-unneeded-time": SCALE_DOWN_UNNEEDED,
            "scale-down-delay-after-add": SCALE_DOWN_UNNEEDED,
        },
        "nodeSelector": dict(SYSTEM_NODES),
        "resources": CLUSTER_AUTOSCALER_POD.resources(),
    }
    tag = CLUSTER_AUTOSCALER_IMAGE_TAGS.get(env.cluster.kubernetes_version)
    if tag:
        values["image"] = {"tag": tag}
    return values


ADDONS: tuple[HelmAddon, ...] = (
    HelmAddon(key="nvidia_device_plugin", repository="https://nvidia.github.io/k8s-device-plugin",
              chart="nvidia-device-plugin", release="nvidia-device-plugin", namespace="kube-system",
              default_version="0.20.0", values=_nvidia_values,
              pods=(AddonPod(name="nvidia-device-plugin", kind="DaemonSet",
                             source="chart values.yaml: resources {} (none)"),)),
    HelmAddon(key="efa_device_plugin", repository="https://aws.github.io/eks-charts",
              chart="aws-efa-k8s-device-plugin", release="aws-efa-k8s-device-plugin", namespace="kube-system",
              default_version="v0.5.32", enabled=lambda env: bool(_efa_instance_types(env)), values=_efa_values,
              pods=(AddonPod(name="aws-efa-k8s-device-plugin", kind="DaemonSet", cpu_m=10, memory_mi=20,
                             source="aws/eks-charts stable/aws-efa-k8s-device-plugin README: requests 10m / 20Mi"),)),
    HelmAddon(key="kuberay_operator", repository="https://ray-project.github.io/kuberay-helm/",
              chart="kuberay-operator", release="kuberay-operator", namespace="kuberay-system",
              default_version="1.7.0", create_namespace=True,
              values=_kuberay_values, pods=(KUBERAY_OPERATOR_POD,),
              crds=lambda version: CRD_DIR / f"kuberay-v{version}.yaml"),
    HelmAddon(key="kube_prometheus_stack", repository="https://prometheus-community.github.io/helm-charts",
              chart="kube-prometheus-stack", release=observability.PROMETHEUS_RELEASE,
              namespace=observability.MONITORING_NAMESPACE, default_version="88.5.3", create_namespace=True, enabled=_observed,
              # Three hook Jobs: the CRD upgrade Job and the admission webhook's certificate
              # Job (pre-install/pre-upgrade), the Job patching it into the webhooks (post-).
              helm_timeout_s=HOOK_JOBS_TIMEOUT_S,
              values=_prometheus_values, manifests=lambda env: observability.dashboard_config_maps(observability.MONITORING_NAMESPACE),
              pods=_PROMETHEUS_PODS),
    HelmAddon(key="dcgm_exporter", repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
              chart="dcgm-exporter", release="dcgm-exporter", namespace=observability.MONITORING_NAMESPACE, create_namespace=True,
              default_version="4.8.2", enabled=_observed, values=_dcgm_values,
              requires=("kube_prometheus_stack",),  # its ServiceMonitor needs the stack's CRDs
              pods=(AddonPod(name="dcgm-exporter", kind="DaemonSet",
                             source="no requests counted (the chart's defaults were not checked here)"),)),
    HelmAddon(key="cluster_autoscaler", repository="https://kubernetes.github.io/autoscaler",
              chart="cluster-autoscaler", release="cluster-autoscaler", namespace="kube-system",
              default_version="9.59.0", values=_autoscaler_values, pods=(CLUSTER_AUTOSCALER_POD,)),
    # The chart's CRDs are templates (charts/kueue/templates/crd/): Helm upgrades them with it.
    # --wait: its webhooks (failurePolicy Fail) must answer before the queue objects apply.
    HelmAddon(key="kueue", repository="oci://registry.k8s.io/kueue/charts/kueue", chart="kueue",
              release="kueue", namespace="kueue-system", create_namespace=True, default_version="0.19.2",
              enabled=lambda env: env.queueing.enabled, values=_kueue_values, requires=("kuberay_operator",),
              manifests=queueing.kueue_objects, manifests_when_present=True, pods=(KUEUE_POD,), wait=True,
              helm_timeout_s=HOOK_JOBS_TIMEOUT_S),
)
"""Every add-on, in install order."""

ADDONS_BY_KEY: dict[str, HelmAddon] = {addon.key: addon for addon in ADDONS}


def installed_addons(env: "Environment") -> tuple[HelmAddon, ...]:
    """The entries this environment installs: enabled, and not already present on an existing
    cluster (``cluster.present_addons``). Every row of the table is judged alike, so a new row
    is installed only where absent without a line of its own."""
    return tuple(a for a in ADDONS if a.enabled(env) and a.key not in env.cluster.present_addons)


def present_addons_with_objects(env: "Environment") -> tuple[HelmAddon, ...]:
    """The entries the existing cluster already runs whose objects this app still creates
    (:attr:`HelmAddon.manifests_when_present`)."""
    return tuple(a for a in ADDONS if a.enabled(env) and a.key in env.cluster.present_addons
                 and a.manifests_when_present)


TOLERATE_ALL = [{"operator": "Exists"}]

EKS_ADDON_PODS: tuple[tuple[AddonPod, dict[str, Any]], ...] = (
    # (workload, its placement) of the networking and identity add-ons EKS installs; the
    # DaemonSets tolerate every taint, CoreDNS none of ours.
    (AddonPod(name="aws-node", kind="DaemonSet", cpu_m=50,
              source="vpc-cni: 25m aws-node + 25m network-policy agent (aws-vpc-cni chart values)"),
     {"tolerations": TOLERATE_ALL}),
    (AddonPod(name="kube-proxy", kind="DaemonSet", cpu_m=100, source="EKS kube-proxy add-on: requests 100m"),
     {"tolerations": TOLERATE_ALL}),
    (AddonPod(name="eks-pod-identity-agent", kind="DaemonSet",
              source="EKS pod identity agent: no requests in its chart values (not re-checked here)"),
     {"tolerations": TOLERATE_ALL}),
    (AddonPod(name="coredns", kind="Deployment", cpu_m=100, memory_mi=70, replicas=2,
              source="EKS CoreDNS add-on: 2 replicas, requests 100m / 70Mi"),
     {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}),
)
"""The pods of EKS's own add-ons, with their placement (they are not in the Helm table)."""


# --- EKS managed add-ons (AWS::EKS::Addon): the cluster's networking, DNS and credentials -----

NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
"""The EKS add-on that watches each node (kernel, networking, storage, NVIDIA: XIDs, DCGM health)
and marks an unhealthy one in its conditions; the GPU groups' node auto repair replaces it."""
DCGM_HOSTENGINE_PORT = 5555
"""nv-hostengine's port: the agent's ``dcgm-server`` DaemonSet publishes it as a hostPort
(aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/templates/dcgm-daemonset.yaml)."""


def node_monitoring_configuration() -> dict[str, Any]:
    """The agent's configuration values, within the add-on's configuration schema
    (aws/eks-node-monitoring-agent charts/configuration.schema.json: ``nodeAgent`` and
    ``dcgmAgent`` each take ``tolerations``; nothing else is accepted). Both tolerate the GPU
    groups' taint: without it neither the agent nor its DCGM host engine runs on a GPU node
    (aws/containers-roadmap issue 2567), and the NVIDIA checks see nothing. The agent's
    ``dcgm-server`` is the node's ONE DCGM host engine: the dcgm-exporter add-on connects to it
    (:func:`_dcgm_values`) instead of starting its own embedded one, which would contend for the
    same GPUs (aws/containers-roadmap issue 2555)."""
    return {"nodeAgent": {"tolerations": [GPU_TOLERATION]}, "dcgmAgent": {"tolerations": [GPU_TOLERATION]}}

@dataclass(frozen=True, kw_only=True, slots=True)
class EksAddon:
    """One EKS managed add-on, pinned per Kubernetes minor version."""

    name: str
    """The EKS add-on name."""
    versions: dict[str, str]
    """Kubernetes minor version -> the add-on version pinned for it."""


# Versions from the EKS user guide's per-version tables (CoreDNS, kube-proxy). vpc-cni and the
# Pod Identity agent are not tied to a Kubernetes minor: the newest version the sources showed.
# Check before a bump: aws eks describe-addon-versions --kubernetes-version <v> --addon-name <n>
EKS_ADDONS: tuple[EksAddon, ...] = (
    EksAddon(name="eks-pod-identity-agent", versions={v: "v1.3.9-eksbuild.3" for v in ("1.33", "1.34", "1.35", "1.36")}),
    EksAddon(name="vpc-cni", versions={v: "v1.20.1-eksbuild.3" for v in ("1.33", "1.34", "1.35", "1.36")}),
    EksAddon(name="kube-proxy", versions={"1.33": "v1.33.10-eksbuild.13", "1.34": "v1.34.6-eksbuild.13",
                                          "1.35": "v1.35.3-eksbuild.13", "1.36": "v1.36.0-eksbuild.14"}),
    EksAddon(name="coredns", versions={"1.33": "v1.12.4-eksbuild.18", "1.34": "v1.13.2-eksbuild.11",
                                       "1.35": "v1.14.3-eksbuild.3", "1.36": "v1.14.3-eksbuild.3"}),
    # The chart's appVersion 1.6.2 (aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/
    # Chart.yaml); `raytrain-eks verify` checks the pin against DescribeAddonVersions before a deploy.
    EksAddon(name=NODE_MONITORING_AGENT, versions={v: "v1.6.2-eksbuild.1" for v in ("1.33", "1.34", "1.35", "1.36")}),
)
"""vpc-cni, CoreDNS, kube-proxy and the Pod Identity agent as EKS add-ons (never the
self-managed bootstrap copies): upgraded by EKS, each at a version pinned for the cluster."""

EKS_ADDONS_BY_NAME: dict[str, EksAddon] = {a.name: a for a in EKS_ADDONS}
