"""The netcheck record as text: bus bandwidth by size, one column per mode (standard library)."""
from __future__ import annotations

from typing import Any


def table(record: dict[str, Any]) -> str:
    """One line per (scope, collective, size): busbw in GB/s of each mode, and their ratio."""
    modes = list(record["modes"])
    cells: dict[tuple[str, str, int], dict[str, float]] = {}
    for mode, result in record["modes"].items():
        for row in result["rows"]:
            cells.setdefault((row["scope"], row["collective"], row["bytes"]), {})[mode] = row["busbw_gbs"]
    head = f"{'scope':<6} {'collective':<15} {'bytes':>11} " + " ".join(f"{m + ' GB/s':>12}" for m in modes)
    lines = [head + ("  ratio" if len(modes) == 2 else "")]
    for (scope, collective, size), by_mode in cells.items():
        values = [by_mode.get(m) for m in modes]
        text = " ".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
        ratio = f"  {values[0] / values[1]:.2f}" if len(values) == 2 and values[0] and values[1] else ""
        lines.append(f"{scope:<6} {collective:<15} {size:>11} {text}{ratio}")
    transports = ", ".join(f"{m}: {r['evidence'].get('transport')}" for m, r in record["modes"].items())
    lines.append(f"transport: {transports}")
    return "\n".join(lines)
