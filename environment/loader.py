"""Read environment.toml into :class:`environment.model.Environment`, refusing every user error with one
line: ``<file>: <field>: <bad value> <what is allowed>``. Unknown keys are errors, so a typo is
never silently ignored.

The schema engine (spec_schema/) checks the file's SHAPE against the sections' dataclasses
(known sections and keys, TOML types); each section's own rules live with it in
environment/model.py and environment/cluster.py (``__post_init__``), and rules across sections
in ``Environment.__post_init__``. Only the two tables whose keys are names rather than fields
(``[versions]``: add-on keys, ``[prices]``: instance types) parse themselves here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from environment.addons import ADDONS_BY_KEY
from environment.errors import FieldError, SpecError
from environment.model import Environment, VersionsSpec
from spec_schema import build_section, check_keys, read_toml

__all__ = ["SpecError", "environment_from_dict", "load_environment"]


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
