"""A tiny TOML writer for the environment spec's shapes (tables, arrays of tables, scalars,
lists, inline tables): tests and benchmarks write spec variants with it (tomllib only reads)."""
from __future__ import annotations

import json
import re

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else json.dumps(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    if isinstance(v, dict):  # an inline table (e.g. queueing.priorities)
        return "{" + ", ".join(f"{_key(k)} = {_value(i)}" for k, i in v.items()) + "}"
    return json.dumps(v)


def toml_text(raw: dict) -> str:
    """``raw`` (section -> table, or section -> list of tables) as TOML text."""
    lines = []
    for section, body in raw.items():
        tables = body if isinstance(body, list) else [body]
        for table in tables:
            lines.append(f"[[{section}]]" if isinstance(body, list) else f"[{section}]")
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
