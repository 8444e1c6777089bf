"""The engine's two error types, and the "did you mean" line for an unknown key."""
from __future__ import annotations

import difflib
from typing import Any, Iterable


class SchemaError(ValueError):
    """A user error in a TOML file; ``str(err)`` is the one line to print. Each file kind has
    its own subclass (environment.SpecError, training.config.JobConfigError)."""


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


def unknown(key: str, known: Iterable[str], what: str = "field") -> FieldError:
    """``key`` is not one of ``known``: the list, and the closest name when there is one."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return FieldError(key, key, f"is not a known {what} (known: {', '.join(known)}{hint})")
