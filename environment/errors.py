"""The two error types of the environment package.

A section (environment/model.py) knows its own fields, not the file it came from: it raises a
:class:`FieldError` naming the field relative to itself. The loader (the schema engine,
spec_schema/) prefixes the file name and the section path and raises :class:`SpecError`, the
one line a user sees.
"""
from __future__ import annotations

from spec_schema import FieldError, SchemaError

__all__ = ["FieldError", "SpecError"]


class SpecError(SchemaError):
    """A user error in the environment spec; ``str(err)`` is the one line to print."""
