"""A netcheck run copied out of storage: its table, its plot (``netcheck.png`` beside
``netcheck.json``: bus bandwidth by message size, one line per scope, collective and mode) and
its verdict's exit code."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.contract import NETCHECK_NAME

PLOT_NAME = "netcheck.png"


def plot(record: dict[str, Any], out: Path) -> Path:
    """busbw (GB/s) against message size (log2), one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.netcheck.worker import COLLECTIVES

    fig, axes = plt.subplots(1, len(COLLECTIVES), figsize=(5 * len(COLLECTIVES), 4), dpi=100, squeeze=False)
    link = (record["verdict"].get("figures") or {}).get("link_gbs")
    for ax, collective in zip(axes[0], COLLECTIVES):
        for mode, result in record["modes"].items():
            scopes = sorted({r["scope"] for r in result["rows"]})
            for scope in scopes:
                points = sorted((r["bytes"], r["busbw_gbs"]) for r in result["rows"]
                                if r["scope"] == scope and r["collective"] == collective)
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, marker="o", markersize=3, linestyle="-" if mode == "nccl" else "--",
                            label=f"{scope} {mode} ({result['evidence'].get('transport')})")
        if link:
            ax.axhline(link, color="grey", linewidth=0.8, label=f"link {link:g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(collective)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"netcheck: {record['verdict']['verdict']}")
    fig.tight_layout()
    target = out / PLOT_NAME
    fig.savefig(target)
    plt.close(fig)
    return target


def summary_text(summary: dict[str, Any] | None) -> str | None:
    """run.json's ``netcheck`` (a run that measured the network first) as one report cell."""
    if not summary:
        return None
    f = summary.get("figures") or {}
    parts = [str(summary.get("verdict", "?")).upper(), f"transport {f.get('transport', '?')}"]
    for key, label, unit in (("inter_busbw_gbs", "inter-node all-reduce busbw", " GB/s"),
                             ("intra_busbw_gbs", "intra-node", " GB/s")):
        if f.get(key) is not None:
            parts.append(f"{label} {f[key]:.2f}{unit}")
    if f.get("link_ratio") is not None:
        node = f.get("inter_node_busbw_gbs")
        parts.append((f"{node:.2f} GB/s through each node's link, " if node is not None else "")
                     + f"{f['link_ratio']:.0%} of the link")
    if f.get("efa_over_socket") is not None:
        parts.append(f"{f['efa_over_socket']:.1f}x sockets")
    return ", ".join(parts)


def finish(out_dir: Path, say=print) -> int:
    """Print the table, draw the plot, say the verdict; returns its exit code."""
    from training.netcheck.judge import headline
    from training.netcheck.judge import table

    record = json.loads((out_dir / NETCHECK_NAME).read_text(encoding="utf-8"))
    say(table(record))
    say(f"    netcheck:  {out_dir / NETCHECK_NAME}")
    say(f"    plot:      {plot(record, out_dir)}")
    say(f"    verdict:   {headline(record['verdict'])}")
    return int(record["verdict"]["exit_code"])
