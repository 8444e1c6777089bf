"""Read environment.toml into :class:`environment.model.Environment`, refusing every user error with one
line: ``<file>: <field>: <bad value> <what is allowed>``. Unknown keys are errors, so a typo is
never silently ignored.

This module checks the file's SHAPE (known sections and keys, TOML types); each section's own
rules live with it in environment/model.py (``__post_init__``), and rules across sections in
``Environment.__post_init__``. A section raises :class:`FieldError` naming its field; the
loader prefixes the file and the section path.
"""
from __future__ import annotations

import dataclasses
import difflib
import tomllib
from pathlib import Path
from typing import Any, Mapping

from environment.addons import ADDONS_BY_KEY
from environment.errors import FieldError, SpecError
from environment.model import (
    ClusterSpec, Environment, GpuNodeGroupSpec, ImageSpec, ObservabilitySpec, PipelineSpec, RaySpec,
    StorageSpec, SystemNodeGroupSpec, VersionsSpec,
)

__all__ = ["SpecError", "environment_from_dict", "load_environment"]

_SECTIONS: dict[str, type] = {
    "cluster": ClusterSpec, "system_node_group": SystemNodeGroupSpec,
    "image": ImageSpec, "storage": StorageSpec, "ray": RaySpec, "pipeline": PipelineSpec,
    "observability": ObservabilitySpec,
}
_CHECKS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "tuple[str, ...]": (lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v), "a list of strings"),
}


def _fail(source: str, where: str, value: Any, allowed: str) -> SpecError:
    return SpecError(f"{source}: {where}: {value!r} {allowed}")


def _unknown(source: str, where: str, key: str, known: set[str] | dict, what: str) -> SpecError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return _fail(source, where, key, f"is not a known {what} (known: {', '.join(sorted(known))}{hint})")


def _section(source: str, cls: type, table: Any, prefix: str) -> Any:
    if not isinstance(table, dict):
        raise _fail(source, prefix, table, "is not allowed (expected a table)")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = {n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for key in table:
        if key not in fields:
            raise _unknown(source, f"{prefix}.{key}", key, fields, "field")
    for key in sorted(required - set(table)):
        raise SpecError(f"{source}: {prefix}.{key}: missing (required)")
    values = {}
    for key, value in table.items():
        ok, expected = _CHECKS[str(fields[key].type)]
        if not ok(value):
            raise _fail(source, f"{prefix}.{key}", value, f"is not allowed (expected {expected})")
        values[key] = tuple(value) if isinstance(value, list) else value
        if str(fields[key].type) == "float":
            values[key] = float(value)
    try:
        return cls(**values)
    except FieldError as err:
        raise SpecError(err.line(source, prefix)) from None


def _versions(source: str, table: Any) -> VersionsSpec:
    """``[versions]``: one pinned chart version per add-on key of the add-on table."""
    if not isinstance(table, dict):
        raise _fail(source, "versions", table, "is not allowed (expected a table)")
    for key, value in table.items():
        if key not in ADDONS_BY_KEY:
            raise _unknown(source, f"versions.{key}", key, ADDONS_BY_KEY, "add-on")
        if not isinstance(value, str):
            raise _fail(source, f"versions.{key}", value, "is not allowed (expected a string)")
    try:
        return VersionsSpec(charts=tuple(sorted(table.items())))
    except FieldError as err:
        raise SpecError(err.line(source, "versions")) from None


def environment_from_dict(raw: Mapping[str, Any], source: str = "environment.toml") -> Environment:
    known = set(_SECTIONS) | {"gpu_node_groups", "prices", "versions"}
    for key in raw:
        if key not in known:
            raise _unknown(source, key, key, known, "section")
    if "cluster" not in raw:
        raise SpecError(f"{source}: cluster: missing (required section)")
    kwargs: dict[str, Any] = {"source": source}
    for key, cls in _SECTIONS.items():
        if key in raw:
            kwargs[key] = _section(source, cls, raw[key], key)
    if "versions" in raw:
        kwargs["versions"] = _versions(source, raw["versions"])
    groups = raw.get("gpu_node_groups", [])
    if not isinstance(groups, list) or not groups:
        raise _fail(source, "gpu_node_groups", groups, "must be a non-empty list of [[gpu_node_groups]] tables")
    kwargs["gpu_node_groups"] = tuple(
        _section(source, GpuNodeGroupSpec, g, f"gpu_node_groups[{i}]") for i, g in enumerate(groups))
    prices = raw.get("prices", {})
    if not isinstance(prices, dict):
        raise _fail(source, "prices", prices, "is not allowed (expected a table of instance type = USD/hour)")
    for name, price in prices.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)):
            raise _fail(source, f"prices.{name}", price, "must be a positive number (USD per hour)")
    kwargs["prices"] = tuple(sorted(prices.items()))
    try:
        return Environment(**kwargs)
    except FieldError as err:
        raise SpecError(err.line(source)) from None


def load_environment(path: str | Path = "environment.toml") -> Environment:
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{source}: file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{source}: is a directory, not an environment file") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{source}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise SpecError(f"{source}: cannot be read ({err.strerror or err})") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{source}: not valid TOML: {err}") from None
    return environment_from_dict(raw, source)
