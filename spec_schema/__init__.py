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
from spec_schema.engine import build_section, check_keys, read_toml
from spec_schema.errors import FieldError, SchemaError, unknown

__all__ = ["FieldError", "SchemaError", "build_section", "check_keys", "read_toml", "unknown"]
