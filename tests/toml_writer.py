"""A tiny TOML writer for the environment spec's shapes (tables, arrays of tables, scalars,
lists): tests and benchmarks write spec variants with it (tomllib only reads)."""
from __future__ import annotations

import json


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    return json.dumps(v)


def toml_text(raw: dict) -> str:
    """``raw`` (section -> table, or section -> list of tables) as TOML text."""
    lines = []
    for section, body in raw.items():
        tables = body if isinstance(body, list) else [body]
        for table in tables:
            lines.append(f"[[{section}]]" if isinstance(body, list) else f"[{section}]")
            lines += [f"{k} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
