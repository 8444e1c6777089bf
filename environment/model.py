"""The environment spec as frozen, typed dataclasses, with every derived value as a property,
and the reading of environment.toml into them (:func:`load_environment`).

Nothing here imports anything outside the standard library: the CDK app, the cdk8s app, the CLI
and the tests all derive from these objects, so a fact typed once in environment.toml can never
drift between them.

Reading refuses every user error with one line: ``<file>: <field>: <bad value> <what is
allowed>``; unknown keys are errors, so a typo is never silently ignored. The schema engine
(spec_schema/) checks the file's SHAPE against the sections' dataclasses (known sections and
keys, TOML types); each section's own rules live with it here and in environment/cluster.py
(``__post_init__``, raising :class:`FieldError` naming the field relative to itself), and rules
across sections in ``Environment.__post_init__``; the engine prefixes the file name and the
section path and raises :class:`SpecError`, the one line a user sees. Only the two tables whose
keys are names rather than fields (``[versions]``: add-on keys, ``[prices]``: instance types)
parse themselves, below.
"""
from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from environment.addons import ADDONS, ADDONS_BY_KEY
from environment.cluster import (  # noqa: F401  (re-exported: every section is importable from here)
    CAPACITY, ENDPOINT_ACCESS, ClusterSpec, GpuNodeGroupSpec, SystemNodeGroupSpec,
)
from environment.contract import CODE_PREFIX, DIGEST_PATTERN
from environment.existing import environment_problem
from environment.image_source import cache_problem
from environment.instances import INSTANCE_TYPES, SPOT_PRICE_FRACTION
from environment.queueing import QueueingSpec
from environment.rules import (
    DNS_LABEL, DNS_SUBDOMAIN, bucket_name_problem, derived_bucket_name, schedule_problem, tag_ray_problem,
    window_problem,
)
from spec_schema import FieldError, SchemaError, build_section, check_keys, read_toml

_SEMVER = re.compile(r"(?a)v?\d+\.\d+\.\d+")


class SpecError(SchemaError):
    """A user error in the environment spec; ``str(err)`` is the one line to print."""


class UnlockedImageWarning(UserWarning):
    """The image is referenced by a moving tag: runs are not reproducible until `lock`."""


