"""The environment spec as frozen, typed dataclasses, with every derived value as a property.

Nothing here reads files (see :mod:`environment.loader`) or imports anything outside the standard
library: the CDK app, the cdk8s app, the CLI and the tests all derive from these objects, so a
fact typed once in environment.toml can never drift between them.
"""
from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import asdict, dataclass, field

from environment.addons import ADDONS, ADDONS_BY_KEY
from environment.contract import (  # noqa: F401  (re-exported for the node-group properties)
    CODE_PREFIX, DIGEST_PATTERN, EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, GPU_TAINT_VALUE, KUBERNETES_VERSIONS,
    NODE_GROUP_LABEL, NODE_ROLE_LABEL,
)
from environment.errors import FieldError
from environment.instances import INSTANCE_TYPES, InstanceType, known_cpu_types, known_gpu_types, pod_cpu, pod_memory_gib
from environment.regions import AWS_REGIONS
from environment.rules import bucket_name_problem, schedule_problem, tag_ray_problem

ENDPOINT_ACCESS = ("public", "private", "public_and_private")
CAPACITY = ("on-demand", "capacity-reservation", "capacity-block")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_SEMVER = re.compile(r"v?\d+\.\d+\.\d+")


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

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.name) or len(self.name) > 40:
            raise FieldError("name", self.name, "is not a lower-case name of 1-40 letters, digits and '-'")
        if self.account and not re.fullmatch(r"\d{12}", self.account):
            raise FieldError("account", self.account, "is not a 12-digit AWS account id (or empty)")
        if self.region not in AWS_REGIONS:
            close = [r for r in AWS_REGIONS if r.rsplit("-", 1)[0] == self.region.rsplit("-", 1)[0]]
            hint = f"; in that area: {', '.join(close)}" if close else " (e.g. us-east-1)"
            raise FieldError("region", self.region, f"is not an AWS region name{hint}")
        zones = self.availability_zones
        if len(zones) < 2 or len(set(zones)) != len(zones):
            raise FieldError("availability_zones", list(zones), "must list at least two distinct AZs (EKS requires two)")
        for i, az in enumerate(zones):
            if not re.fullmatch(re.escape(self.region) + r"[a-z]", az):
                raise FieldError(f"availability_zones[{i}]", az, f"is not an AZ of region {self.region} (e.g. {self.region}a)")
        if self.gpu_availability_zone not in zones:
            raise FieldError("gpu_availability_zone", self.gpu_availability_zone,
                             f"must be one of cluster.availability_zones ({', '.join(zones)})")
        if self.kubernetes_version not in KUBERNETES_VERSIONS:
            raise FieldError("kubernetes_version", self.kubernetes_version,
                             f"is not supported by this CDK app (supported: {', '.join(KUBERNETES_VERSIONS)}; "
                             "each needs its kubectl layer)")
        if self.endpoint_access not in ENDPOINT_ACCESS:
            raise FieldError("endpoint_access", self.endpoint_access, f"is not allowed (allowed: {', '.join(ENDPOINT_ACCESS)})")
        for i, arn in enumerate(self.admin_principal_arns):
            if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", arn):
                raise FieldError(f"admin_principal_arns[{i}]", arn, "is not an IAM role or user ARN")


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemNodeGroupSpec:
    instance_type: str = "m7i.xlarge"
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.instance_type not in known_cpu_types():
            raise FieldError("instance_type", self.instance_type,
                             f"is not a known CPU instance type (known: {', '.join(known_cpu_types())})")
        if not 1 <= self.nodes <= 10:
            raise FieldError("nodes", self.nodes, "must be between 1 and 10")

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

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.name):
            raise FieldError("name", self.name, "must be a unique lower-case name (letters, digits, '-')")
        if self.instance_type not in known_gpu_types():
            hint = " (a CPU type: use system_node_group)" if self.instance_type in INSTANCE_TYPES else ""
            raise FieldError("instance_type", self.instance_type,
                             f"is not a known GPU instance type{hint} (known: {', '.join(known_gpu_types())})")
        if self.min_nodes < 0:
            raise FieldError("min_nodes", self.min_nodes, "must be >= 0")
        if self.max_nodes < 1:
            raise FieldError("max_nodes", self.max_nodes, "must be >= 1")
        if not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise FieldError("desired_nodes", self.desired_nodes,
                             f"must be between min_nodes ({self.min_nodes}) and max_nodes ({self.max_nodes})")
        if not 50 <= self.root_volume_gib <= 16384:
            raise FieldError("root_volume_gib", self.root_volume_gib,
                             "must be between 50 and 16384 (the DLC image alone is tens of GB)")
        if self.capacity not in CAPACITY:
            raise FieldError("capacity", self.capacity, f"is not allowed (allowed: {', '.join(CAPACITY)})")
        if self.capacity == "on-demand" and self.capacity_reservation_id:
            raise FieldError("capacity_reservation_id", self.capacity_reservation_id,
                             "must be empty for on-demand capacity (set capacity to capacity-reservation or capacity-block)")
        if self.capacity != "on-demand" and not re.fullmatch(r"cr-[0-9a-f]{17}", self.capacity_reservation_id):
            raise FieldError("capacity_reservation_id", self.capacity_reservation_id,
                             f"is not a capacity reservation id (cr- and 17 hex digits), required for {self.capacity}")

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

    def __post_init__(self) -> None:
        for key, version in self.charts:
            if key not in ADDONS_BY_KEY:
                raise FieldError(key, key, f"is not a known add-on (known: {', '.join(sorted(ADDONS_BY_KEY))})")
            if not _SEMVER.fullmatch(version):
                raise FieldError(key, version, "is not a pinned version (e.g. 1.7.0)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageSpec:
    repository: str = "public.ecr.aws/deep-learning-containers/ray"
    tag: str = "train-ml-cuda-v1.1.0"
    digest: str = ""
    """``sha256:<64 hex>``, written by ``raytrain-eks lock``; empty = unlocked."""
    ray_version: str = "2.58.0"
    """The Ray inside the image: ``rayVersion`` of every RayCluster."""
    python_version: str = "3.13"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+", self.repository):
            raise FieldError("repository", self.repository,
                             "is not registry/name (e.g. public.ecr.aws/deep-learning-containers/ray)")
        if not re.fullmatch(r"[\w][\w.-]{0,127}", self.tag):
            raise FieldError("tag", self.tag, "is not a valid image tag")
        if self.digest and not DIGEST_PATTERN.fullmatch(self.digest):
            raise FieldError("digest", self.digest, "is not sha256:<64 hex digits> (or empty until `raytrain-eks lock`)")
        if not re.fullmatch(r"\d+\.\d+\.\d+", self.ray_version):
            raise FieldError("ray_version", self.ray_version, "is not a Ray version (e.g. 2.58.0)")
        if problem := tag_ray_problem(self.tag, self.ray_version):
            raise FieldError("tag", self.tag, problem)
        if not re.fullmatch(r"3\.\d+", self.python_version):
            raise FieldError("python_version", self.python_version, "is not a Python version (e.g. 3.13)")

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

    def __post_init__(self) -> None:
        if self.bucket_name and (problem := bucket_name_problem(self.bucket_name)):
            raise FieldError("bucket_name", self.bucket_name, problem)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]|[A-Za-z0-9]", self.prefix) or "//" in self.prefix:
            raise FieldError("prefix", self.prefix, "is not a key prefix (letters, digits, . _ - /, no leading or trailing /)")
        for i, ro in enumerate(self.read_only_prefixes):
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", ro) or ro == self.prefix:
                raise FieldError(f"read_only_prefixes[{i}]", ro,
                                 f"is not a top-level key prefix other than storage.prefix ({self.prefix!r})")
        if CODE_PREFIX not in self.read_only_prefixes:
            raise FieldError("read_only_prefixes", list(self.read_only_prefixes),
                             f"must include {CODE_PREFIX!r} (the training code archive every RayJob reads)")
        if not 1 <= self.noncurrent_version_days <= 3650:
            raise FieldError("noncurrent_version_days", self.noncurrent_version_days, "must be between 1 and 3650")


