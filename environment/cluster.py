"""The cluster and its node groups: the sections of environment.toml that say what EKS runs.

Each section checks its own fields in ``__post_init__`` (raising :class:`FieldError` naming the
field; the loader adds the file and the section path). Standard library only.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from environment.contract import (
    EFA_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, GPU_TAINT_VALUE, KUBERNETES_VERSIONS, NODE_GROUP_LABEL, NODE_ROLE_LABEL,
)
from environment.addons import ADDONS
from environment.existing import cluster_problem
from environment.instances import INSTANCE_TYPES, InstanceType, known_cpu_types, known_gpu_types, pod_cpu, pod_memory_gib
from environment.rules import DNS_LABEL
from spec_schema import FieldError

ENDPOINT_ACCESS = ("public", "private", "public_and_private")
OPEN_TO_ALL = "0.0.0.0/0"
"""The public_access_cidrs entry that admits every address (EKS's own default)."""
CAPACITY = ("on-demand", "spot", "capacity-reservation", "capacity-block")

# AWS Regions a spec may name: a well-formed typo (``us-east-3``) is refused here, not by
# CloudFormation after the network stack is half deployed.
#
# Source: AWS's published Region list, "AWS Regions" and "AWS Region billing codes" in the AWS
# Global Infrastructure documentation (docs.aws.amazon.com/global-infrastructure/latest/regions/
# aws-regions.html), as of 2025-12. Add a line when AWS opens a Region; nothing else changes.
AWS_REGIONS: tuple[str, ...] = (
    # North America
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "ca-west-1", "mx-central-1",
    # Africa
    "af-south-1",
    # Asia Pacific
    "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
    "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4",
    "ap-southeast-5", "ap-southeast-6", "ap-southeast-7",
    # Europe
    "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2",
    "eu-west-3",
    # Middle East
    "il-central-1", "me-central-1", "me-south-1",
    # South America
    "sa-east-1",
    # AWS GovCloud (US) and China: other partitions (arn:aws-us-gov, arn:aws-cn)
    "us-gov-east-1", "us-gov-west-1", "cn-north-1", "cn-northwest-1",
)


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
    public_access_cidrs: tuple[str, ...] = ()
    """CIDRs that may reach the PUBLIC API endpoint; required with a public endpoint (write
    ``["0.0.0.0/0"]`` to open it to everyone, knowingly); empty with a private one."""
    admin_principal_arns: tuple[str, ...] = ()
    """IAM principals given cluster-admin through EKS access entries. The CDK app refuses an
    empty list: CloudFormation creates the cluster, so the "cluster creator" EKS makes admin is
    CloudFormation's execution role, never the person running ``cdk deploy``."""
    submitter_principal_arns: tuple[str, ...] = ()
    """IAM principals who may only submit: an EKS access entry bound to the Ray namespace's
    ``raytrain-submitters`` role (RayJobs, their pods' logs, the run's service account and network
    policy, Kueue's queue), never cluster-admin; attach the stack's ``SubmitRunsPolicyArn`` output
    to them for the AWS side (docs/security.md)."""
    log_retention_days: int = 30
    """Days the control plane's CloudWatch log group keeps its logs."""
    existing: str = ""
    """The name of an EKS cluster a team already has, to install onto (environment/existing.py);
    empty: the cluster stack creates one named ``name``. With it, ``name`` still names the
    stacks and the bucket; the fields below describe that cluster and ``verify`` checks them."""
    vpc_id: str = ""
    """The existing cluster's VPC (only with ``existing``)."""
    private_subnet_ids: tuple[str, ...] = ()
    """One private subnet of ``vpc_id`` per ``availability_zones`` entry, same order (only with
    ``existing``): new GPU groups go into the one in ``gpu_availability_zone``."""
    cluster_security_group_id: str = ""
    """The security group EKS made for the existing cluster (only with ``existing``)."""
    present_addons: tuple[str, ...] = ()
    """Add-on keys of environment/addons.py the existing cluster already runs: not installed,
    never removed (only with ``existing``; ``verify`` finds each and the ones it lacks)."""

    @property
    def eks_name(self) -> str:
        """The EKS cluster's name: ``existing``, else ``name``."""
        return self.existing or self.name

    def __post_init__(self) -> None:
        if not DNS_LABEL.fullmatch(self.name) or len(self.name) > 40 or not self.name[0].isalpha():
            # CloudFormation stack names (<name>-network, ...) must start with a letter.
            raise FieldError("name", self.name, "is not a lower-case name of 1-40 letters, digits and '-' "
                                                "starting with a letter (the stack names derive from it)")
        if self.account and not re.fullmatch(r"(?a)\d{12}", self.account):
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
        for i, cidr in enumerate(self.public_access_cidrs):
            try:
                ipaddress.IPv4Network(cidr)
                if "/" not in cidr:  # EKS takes CIDR blocks only: an address needs its /32
                    raise ValueError(cidr)
            except ValueError:
                raise FieldError(f"public_access_cidrs[{i}]", cidr, "is not an IPv4 CIDR (e.g. 203.0.113.0/24)") from None
        if self.endpoint_access == "private" and self.public_access_cidrs:
            raise FieldError("public_access_cidrs", list(self.public_access_cidrs),
                             "must be empty with endpoint_access = 'private' (there is no public endpoint)")
        if self.endpoint_access != "private" and not self.public_access_cidrs:
            raise FieldError("public_access_cidrs", [],
                             f"must list who may reach the public API endpoint (endpoint_access = "
                             f"{self.endpoint_access!r}); write [\"0.0.0.0/0\"] to open it to everyone")
        if self.endpoint_access == "public" and self.public_access_cidrs != (OPEN_TO_ALL,):
            # aws-cdk-lib 2.275 aws_eks_v2 EndpointAccess.onlyFrom() refuses a public-only
            # endpoint ("Use PUBLIC_AND_PRIVATE.onlyFrom() instead"): EKS itself would accept it.
            raise FieldError("public_access_cidrs", list(self.public_access_cidrs),
                             "cannot narrow a public-only endpoint (endpoint_access = 'public'): use "
                             "endpoint_access = 'public_and_private' with these CIDRs, or [\"0.0.0.0/0\"]")
        for name in ("admin_principal_arns", "submitter_principal_arns"):
            for i, arn in enumerate(getattr(self, name)):
                if not re.fullmatch(r"(?a)arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", arn):
                    raise FieldError(f"{name}[{i}]", arn, "is not an IAM role or user ARN")
        if both := next((a for a in self.submitter_principal_arns if a in self.admin_principal_arns), None):
            raise FieldError("submitter_principal_arns", both, "is also an admin principal (EKS allows one access "
                             "entry per principal): list it in one of the two")
        for name in ("public_access_cidrs", "admin_principal_arns", "submitter_principal_arns"):
            # EKS makes one access entry per principal: a second one for the same ARN fails the deploy.
            values = getattr(self, name)
            if dup := next((v for i, v in enumerate(values) if v in values[:i]), None):
                raise FieldError(f"{name}[{values.index(dup, values.index(dup) + 1)}]", dup,
                                 f"is listed twice in cluster.{name} (each entry once)")
        if not 1 <= self.log_retention_days <= 3653:
            raise FieldError("log_retention_days", self.log_retention_days, "must be between 1 and 3653")
        cluster_problem(self, tuple(a.key for a in ADDONS))


def gpu_shape(instance: InstanceType) -> tuple[int, int, int]:
    """What a job's plan depends on: GPUs per node, memory of one GPU (GiB), EFA interfaces."""
    return instance.gpus, instance.gpu_memory_gib, instance.max_efa_interfaces


def _shape_text(shape: tuple[int, int, int]) -> str:
    return f"{shape[0]} GPUs x {shape[1]} GiB, {shape[2]} EFA"


class _NodeSizing:
    """What a node group's instance type gives its pods (both kinds of group)."""

    __slots__ = ()
    instance_type: str

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def pod_cpu(self) -> int:
        """Whole CPUs one pod may request on a node of this group."""
        return pod_cpu(self.instance)

    @property
    def pod_memory_gib(self) -> int:
        """GiB one pod may request on a node of this group."""
        return pod_memory_gib(self.instance)


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemNodeGroupSpec(_NodeSizing):
    instance_type: str = "m7i.2xlarge"
    nodes: int = 1
    disk_gib: int = 100
    """Root volume of each system node: the Ray heads and RayJob submitters run the DLC image
    there (see ImageSpec.disk_gib); the EKS default of 20 GiB cannot hold it."""
    existing: str = ""
    """With ``cluster.existing``: the EKS node group of that cluster whose nodes run the system
    pods (required there: no system group is created); its nodes carry :attr:`labels`."""

    def __post_init__(self) -> None:
        if self.instance_type not in known_cpu_types():
            raise FieldError("instance_type", self.instance_type,
                             f"is not a known CPU instance type (known: {', '.join(known_cpu_types())})")
        if not 1 <= self.nodes <= 10:
            raise FieldError("nodes", self.nodes, "must be between 1 and 10")
        if not 20 <= self.disk_gib <= 16384:
            raise FieldError("disk_gib", self.disk_gib, "must be between 20 and 16384")

    @property
    def labels(self) -> dict[str, str]:
        return {NODE_ROLE_LABEL: "system", NODE_GROUP_LABEL: "system"}


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuNodeGroupSpec(_NodeSizing):
    name: str = "gpu"
    instance_type: str = "g6.12xlarge"
    min_nodes: int = 0
    """0 = scale to zero: cluster-autoscaler adds nodes while a RayJob's workers are Pending."""
    desired_nodes: int = 0
    """The size the group starts at. With min_nodes < max_nodes cluster-autoscaler owns the size:
    it must equal min_nodes, and only the deploy that creates the group sends it (a redeploy
    would reset the autoscaler's size; infra/verify_gate.py)."""
    max_nodes: int = 2
    """The size every GPU job runs at (its world size = max_nodes x GPUs per node)."""
    root_volume_gib: int = 200
    capacity: str = "on-demand"
    """``on-demand``, ``spot``, ``capacity-reservation`` or ``capacity-block``. Spot: EC2 may
    reclaim a node with two minutes' notice; the managed node group drains it and the job
    checkpoints on the notice (docs/spot.md says which jobs fit)."""
    instance_types: tuple[str, ...] = ()
    """Spot only: further instance types the group may launch besides ``instance_type``, each of
    the same GPU shape (GPUs per node, GPU memory, EFA interfaces), so the job's plan holds on
    any of them; more types, more spot pools to draw from. Empty: ``instance_type`` alone."""
    capacity_reservation_id: str = ""
    """``cr-...`` for a capacity reservation or a capacity block; empty for on-demand."""
    placement_group: str = ""
    """The cluster placement group a capacity reservation was created in (a targeted ODCR made in
    a placement group is only usable there); empty = on-demand gets a placement group of its own,
    a reservation or block gets none (a block is already co-located)."""
    existing: str = ""
    """With ``cluster.existing``: the EKS node group of that cluster this entry describes (not
    created; its nodes carry :attr:`labels` and :attr:`taints`); empty: the app creates it."""

    def __post_init__(self) -> None:
        if not DNS_LABEL.fullmatch(self.name):
            raise FieldError("name", self.name, "must be a unique lower-case name (letters, digits, '-')")
        if self.instance_type not in known_gpu_types():
            hint = " (a CPU type: use system_node_group)" if self.instance_type in INSTANCE_TYPES else ""
            raise FieldError("instance_type", self.instance_type,
                             f"is not a known GPU instance type{hint} (known: {', '.join(known_gpu_types())})")
        if self.min_nodes < 0:
            raise FieldError("min_nodes", self.min_nodes, "must be >= 0")
        if self.max_nodes < 1:
            raise FieldError("max_nodes", self.max_nodes, "must be >= 1")
        if self.min_nodes > self.max_nodes:
            raise FieldError("min_nodes", self.min_nodes, f"must be <= max_nodes ({self.max_nodes})")
        if not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise FieldError("desired_nodes", self.desired_nodes,
                             f"must be between min_nodes ({self.min_nodes}) and max_nodes ({self.max_nodes})")
        if self.min_nodes < self.max_nodes and self.desired_nodes != self.min_nodes:
            raise FieldError("desired_nodes", self.desired_nodes,
                             f"must equal min_nodes ({self.min_nodes}) while min_nodes < max_nodes: cluster-autoscaler "
                             "owns the group's size after the deploy that creates it at its desired size")
        if not 50 <= self.root_volume_gib <= 16384:
            raise FieldError("root_volume_gib", self.root_volume_gib,
                             "must be between 50 and 16384 (the DLC image alone is tens of GB)")
        if self.capacity not in CAPACITY:
            raise FieldError("capacity", self.capacity, f"is not allowed (allowed: {', '.join(CAPACITY)})")
        if self.capacity in ("on-demand", "spot") and self.capacity_reservation_id:
            raise FieldError("capacity_reservation_id", self.capacity_reservation_id,
                             f"must be empty for {self.capacity} capacity (set capacity to capacity-reservation or "
                             "capacity-block)")
        if self.capacity not in ("on-demand", "spot") and not re.fullmatch(r"cr-[0-9a-f]{17}", self.capacity_reservation_id):
            raise FieldError("capacity_reservation_id", self.capacity_reservation_id,
                             f"is not a capacity reservation id (cr- and 17 hex digits), required for {self.capacity}")
        if self.instance_types and self.capacity != "spot":
            raise FieldError("instance_types", list(self.instance_types),
                             f"is only for capacity = spot (capacity is {self.capacity!r}: one instance_type)")
        for i, other in enumerate(self.instance_types):
            if other not in known_gpu_types():
                raise FieldError(f"instance_types[{i}]", other,
                                 f"is not a known GPU instance type (known: {', '.join(known_gpu_types())})")
            if other == self.instance_type or other in self.instance_types[:i]:
                raise FieldError(f"instance_types[{i}]", other, "is listed twice (instance_type and instance_types)")
            mine, theirs = gpu_shape(INSTANCE_TYPES[self.instance_type]), gpu_shape(INSTANCE_TYPES[other])
            if mine != theirs:
                raise FieldError(f"instance_types[{i}]", other,
                                 f"has another GPU shape ({_shape_text(theirs)}) than instance_type "
                                 f"{self.instance_type} ({_shape_text(mine)}): the job's plan would not hold")
        if self.placement_group and self.capacity != "capacity-reservation":
            raise FieldError("placement_group", self.placement_group,
                             "is only for capacity = capacity-reservation (the reservation's own placement group)")
        if self.placement_group and not re.fullmatch(r"(?a)[\w.-]{1,255}", self.placement_group):
            raise FieldError("placement_group", self.placement_group, "is not a placement group name")

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def all_instance_types(self) -> tuple[str, ...]:
        """Every type the group may launch: ``instance_type`` first, then ``instance_types``."""
        return (self.instance_type, *self.instance_types)

    @property
    def spot(self) -> bool:
        return self.capacity == "spot"

    @property
    def efa_per_node(self) -> int:
        return self.instance.max_efa_interfaces

    @property
    def job_nodes(self) -> int:
        """Nodes one GPU job runs on: the group's maximum (the autoscaler brings them up)."""
        return self.max_nodes

    @property
    def world_size(self) -> int:
        """Ray Train workers of a job: one per GPU of :attr:`job_nodes` nodes."""
        return self.job_nodes * self.gpus_per_node

    @property
    def labels(self) -> dict[str, str]:
        labels = {NODE_ROLE_LABEL: "gpu", NODE_GROUP_LABEL: self.name}
        if self.efa_per_node:
            labels[EFA_LABEL] = "true"
        return labels

    @property
    def taints(self) -> tuple[dict[str, str], ...]:
        return ({"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT},)