MAX_APPLY_WAIT_MINUTES = 405
"""CodePipeline's limit on a CodeBuild action (8 hours: 480 minutes, its quotas page) less what
Apply's build spends besides waiting (its apply and a rollback's, 30 minutes each, plus 15:
infra/stacks/pipeline.py); a test synthesizes the longest wait against the limit."""

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
    disk_gib: int = 40
    """Node disk the image takes once pulled: containerd keeps the compressed layers (~20 GB for
    the DLC) and the unpacked snapshot. The scheduling-fit check holds node disks to it."""
    pull_through_cache: bool = False
    """true = the nodes pull the image from the account's ECR through a pull-through cache rule
    and VPC endpoints (ecr.api, ecr.dkr; layers over the S3 gateway endpoint), not from the
    public registry through the NAT gateway; the digest stays the same
    (:mod:`environment.image_source`). Off by default: it needs ``cluster.account`` to name the
    registry, and its endpoints cost by the hour whether or not a node starts (``summary``
    prints both sides)."""

    def __post_init__(self) -> None:
        if not 1 <= self.disk_gib <= 1024:
            raise FieldError("disk_gib", self.disk_gib, "must be between 1 and 1024")
        if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+", self.repository):
            raise FieldError("repository", self.repository,
                             "is not registry/name (e.g. public.ecr.aws/deep-learning-containers/ray)")
        if not re.fullmatch(r"(?a)[\w][\w.-]{0,127}", self.tag):
            raise FieldError("tag", self.tag, "is not a valid image tag")
        if self.digest and not DIGEST_PATTERN.fullmatch(self.digest):
            raise FieldError("digest", self.digest, "is not sha256:<64 hex digits> (or empty until `raytrain-eks lock`)")
        if not re.fullmatch(r"(?a)\d+\.\d+\.\d+", self.ray_version):
            raise FieldError("ray_version", self.ray_version, "is not a Ray version (e.g. 2.58.0)")
        if problem := tag_ray_problem(self.tag, self.ray_version):
            raise FieldError("tag", self.tag, problem)
        if not re.fullmatch(r"(?a)3\.\d+", self.python_version):
            raise FieldError("python_version", self.python_version, "is not a Python version (e.g. 3.13)")
        if int(self.python_version.split(".")[1]) < 11:
            raise FieldError("python_version", self.python_version,
                             "is older than the training package needs (3.11 or newer: it reads TOML with tomllib)")

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
    def name(self) -> str:
        return self.repository.split("/", 1)[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageSpec:
    bucket_name: str = ""
    """Empty = ``raytrain-<cluster>-<account>-<region>`` (see Environment.bucket_name); the CDK
    app then needs cluster.account (S3 names are global)."""
    existing_bucket: bool = False
    """true = the bucket already exists (e.g. retained by an earlier ``cdk destroy``): the storage
    stack adopts it by name instead of creating it."""
    prefix: str = "runs"
    """Key prefix of all runs; the pod role may touch nothing outside it."""
    noncurrent_version_days: int = 30
    """Days an overwritten or deleted object version is kept."""
    read_only_prefixes: tuple[str, ...] = (CODE_PREFIX, "models", "data")
    """Key prefixes the pods may READ (never write): ``code`` holds the training code archive
    every RayJob names as its working_dir (required); ``models`` and ``data`` the base models
    and datasets that job configs name as ``s3://{bucket}/...``."""
    shared_path: str = ""
    """The runs on a shared file system instead of the bucket (FSx for Lustre, EFS): the absolute
    path where every Ray pod mounts it, e.g. ``/fsx/runs`` (runs are ``file://<path>/<run>``,
    training/storage/__init__.py). The bucket still holds the code archive, models, data and the
    uploaded inputs. Needs ``shared_claim``."""
    shared_claim: str = ""
    """The PersistentVolumeClaim, in ``ray.namespace``, holding that file system: the charts
    mount it at ``shared_path`` on every Ray head and worker. Created with the file system
    (its CSI driver and volume are not deployed by this project)."""

    def __post_init__(self) -> None:
        if bool(self.shared_path) != bool(self.shared_claim):
            field_name, value = ("shared_claim", self.shared_claim) if self.shared_path else ("shared_path", self.shared_path)
            raise FieldError(field_name, value, "is required with storage.shared_path / shared_claim (set both, or neither)")
        if self.shared_path and (not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", self.shared_path)
                                 or any(part in (".", "..") for part in self.shared_path.split("/"))):
            raise FieldError("shared_path", self.shared_path, "is not an absolute path (/ then letters, digits, . _ -; "
                                                              "no '.' or '..' segment, no trailing /)")
        if self.shared_claim and not DNS_SUBDOMAIN.fullmatch(self.shared_claim):
            raise FieldError("shared_claim", self.shared_claim, "is not a PersistentVolumeClaim name (a lower-case DNS "
                                                                "subdomain of at most 253 characters)")
        if self.bucket_name and (problem := bucket_name_problem(self.bucket_name)):
            raise FieldError("bucket_name", self.bucket_name, problem)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]|[A-Za-z0-9]", self.prefix) or "//" in self.prefix:
            raise FieldError("prefix", self.prefix, "is not a key prefix (letters, digits, . _ - /, no leading or trailing /)")
        if any(part in (".", "..") for part in self.prefix.split("/")):
            raise FieldError("prefix", self.prefix, "holds a '.' or '..' segment (S3 keeps it literally; "
                                                    "IAM and the console read it as a path): name the folder plainly")
        inside = [ro for ro in self.read_only_prefixes if self.prefix.split("/")[0] == ro]
        if inside:
            raise FieldError("prefix", self.prefix, f"lies inside {inside[0]!r}, a prefix the pods may only read "
                                                    "(storage.read_only_prefixes): the runs must be writable")
        for i, ro in enumerate(self.read_only_prefixes):
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", ro) or ro == self.prefix:
                raise FieldError(f"read_only_prefixes[{i}]", ro,
                                 f"is not a top-level key prefix other than storage.prefix ({self.prefix!r})")
        if len(set(self.read_only_prefixes)) != len(self.read_only_prefixes):
            raise FieldError("read_only_prefixes", list(self.read_only_prefixes), "lists a prefix twice (each once)")
        if CODE_PREFIX not in self.read_only_prefixes:
            raise FieldError("read_only_prefixes", list(self.read_only_prefixes),
                             f"must include {CODE_PREFIX!r} (the training code archive every RayJob reads)")
        if not 1 <= self.noncurrent_version_days <= 3650:
            raise FieldError("noncurrent_version_days", self.noncurrent_version_days, "must be between 1 and 3650")