@dataclass(frozen=True, kw_only=True, slots=True)
class RaySpec:
    namespace: str = "ray"
    service_account: str = "ray-train"

    def __post_init__(self) -> None:
        for name in ("namespace", "service_account"):
            if not _DNS_LABEL.fullmatch(getattr(self, name)):
                raise FieldError(name, getattr(self, name), "is not a Kubernetes name (lower-case letters, digits, '-')")
        if self.namespace in ("kube-system", "kube-public", "kube-node-lease", "default"):
            raise FieldError("namespace", self.namespace, "is reserved: use a namespace of its own (e.g. ray)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSpec:
    connection_arn: str = ""
    """CodeConnections ARN of the source repository; empty = no pipeline stack."""
    repository: str = ""
    """``owner/name`` of this project's repository."""
    branch: str = "main"
    watch_schedule: str = "rate(6 hours)"
    """How often the image watcher resolves the tag's digest (EventBridge schedule expression)."""
    min_tokens_per_s_fraction: float = 0.9
    """Regression gate: the smoke run's tokens/s must reach this fraction of the last promoted
    smoke run's (the same job on the same cluster shape)."""
    max_eval_loss_increase: float = 0.05
    """Regression gate: the smoke run's held-out loss after training may exceed the last
    promoted smoke run's by at most this much."""

    def __post_init__(self) -> None:
        arn = r"arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}"
        if self.connection_arn and not re.fullmatch(arn, self.connection_arn):
            raise FieldError("connection_arn", self.connection_arn,
                             "is not a CodeConnections connection ARN (or empty: no pipeline)")
        if self.connection_arn and not re.fullmatch(r"[\w.-]+/[\w.-]+", self.repository):
            raise FieldError("repository", self.repository, "is not owner/name (required with pipeline.connection_arn)")
        if not re.fullmatch(r"[\w./-]+", self.branch) or self.branch.startswith(("/", "-")) or ".." in self.branch:
            raise FieldError("branch", self.branch, "is not a git branch name")
        if problem := schedule_problem(self.watch_schedule):
            raise FieldError("watch_schedule", self.watch_schedule, problem)
        if not 0 < self.min_tokens_per_s_fraction <= 2:
            raise FieldError("min_tokens_per_s_fraction", self.min_tokens_per_s_fraction,
                             "must be > 0 and <= 2 (0.9 = the new image may be 10% slower than the promoted one)")
        if not 0 <= self.max_eval_loss_increase <= 10:
            raise FieldError("max_eval_loss_increase", self.max_eval_loss_increase,
                             "must be between 0 and 10 (the held-out loss the new image may add)")

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

    def __post_init__(self) -> None:
        """Checks across sections; a FieldError here names the absolute field."""
        names: set[str] = set()
        for i, group in enumerate(self.gpu_node_groups):
            if group.name in names:
                raise FieldError(f"gpu_node_groups[{i}].name", group.name,
                                 "must be a unique lower-case name (letters, digits, '-')")
            names.add(group.name)
        for name, price in self.prices:
            if name not in INSTANCE_TYPES:
                raise FieldError(f"prices.{name}", name,
                                 f"is not a known instance type (known: {', '.join(sorted(INSTANCE_TYPES))})")
            if not price > 0:
                raise FieldError(f"prices.{name}", price, "must be a positive number (USD per hour)")
        if not self.storage.bucket_name and (problem := bucket_name_problem(self.bucket_name)):
            raise FieldError("storage.bucket_name", self.bucket_name,
                             f"(derived from cluster.name, cluster.account and cluster.region) {problem}; "
                             "set storage.bucket_name")

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
