"""The environment spec as frozen, typed dataclasses, with every derived value as a property.

Nothing here reads files (see :mod:`environment.loader`) or imports anything outside the standard
library: the CDK app, the cdk8s app, the CLI and the tests all derive from these objects, so a
fact typed once in environment.toml can never drift between them.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass, field

from environment.addons import ADDONS, ADDONS_BY_KEY
from environment.instances import INSTANCE_TYPES, InstanceType, pod_cpu, pod_memory_gib

from environment.contract import (  # noqa: F401  (re-exported for the node-group properties)
    CODE_PREFIX, EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, GPU_TAINT_VALUE, NODE_GROUP_LABEL, NODE_ROLE_LABEL,
)


class UnlockedImageWarning(UserWarning):
    """The image is referenced by a moving tag: runs are not reproducible until `lock`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    name: str
    """EKS cluster name."""
    account: str = ""
    """12-digit AWS account id; empty = synthesize account-agnostic (deploy takes it from credentials)."""
    region: str
    availability_zones: tuple[str, ...]
    """AZs of the VPC (EKS needs at least two)."""
    gpu_availability_zone: str
    """The ONE AZ of every GPU node: EFA traffic cannot cross AZs."""
    kubernetes_version: str = "1.36"
    endpoint_access: str = "public_and_private"
    """``public``, ``private`` or ``public_and_private``."""
    admin_principal_arns: tuple[str, ...] = ()
    """IAM principals given cluster-admin through EKS access entries."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemNodeGroupSpec:
    instance_type: str = "m7i.xlarge"
    nodes: int = 1

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def labels(self) -> dict[str, str]:
        return {NODE_ROLE_LABEL: "system", NODE_GROUP_LABEL: "system"}

    @property
    def pod_cpu(self) -> int:
        return pod_cpu(self.instance)

    @property
    def pod_memory_gib(self) -> int:
        return pod_memory_gib(self.instance)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuNodeGroupSpec:
    name: str = "gpu"
    instance_type: str = "g6.12xlarge"
    min_nodes: int = 2
    desired_nodes: int = 2
    max_nodes: int = 2
    root_volume_gib: int = 200
    capacity: str = "on-demand"
    """``on-demand``, ``capacity-reservation`` or ``capacity-block``."""
    capacity_reservation_id: str = ""
    """``cr-...`` for a capacity reservation or a capacity block; empty for on-demand."""

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def efa_per_node(self) -> int:
        return self.instance.max_efa_interfaces

    @property
    def world_size(self) -> int:
        """Ray Train workers at the desired size: one per GPU."""
        return self.desired_nodes * self.gpus_per_node

    @property
    def labels(self) -> dict[str, str]:
        labels = {NODE_ROLE_LABEL: "gpu", NODE_GROUP_LABEL: self.name}
        if self.efa_per_node:
            labels[EFA_LABEL] = "true"
        return labels

    @property
    def taints(self) -> tuple[dict[str, str], ...]:
        return ({"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT},)

    @property
    def pod_cpu(self) -> int:
        return pod_cpu(self.instance)

    @property
    def pod_memory_gib(self) -> int:
        return pod_memory_gib(self.instance)


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionsSpec:
    """Pinned Helm chart versions, one per add-on of :data:`environment.addons.ADDONS`
    (keyed by the add-on's ``key``); an add-on the file does not name keeps its default."""

    charts: tuple[tuple[str, str], ...] = ()
    """``(add-on key, version)`` pairs the file sets."""

    def chart(self, key: str) -> str:
        """The version of one add-on's chart."""
        return dict(self.charts).get(key) or ADDONS_BY_KEY[key].default_version

    def __getattr__(self, key: str) -> str:  # env.versions.kuberay_operator reads like a field
        if key in ADDONS_BY_KEY:
            return self.chart(key)
        raise AttributeError(key)


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageSpec:
    repository: str = "public.ecr.aws/deep-learning-containers/ray"
    tag: str = "train-ml-cuda-v1.1.0"
    digest: str = ""
    """``sha256:<64 hex>``, written by ``raytrain-eks lock``; empty = unlocked."""
    ray_version: str = "2.58.0"
    """The Ray inside the image: ``rayVersion`` of every RayCluster."""
    python_version: str = "3.13"

    @property
    def locked(self) -> bool:
        return bool(self.digest)

    @property
    def reference(self) -> str:
        """``repo@sha256:...`` once locked; ``repo:tag`` (with a loud warning) before."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        warnings.warn(
            f"image {self.repository}:{self.tag} is not locked to a digest: runs are not "
            "reproducible (run `raytrain-eks lock`)", UnlockedImageWarning, stacklevel=2)
        return f"{self.repository}:{self.tag}"

    @property
    def registry(self) -> str:
        return self.repository.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.repository.split("/", 1)[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageSpec:
    bucket_name: str = ""
    """Empty = ``raytrain-<cluster>-<account>-<region>`` (see Environment.bucket_name)."""
    prefix: str = "runs"
    """Key prefix of all runs; the pod role may touch nothing outside it."""
    noncurrent_version_days: int = 30
    """Days an overwritten or deleted object version is kept."""
    read_only_prefixes: tuple[str, ...] = (CODE_PREFIX, "models", "data")
    """Key prefixes the pods may READ (never write): ``code`` holds the training code archive
    every RayJob names as its working_dir (required); ``models`` and ``data`` the base models
    and datasets that job configs name as ``s3://{bucket}/...``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RaySpec:
    namespace: str = "ray"
    service_account: str = "ray-train"


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSpec:
    connection_arn: str = ""
    """CodeConnections ARN of the source repository; empty = no pipeline stack."""
    repository: str = ""
    """``owner/name`` of this project's repository."""
    branch: str = "main"
    watch_schedule: str = "rate(6 hours)"
    """How often the image watcher resolves the tag's digest (EventBridge schedule expression)."""

    @property
    def enabled(self) -> bool:
        return bool(self.connection_arn)


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservabilitySpec:
    """Prometheus, Grafana and the GPU exporter (add-ons of :mod:`environment.addons`)."""

    enabled: bool = True
    """Install the DCGM exporter and kube-prometheus-stack (Prometheus scraping the Ray pods,
    DCGM and the node exporter; Grafana with this repository's dashboards)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    cluster: ClusterSpec
    system_node_group: SystemNodeGroupSpec = field(default_factory=SystemNodeGroupSpec)
    gpu_node_groups: tuple[GpuNodeGroupSpec, ...]
    versions: VersionsSpec = field(default_factory=VersionsSpec)
    image: ImageSpec = field(default_factory=ImageSpec)
    storage: StorageSpec = field(default_factory=StorageSpec)
    ray: RaySpec = field(default_factory=RaySpec)
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)
    observability: ObservabilitySpec = field(default_factory=ObservabilitySpec)
    prices: tuple[tuple[str, float], ...] = ()
    """On-demand USD/hour overrides of the instance table's estimates."""
    source: str = "environment.toml"

    @property
    def primary_gpu_group(self) -> GpuNodeGroupSpec:
        """The group the RayCluster's GPU workers and the default jobs run on."""
        return self.gpu_node_groups[0]

    def gpu_group(self, name: str = "") -> GpuNodeGroupSpec:
        """The GPU group called ``name`` (empty: the primary group); KeyError if there is none."""
        if not name:
            return self.primary_gpu_group
        for group in self.gpu_node_groups:
            if group.name == name:
                return group
        raise KeyError(name)

    @property
    def world_size(self) -> int:
        return self.primary_gpu_group.world_size

    @property
    def total_gpus(self) -> int:
        return sum(g.world_size for g in self.gpu_node_groups)

    def hourly_price(self, instance_type: str) -> float:
        return dict(self.prices).get(instance_type, INSTANCE_TYPES[instance_type].hourly_usd_estimate)

    @property
    def hourly_cost_usd(self) -> float:
        """Estimated on-demand cost of all nodes at their desired size (EKS control plane,
        NAT and storage not included)."""
        cost = self.system_node_group.nodes * self.hourly_price(self.system_node_group.instance_type)
        for group in self.gpu_node_groups:
            cost += group.desired_nodes * self.hourly_price(group.instance_type)
        return round(cost, 4)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("source")
        # The versions in force, defaults included: naming a default explicitly changes nothing.
        out["versions"] = {addon.key: self.versions.chart(addon.key) for addon in ADDONS}
        return out

    @property
    def spec_hash(self) -> str:
        """sha256 of the parsed spec (comments and key order do not count), first 16 hex."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def bucket_name(self) -> str:
        """The checkpoint bucket's name: the spec's, or derived from cluster, account and region
        (S3 names are global; the account keeps two users' defaults apart)."""
        if self.storage.bucket_name:
            return self.storage.bucket_name
        parts = ["raytrain", self.cluster.name, self.cluster.account, self.cluster.region]
        return "-".join(p for p in parts if p)[:63]

    @property
    def storage_uri(self) -> str:
        """Ray Train storage of every run: ``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket_name}/{self.storage.prefix}"