@dataclass(frozen=True, kw_only=True, slots=True)
class RaySpec:
    namespace: str = "ray"
    service_account: str = "ray-train"
    head_cpu: int = 2
    """CPUs of each Ray head pod (GCS, dashboard, the job's driver; no Ray tasks: num-cpus 0)."""
    head_memory_gib: int = 8
    mlflow_tracking_server_arn: str = ""
    """A SageMaker managed MLflow tracking server the jobs log to
    (``arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>``): the pods' roles get
    ``sagemaker-mlflow:*`` on that ARN only. Empty: no AWS right for MLflow."""

    def __post_init__(self) -> None:
        arn = r"(?a)arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:mlflow-tracking-server/[A-Za-z0-9](-*[A-Za-z0-9])*"
        if self.mlflow_tracking_server_arn and not re.fullmatch(arn, self.mlflow_tracking_server_arn):
            raise FieldError("mlflow_tracking_server_arn", self.mlflow_tracking_server_arn,
                             "is not a SageMaker MLflow tracking server ARN "
                             "(arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>, or empty)")
        for name in ("namespace", "service_account"):
            if not DNS_LABEL.fullmatch(getattr(self, name)):
                raise FieldError(name, getattr(self, name), "is not a Kubernetes name (lower-case letters, digits, '-')")
        if self.namespace in ("kube-system", "kube-public", "kube-node-lease", "default"):
            raise FieldError("namespace", self.namespace, "is reserved: use a namespace of its own (e.g. ray)")
        if not 1 <= self.head_cpu <= 64:
            raise FieldError("head_cpu", self.head_cpu, "must be between 1 and 64")
        if not 1 <= self.head_memory_gib <= 512:
            raise FieldError("head_memory_gib", self.head_memory_gib, "must be between 1 and 512")


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
    max_attempts: int = 3
    """Executions the watcher starts for one digest whose failures were not the image's
    (capacity, API errors, a killed build, a deferred Apply); an image failure shelves it at once."""
    notify_emails: tuple[str, ...] = ()
    """Addresses subscribed to the pipeline's failure topic (SNS): failed executions with their
    reason, the watcher's errors."""
    apply_wait_minutes: int = 120
    """How long Apply waits for the RayJobs running on the long-lived cluster to end before it
    defers (it never recreates the cluster under a running job)."""
    maintenance_window: str = ""
    """When Apply may recreate the long-lived cluster, e.g. ``"sat,sun 02:00-06:00"`` (UTC);
    empty: any time (environment/rules.py)."""

    def __post_init__(self) -> None:
        arn = r"(?a)arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}"
        if self.connection_arn and not re.fullmatch(arn, self.connection_arn):
            raise FieldError("connection_arn", self.connection_arn,
                             "is not a CodeConnections connection ARN (or empty: no pipeline)")
        if self.connection_arn and not re.fullmatch(r"(?a)[\w.-]+/[\w.-]+", self.repository):
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
        if not 1 <= self.max_attempts <= 20:
            raise FieldError("max_attempts", self.max_attempts, "must be between 1 and 20 (executions per digest)")
        bad = [a for a in self.notify_emails if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", a)]
        if bad:
            raise FieldError("notify_emails", bad[0], "is not an e-mail address")
        if not 0 <= self.apply_wait_minutes <= MAX_APPLY_WAIT_MINUTES:
            raise FieldError("apply_wait_minutes", self.apply_wait_minutes,
                             f"must be between 0 and {MAX_APPLY_WAIT_MINUTES} (minutes Apply waits for running jobs; "
                             "CodePipeline ends a CodeBuild action after 8 hours)")
        if problem := window_problem(self.maintenance_window):
            raise FieldError("maintenance_window", self.maintenance_window, problem)

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
    queueing: QueueingSpec = field(default_factory=QueueingSpec)
    prices: tuple[tuple[str, float], ...] = ()
    """On-demand USD/hour overrides of the instance table's estimates."""
    source: str = "environment.toml"

    def __post_init__(self) -> None:
        """Checks across sections; a FieldError here names the absolute field."""
        if not self.gpu_node_groups:
            raise FieldError("gpu_node_groups", [], "has no group: list at least one [[gpu_node_groups]] table "
                                                    "(the GPU nodes the jobs run on)")
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
        system = self.system_node_group.instance
        if self.ray.head_cpu >= system.vcpus or self.ray.head_memory_gib >= system.memory_gib:
            raise FieldError("ray.head_cpu", self.ray.head_cpu,
                             f"with ray.head_memory_gib = {self.ray.head_memory_gib} does not fit a "
                             f"{system.name} ({system.vcpus} vCPUs, {system.memory_gib} GiB): lower them or "
                             "choose a bigger system_node_group.instance_type")
        if self.storage.existing_bucket and not self.storage.bucket_name and not self.cluster.account:
            raise FieldError("storage.existing_bucket", True,
                             "needs the bucket's name: set storage.bucket_name (or cluster.account)")
        environment_problem(self)
        if problem := cache_problem(self):
            raise FieldError(*problem)
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

    def hourly_price(self, instance_type: str) -> float:
        return dict(self.prices).get(instance_type, INSTANCE_TYPES[instance_type].hourly_usd_estimate)

    def node_price(self, group: Any) -> tuple[float, str]:
        """(USD per node-hour, how it is known) of a node group: the on-demand estimate (or
        ``[prices]``), and for spot that times :data:`~environment.instances.SPOT_PRICE_FRACTION`,
        labelled the estimate it is. What the preflight and a run's ``cost`` use."""
        price = self.hourly_price(group.instance_type)
        if getattr(group, "capacity", "") == "spot":
            return (round(price * SPOT_PRICE_FRACTION, 4),
                    f"spot estimate ({SPOT_PRICE_FRACTION:g} x the on-demand price, assumed)")
        return price, "on-demand price (spec [prices])" if group.instance_type in dict(self.prices) else \
            "on-demand price (estimate, environment/instances.py)"

    @property
    def idle_hourly_cost_usd(self) -> float:
        """Estimated on-demand cost of the nodes when no job runs (GPU groups at min_nodes)."""
        cost = self.system_node_group.nodes * self.hourly_price(self.system_node_group.instance_type)
        for group in self.gpu_node_groups:
            cost += group.min_nodes * self.node_price(group)[0]
        return round(cost, 4)

    @property
    def hourly_cost_usd(self) -> float:
        """Estimated on-demand cost while a job runs on the primary group at its job size (EKS
        control plane, NAT and storage not included)."""
        group = self.primary_gpu_group
        extra = max(0, group.job_nodes - group.min_nodes) * self.node_price(group)[0]
        return round(self.idle_hourly_cost_usd + extra, 4)

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
        """The checkpoint bucket's name: the spec's, or :func:`environment.rules.derived_bucket_name`
        (cluster, account, region; S3 names are global, the account keeps two users apart)."""
        if self.storage.bucket_name:
            return self.storage.bucket_name
        return derived_bucket_name(self.cluster.name, self.cluster.account, self.cluster.region)

    @property
    def bucket_uri(self) -> str:
        """``s3://<bucket>/<prefix>``: the runs' prefix in the bucket (the uploaded inputs live there)."""
        return f"s3://{self.bucket_name}/{self.storage.prefix}"

    @property
    def storage_uri(self) -> str:
        """Ray Train storage of every run (training/storage/__init__.py): the shared file system's
        ``file://<storage.shared_path>`` where the spec has one, else :attr:`bucket_uri`."""
        return f"file://{self.storage.shared_path}" if self.storage.shared_path else self.bucket_uri


def _versions(table: Any, where: str) -> VersionsSpec:
    """``[versions]``: one pinned chart version per add-on key of the add-on table."""
    if not isinstance(table, dict):
        raise FieldError(where, table, "is not allowed (expected a table of add-on = chart version)")
    check_keys(table, ADDONS_BY_KEY, where, "add-on")
    for key, value in table.items():
        if not isinstance(value, str):
            raise FieldError(f"{where}.{key}", value, "is not allowed (expected a string)")
    try:
        return VersionsSpec(charts=tuple(sorted(table.items())))
    except FieldError as err:
        raise FieldError(f"{where}.{err.field}", err.value, err.allowed) from None


def _prices(table: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``[prices]``: instance type = USD per hour (which types exist is Environment's rule)."""
    if not isinstance(table, dict):
        raise FieldError(where, table, "is not allowed (expected a table of instance type = USD/hour)")
    for name, price in table.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 < price < float("inf"):
            raise FieldError(f"{where}.{name}", price, "must be a positive number (USD per hour)")
    return tuple(sorted(table.items()))


def environment_from_dict(raw: Mapping[str, Any], source: str = "environment.toml") -> Environment:
    return build_section(Environment, dict(raw), source=source, error=SpecError, what="section",
                         parsers={"versions": _versions, "prices": _prices}, extra={"source": source})


def load_environment(path: str | Path = "environment.toml") -> Environment:
    return environment_from_dict(read_toml(path, SpecError, "environment.toml"), str(path))
