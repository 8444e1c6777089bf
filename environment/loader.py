"""Read environment.toml into :class:`environment.model.Environment`, refusing every user error with one
line: ``<file>: <field>: <bad value> <what is allowed>``. Unknown keys are errors, so a typo is
never silently ignored.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from environment.addons import ADDONS_BY_KEY
from environment.contract import CODE_PREFIX, DIGEST_PATTERN
from environment.instances import INSTANCE_TYPES, known_cpu_types, known_gpu_types
from environment.model import (
    ClusterSpec, Environment, GpuNodeGroupSpec, ImageSpec, ObservabilitySpec, PipelineSpec, RaySpec,
    StorageSpec, SystemNodeGroupSpec, VersionsSpec,
)

KUBERNETES_VERSIONS = tuple(f"1.{minor}" for minor in range(25, 37))
ENDPOINT_ACCESS = ("public", "private", "public_and_private")
CAPACITY = ("on-demand", "capacity-reservation", "capacity-block")
_REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_SEMVER = re.compile(r"v?\d+\.\d+\.\d+")


class SpecError(ValueError):
    """A user error in the environment spec; ``str(err)`` is the one line to print."""


class _Ctx:
    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, value: Any, allowed: str) -> SpecError:
        return SpecError(f"{self.source}: {where}: {value!r} {allowed}")


_SECTIONS: dict[str, type] = {
    "cluster": ClusterSpec, "system_node_group": SystemNodeGroupSpec,
    "image": ImageSpec, "storage": StorageSpec, "ray": RaySpec, "pipeline": PipelineSpec,
    "observability": ObservabilitySpec,
}


def _typed(ctx: _Ctx, where: str, value: Any, type_name: str) -> Any:
    checks = {
        "str": (lambda v: isinstance(v, str), "a string"),
        "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        "bool": (lambda v: isinstance(v, bool), "true or false"),
        "tuple[str, ...]": (lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
                            "a list of strings"),
    }
    ok, expected = checks[type_name]
    if not ok(value):
        raise ctx.fail(where, value, f"is not allowed (expected {expected})")
    return tuple(value) if type_name.startswith("tuple") else value


def _section(ctx: _Ctx, cls: type, table: Any, prefix: str) -> Any:
    if not isinstance(table, dict):
        raise ctx.fail(prefix, table, "is not allowed (expected a table)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = {n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for key in table:
        if key not in fields:
            raise ctx.fail(f"{prefix}.{key}", key, f"is not a known field (known: {', '.join(sorted(fields))})")
    for key in sorted(required - set(table)):
        raise SpecError(f"{ctx.source}: {prefix}.{key}: missing (required)")
    return cls(**{k: _typed(ctx, f"{prefix}.{k}", v, str(fields[k].type)) for k, v in table.items()})


def _versions(ctx: _Ctx, table: Any) -> VersionsSpec:
    """``[versions]``: one pinned chart version per add-on key of the add-on table."""
    if not isinstance(table, dict):
        raise ctx.fail("versions", table, "is not allowed (expected a table)")
    for key, value in table.items():
        if key not in ADDONS_BY_KEY:
            raise ctx.fail(f"versions.{key}", key, f"is not a known add-on (known: {', '.join(sorted(ADDONS_BY_KEY))})")
        _typed(ctx, f"versions.{key}", value, "str")
    return VersionsSpec(charts=tuple(sorted(table.items())))


def environment_from_dict(raw: Mapping[str, Any], source: str = "environment.toml") -> Environment:
    ctx = _Ctx(source)
    known = set(_SECTIONS) | {"gpu_node_groups", "prices", "versions"}
    for key in raw:
        if key not in known:
            raise ctx.fail(key, key, f"is not a known section (known: {', '.join(sorted(known))})")
    if "cluster" not in raw:
        raise SpecError(f"{source}: cluster: missing (required section)")
    kwargs: dict[str, Any] = {"source": source}
    for key, cls in _SECTIONS.items():
        if key in raw:
            kwargs[key] = _section(ctx, cls, raw[key], key)
    if "versions" in raw:
        kwargs["versions"] = _versions(ctx, raw["versions"])
    groups = raw.get("gpu_node_groups", [])
    if not isinstance(groups, list) or not groups:
        raise ctx.fail("gpu_node_groups", groups, "must be a non-empty list of [[gpu_node_groups]] tables")
    kwargs["gpu_node_groups"] = tuple(
        _section(ctx, GpuNodeGroupSpec, g, f"gpu_node_groups[{i}]") for i, g in enumerate(groups))
    prices = raw.get("prices", {})
    if not isinstance(prices, dict):
        raise ctx.fail("prices", prices, "is not allowed (expected a table of instance type = USD/hour)")
    for name, price in prices.items():
        if name not in INSTANCE_TYPES:
            raise ctx.fail(f"prices.{name}", name, f"is not a known instance type (known: {', '.join(sorted(INSTANCE_TYPES))})")
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0:
            raise ctx.fail(f"prices.{name}", price, "must be a positive number (USD per hour)")
    kwargs["prices"] = tuple(sorted((k, float(v)) for k, v in prices.items()))
    env = Environment(**kwargs)
    validate(env, ctx)
    return env


def load_environment(path: str | Path = "environment.toml") -> Environment:
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{source}: file not found") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{source}: not valid TOML: {err}") from None
    return environment_from_dict(raw, source)


def validate(env: Environment, ctx: _Ctx) -> None:
    c = env.cluster
    if not _DNS_LABEL.fullmatch(c.name) or len(c.name) > 40:
        raise ctx.fail("cluster.name", c.name, "is not a lower-case name of 1-40 letters, digits and '-'")
    if c.account and not re.fullmatch(r"\d{12}", c.account):
        raise ctx.fail("cluster.account", c.account, "is not a 12-digit AWS account id (or empty)")
    if not _REGION.fullmatch(c.region):
        raise ctx.fail("cluster.region", c.region, "is not an AWS region name (e.g. us-east-1)")
    if len(c.availability_zones) < 2 or len(set(c.availability_zones)) != len(c.availability_zones):
        raise ctx.fail("cluster.availability_zones", list(c.availability_zones),
                       "must list at least two distinct AZs (EKS requires two)")
    for i, az in enumerate(c.availability_zones):
        if not re.fullmatch(re.escape(c.region) + r"[a-z]", az):
            raise ctx.fail(f"cluster.availability_zones[{i}]", az, f"is not an AZ of region {c.region} (e.g. {c.region}a)")
    if c.gpu_availability_zone not in c.availability_zones:
        raise ctx.fail("cluster.gpu_availability_zone", c.gpu_availability_zone,
                       f"must be one of cluster.availability_zones ({', '.join(c.availability_zones)})")
    if c.kubernetes_version not in KUBERNETES_VERSIONS:
        raise ctx.fail("cluster.kubernetes_version", c.kubernetes_version,
                       f"is not supported (supported: {', '.join(KUBERNETES_VERSIONS)})")
    if c.endpoint_access not in ENDPOINT_ACCESS:
        raise ctx.fail("cluster.endpoint_access", c.endpoint_access, f"is not allowed (allowed: {', '.join(ENDPOINT_ACCESS)})")
    for i, arn in enumerate(c.admin_principal_arns):
        if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", arn):
            raise ctx.fail(f"cluster.admin_principal_arns[{i}]", arn, "is not an IAM role or user ARN")
    s = env.system_node_group
    if s.instance_type not in known_cpu_types():
        raise ctx.fail("system_node_group.instance_type", s.instance_type,
                       f"is not a known CPU instance type (known: {', '.join(known_cpu_types())})")
    if not 1 <= s.nodes <= 10:
        raise ctx.fail("system_node_group.nodes", s.nodes, "must be between 1 and 10")
    names = set()
    for i, g in enumerate(env.gpu_node_groups):
        where = f"gpu_node_groups[{i}]"
        if not _DNS_LABEL.fullmatch(g.name) or g.name in names:
            raise ctx.fail(f"{where}.name", g.name, "must be a unique lower-case name (letters, digits, '-')")
        names.add(g.name)
        if g.instance_type not in known_gpu_types():
            hint = " (a CPU type: use system_node_group)" if g.instance_type in INSTANCE_TYPES else ""
            raise ctx.fail(f"{where}.instance_type", g.instance_type,
                           f"is not a known GPU instance type{hint} (known: {', '.join(known_gpu_types())})")
        if g.min_nodes < 0:
            raise ctx.fail(f"{where}.min_nodes", g.min_nodes, "must be >= 0")
        if g.max_nodes < 1:
            raise ctx.fail(f"{where}.max_nodes", g.max_nodes, "must be >= 1")
        if not g.min_nodes <= g.desired_nodes <= g.max_nodes:
            raise ctx.fail(f"{where}.desired_nodes", g.desired_nodes,
                           f"must be between min_nodes ({g.min_nodes}) and max_nodes ({g.max_nodes})")
        if not 50 <= g.root_volume_gib <= 16384:
            raise ctx.fail(f"{where}.root_volume_gib", g.root_volume_gib,
                           "must be between 50 and 16384 (the DLC image alone is tens of GB)")
        if g.capacity not in CAPACITY:
            raise ctx.fail(f"{where}.capacity", g.capacity, f"is not allowed (allowed: {', '.join(CAPACITY)})")
        if g.capacity == "on-demand" and g.capacity_reservation_id:
            raise ctx.fail(f"{where}.capacity_reservation_id", g.capacity_reservation_id,
                           "must be empty for on-demand capacity (set capacity to capacity-reservation or capacity-block)")
        if g.capacity != "on-demand" and not re.fullmatch(r"cr-[0-9a-f]{17}", g.capacity_reservation_id):
            raise ctx.fail(f"{where}.capacity_reservation_id", g.capacity_reservation_id,
                           f"is not a capacity reservation id (cr- and 17 hex digits), required for {g.capacity}")
    for name, version in env.versions.charts:
        if not _SEMVER.fullmatch(version):
            raise ctx.fail(f"versions.{name}", version, "is not a pinned version (e.g. 1.7.0)")
    im = env.image
    if not re.fullmatch(r"[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+", im.repository):
        raise ctx.fail("image.repository", im.repository, "is not registry/name (e.g. public.ecr.aws/deep-learning-containers/ray)")
    if not re.fullmatch(r"[\w][\w.-]{0,127}", im.tag):
        raise ctx.fail("image.tag", im.tag, "is not a valid image tag")
    if im.digest and not DIGEST_PATTERN.fullmatch(im.digest):
        raise ctx.fail("image.digest", im.digest, "is not sha256:<64 hex digits> (or empty until `raytrain-eks lock`)")
    if not re.fullmatch(r"\d+\.\d+\.\d+", im.ray_version):
        raise ctx.fail("image.ray_version", im.ray_version, "is not a Ray version (e.g. 2.58.0)")
    if not re.fullmatch(r"3\.\d+", im.python_version):
        raise ctx.fail("image.python_version", im.python_version, "is not a Python version (e.g. 3.13)")
    st = env.storage
    if st.bucket_name and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", st.bucket_name):
        raise ctx.fail("storage.bucket_name", st.bucket_name, "is not a valid S3 bucket name (3-63 of a-z 0-9 . -)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]|[A-Za-z0-9]", st.prefix) or "//" in st.prefix:
        raise ctx.fail("storage.prefix", st.prefix, "is not a key prefix (letters, digits, . _ - /, no leading or trailing /)")
    for i, ro in enumerate(st.read_only_prefixes):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", ro) or ro == st.prefix:
            raise ctx.fail(f"storage.read_only_prefixes[{i}]", ro,
                           f"is not a top-level key prefix other than storage.prefix ({st.prefix!r})")
    if CODE_PREFIX not in st.read_only_prefixes:
        raise ctx.fail("storage.read_only_prefixes", list(st.read_only_prefixes),
                       f"must include {CODE_PREFIX!r} (the training code archive every RayJob reads)")
    if not 1 <= st.noncurrent_version_days <= 3650:
        raise ctx.fail("storage.noncurrent_version_days", st.noncurrent_version_days, "must be between 1 and 3650")
    r = env.ray
    for name in ("namespace", "service_account"):
        if not _DNS_LABEL.fullmatch(getattr(r, name)):
            raise ctx.fail(f"ray.{name}", getattr(r, name), "is not a Kubernetes name (lower-case letters, digits, '-')")
    if r.namespace in ("kube-system", "kube-public", "default"):
        raise ctx.fail("ray.namespace", r.namespace, "is reserved: use a namespace of its own (e.g. ray)")
    p = env.pipeline
    if p.connection_arn and not re.fullmatch(r"arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}", p.connection_arn):
        raise ctx.fail("pipeline.connection_arn", p.connection_arn, "is not a CodeConnections connection ARN (or empty: no pipeline)")
    if p.connection_arn and not re.fullmatch(r"[\w.-]+/[\w.-]+", p.repository):
        raise ctx.fail("pipeline.repository", p.repository, "is not owner/name (required with pipeline.connection_arn)")
    if not re.fullmatch(r"(rate\(\d+ (minute|minutes|hour|hours|day|days)\)|cron\(.+\))", p.watch_schedule):
        raise ctx.fail("pipeline.watch_schedule", p.watch_schedule, "is not an EventBridge schedule (rate(6 hours) or cron(...))")
