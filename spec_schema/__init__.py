"""One schema engine for the repository's two TOML files: ``environment.toml`` (environment/) and
``jobs/*.toml`` (training/config.py).

A file is a tree of typed sections: frozen, keyword-only dataclasses whose fields are the keys.
The engine checks the SHAPE (known keys with a "did you mean", required keys, TOML types, a
finite number, a list of strings); each section owns its RULES in ``__post_init__`` and raises
:class:`FieldError` naming its own field; the engine prefixes the file and the section path, so
a user sees one line: ``<file>: <field>: <bad value> <what is allowed>``. Reading the file (missing,
a directory, not UTF-8, not TOML) is written once too: :func:`read_toml`.

Standard library only, and it imports nothing of the repository: ``environment`` and ``training``
(both standard-library-only where they parse) sit above it, and it ships in the job's code
archive (training.contract.CODE_DIRS).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import tomllib
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

__all__ = ["FieldError", "SchemaError", "build_section", "check_keys", "read_toml", "unknown"]


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

Parser = Callable[[Any, str], Any]
"""A field with a shape of its own (a table of versions, of prices): ``(value, where) -> value``,
raising :class:`FieldError` (its field relative to ``where``'s section)."""


def read_toml(path: str | Path, error: type[SchemaError], example: str) -> dict[str, Any]:
    """The file as a table, or ``error`` with one line naming the file and what is wrong with
    it. ``example`` names a file of the right kind (a directory given by mistake)."""
    source = str(path)
    try:
        # utf-8-sig: an editor's byte-order mark is no reason to refuse a file
        return tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise error(f"{source}: file not found") from None
    except IsADirectoryError:
        raise error(f"{source}: is a directory, not a file (e.g. {example})") from None
    except UnicodeDecodeError as err:
        raise error(f"{source}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise error(f"{source}: cannot be read ({err.strerror or err})") from None
    except tomllib.TOMLDecodeError as err:
        raise error(f"{source}: not valid TOML: {err}") from None


def _where(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _scalar(kind: Any, value: Any) -> tuple[bool, Any, str]:
    """(fits, converted value, what is expected) of one TOML value against a field type."""
    if kind is bool:
        return isinstance(value, bool), value, "true or false"
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool), value, "an integer"
    if kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False, value, "a number"
        # TOML has nan and inf; no field of either file means them, and nan passes every bound.
        return math.isfinite(value), float(value), "a finite number"
    if kind is str:
        return isinstance(value, str), value, "a string"
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple and args[1:] == (Ellipsis,) and args[0] is str:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return ok, tuple(value) if ok else value, "a list of strings"
    if origin is collections.abc.Mapping:
        return isinstance(value, dict), dict(value) if isinstance(value, dict) else value, "a table"
    raise TypeError(f"unsupported field type {kind!r}")  # a bug in a section, not a user error


def check_keys(table: Mapping[str, Any], known: Any, prefix: str, what: str = "field") -> None:
    """Refuse the first key of ``table`` that is not in ``known`` (with a "did you mean")."""
    for key in table:
        if key not in known:
            err = unknown(key, known, what)
            raise FieldError(_where(prefix, key), key, err.allowed)


def _value(kind: Any, value: Any, where: str, source: str, error: type[SchemaError],
           parsers: Mapping[str, Parser]) -> Any:
    if dataclasses.is_dataclass(kind):
        return build_section(kind, value, source=source, prefix=where, error=error, parsers=parsers)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple and args[1:] == (Ellipsis,) and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise FieldError(where, value, f"is not allowed (expected a list of [[{where}]] tables)")
        return tuple(build_section(args[0], v, source=source, prefix=f"{where}[{i}]", error=error, parsers=parsers)
                     for i, v in enumerate(value))
    fits, converted, expected = _scalar(kind, value)
    if not fits:
        raise FieldError(where, value, f"is not allowed (expected {expected})")
    return converted


def build_section(cls: type, table: Any, *, source: str, prefix: str = "", error: type[SchemaError],
                  parsers: Mapping[str, Parser] | None = None, extra: Mapping[str, Any] | None = None,
                  what: str = "field") -> Any:
    """``cls`` built from one TOML table, its nested sections included; any problem (shape here,
    rules in the sections' ``__post_init__``) is ``error`` with one line naming
    ``<source>: <prefix>.<field>``. ``parsers``: fields by absolute dotted name that parse
    themselves; ``extra``: keyword arguments that do not come from the file (``source``);
    ``what``: what this table's keys are called in an error (``field``, ``section``)."""
    parsers = parsers or {}
    extra = dict(extra or {})
    try:
        if not isinstance(table, dict):
            raise FieldError(prefix, table, "is not allowed (expected a table)")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in extra}
        check_keys(table, fields, prefix, what)
        for name, f in fields.items():
            if name not in table and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise error(f"{source}: {_where(prefix, name)}: missing (required{' section' if what == 'section' else ''})")
        hints = typing.get_type_hints(cls)
        values = {}
        for key, value in table.items():
            where = _where(prefix, key)
            if where in parsers:
                values[key] = parsers[where](value, where)
            else:
                values[key] = _value(hints[key], value, where, source, error, parsers)
        for name in fields.keys() - table.keys():
            # An absent section is its defaults, judged by its own rules under its own name.
            if dataclasses.is_dataclass(hints[name]) and _where(prefix, name) not in parsers:
                values[name] = build_section(hints[name], {}, source=source, prefix=_where(prefix, name),
                                             error=error, parsers=parsers)
    except FieldError as err:  # the field already carries its path
        raise error(err.line(source)) from None
    try:
        return cls(**values, **extra)
    except FieldError as err:  # a section's own rule: its field is relative to the section
        raise error(err.line(source, prefix)) from None
