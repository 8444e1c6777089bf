"""The two error types of the environment package.

A section (environment/model.py) knows its own fields, not the file it came from: it raises a
:class:`FieldError` naming the field relative to itself. The loader prefixes the file name and
the section path and raises :class:`SpecError`, the one line a user sees.
"""
from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """A user error in the environment spec; ``str(err)`` is the one line to print."""


class FieldError(ValueError):
    """A bad value in one field of a section: ``field`` is relative to the section
    (``capacity``, ``availability_zones[1]``), or absolute for a check across sections."""

    def __init__(self, field: str, value: Any, allowed: str):
        super().__init__(f"{field}: {value!r} {allowed}")
        self.field, self.value, self.allowed = field, value, allowed

    def line(self, source: str, prefix: str = "") -> str:
        """``<source>: <prefix>.<field>: <value> <allowed>``: the user's one line."""
        where = f"{prefix}.{self.field}" if prefix else self.field
        return f"{source}: {where}: {self.value!r} {self.allowed}"
