"""Kubernetes JSON -> the classes generated from the KubeRay CRDs (charts/imports/).

The charts write specs as plain camelCase dictionaries (what the YAML shows, easy to read and
to test) and convert them here. The generated class names follow the JSON path
(``RayJobSpec`` + ``RayClusterSpec`` + ``WorkerGroupSpecs`` + ...), so ONE dictionary from
:func:`charts.cluster_spec.ray_cluster_spec` becomes a ``RayClusterSpec`` for the RayCluster
kind or a ``RayJobSpecRayClusterSpec`` inside a RayJob, depending only on where it is placed.
The classes check every field name and type: a misspelled or mistyped field fails synth.
"""
from __future__ import annotations

import enum
import re
from typing import Any

from charts.imports.io import ray as generated

_QUANTITY_KEYS = {"limits", "requests"}
"""Maps of int-or-string quantities: one generated class per JSON path, built from strings."""
_QUANTITY_FIELDS = {"sizeLimit"}
"""Single int-or-string quantities (an emptyDir's ``sizeLimit``), built from their string."""
_STRING_MAP_KEYS = {"labels", "annotations", "nodeSelector", "rayStartParams", "clusterSelector"}
"""Maps of user data whose keys are not field names (they keep their spelling)."""


def _enum_member(cls: type[enum.Enum], path: str, value: str) -> enum.Enum:
    """A CRD enum value (``token``) as the generated member (``TOKEN``, serialised back as ``token``)."""
    wanted = re.sub(r"[^a-z0-9]", "", value.lower())
    for member in cls:
        if re.sub(r"[^a-z0-9]", "", member.name.lower()) == wanted:
            return member
    raise TypeError(f"{path}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}")


def to_bindings(path: str, value: Any) -> Any:
    """Convert ``value`` (JSON at the binding class ``path``, e.g. ``"RayJobSpec"``)."""
    if isinstance(value, list):
        return [to_bindings(path, item) for item in value]
    if not isinstance(value, dict):
        cls = getattr(generated, path, None)
        if isinstance(value, str) and isinstance(cls, type) and issubclass(cls, enum.Enum):
            return _enum_member(cls, path, value)
        return value
    cls = getattr(generated, path, None)
    if cls is None:
        raise TypeError(f"no generated binding {path}: a misspelled field in charts/?")
    # The generated struct's own map of Python name -> property name, reversed. Property names
    # lower-case acronyms (runtimeEnvYAML -> runtimeEnvYaml; the generated toJson restores the
    # CRD's spelling), so they are matched without case.
    python_names = {prop.lower(): py for py, prop in cls.__jsii_name_mapping__.items()}
    kwargs = {}
    for key, item in value.items():
        if key.lower() not in python_names:
            raise TypeError(f"{path}: {key!r} is not a field (fields: {', '.join(sorted(cls.__jsii_name_mapping__.values()))})")
        python_name = {key: python_names[key.lower()]}
        child = path + key[0].upper() + key[1:]
        if key in _QUANTITY_KEYS:
            kwargs[python_name[key]] = {k: getattr(generated, child).from_string(v) for k, v in item.items()}
        elif key in _QUANTITY_FIELDS:
            kwargs[python_name[key]] = getattr(generated, child).from_string(item)
        elif key in _STRING_MAP_KEYS:
            kwargs[python_name[key]] = dict(item)
        else:
            kwargs[python_name[key]] = to_bindings(child, item)
    return cls(**kwargs)
