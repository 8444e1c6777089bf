"""The prose and marks of a report: the verdict it leads with, checkpoint and eval steps on the
plots, and for two runs the factor that differs and one paragraph on what it did to throughput
and held-out loss.

A "factor" is a leaf of the inputs that can change a result: the job config (minus names and
storage locations, which differ between any two runs), the image, the code, the spec, the
cluster shape and the transport seen. Runs are labelled by it (``A (train.lr=0.003)``), so a
plot legend says what was varied rather than two run names.
"""
from __future__ import annotations

from typing import Any

from training.contract import STEP
from training.verdict import headline, of_record

_NOT_FACTORS = ("name", "description", "checkpoint.run_name", "checkpoint.storage_path")
_OTHER_FACTORS = (("image", ("image",)), ("code", ("code_hash", "ran")), ("environment spec", ("spec_hash",)),
                  ("transport", ("transport", "transport")), ("world size", ("cluster", "world_size")),
                  ("instance type", ("cluster", "instance_type")))


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _get(record: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        record = record.get(key) if isinstance(record, dict) else None
    return record


def factors(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(factor, A's value, B's value)`` for every input that differs between two records."""
    config_a, config_b = _flat(a.get("job_config") or {}), _flat(b.get("job_config") or {})
    found = [(f"{key}", config_a.get(key), config_b.get(key)) for key in sorted(set(config_a) | set(config_b))
             if key not in _NOT_FACTORS and config_a.get(key) != config_b.get(key)]
    for name, path in _OTHER_FACTORS:
        va, vb = _get(a, path), _get(b, path)
        if va != vb:
            found.append((name, va, vb))
    return found


def letter(index: int) -> str:
    """A run's column label: A, B, ... Z, then 27, 28, ..."""
    return chr(ord("A") + index) if index < 26 else str(index + 1)


def factor_columns(runs: list[Any]) -> list[tuple[str, list[Any]]]:
    """``(factor, each run's value)`` for every input that differs between any run and the first."""
    keys: list[str] = []
    for run in runs[1:]:
        keys += [key for key, _, _ in factors(runs[0].record, run.record) if key not in keys]
    other = dict(_OTHER_FACTORS)
    return [(key, [_get(run.record, other[key]) if key in other else _flat(run.record.get("job_config") or {}).get(key)
                   for run in runs]) for key in keys]


def labels(runs: list[Any]) -> list[str]:
    """``A (factor=value)`` per run when exactly one factor differs, else ``A run-name``."""
    if len(runs) == 1:
        return [runs[0].name]
    columns = factor_columns(runs)
    if len(columns) == 1:
        key, values = columns[0]
        return [f"{letter(i)} ({key}={value})" for i, value in enumerate(values)]
    return [f"{letter(i)} {run.name}" for i, run in enumerate(runs)]


def factor_table(runs: list[Any], throughput: list[dict], evals: list[tuple]) -> list[str]:
    """Three or more runs: one row per run, the factors that differ as columns, then the outcome."""
    columns = factor_columns(runs)
    head = ["run", *[f"`{key}`" for key, _ in columns], "verdict", "tokens/s", "held-out loss after"]
    lines = ["## What changed", "", f"{len(columns)} factor(s) differ between the runs.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, run in enumerate(runs):
        verdict = (of_record(run.record) or {}).get("verdict", "none")
        tput, after = throughput[i].get("tokens_per_s"), evals[i][1]
        cells = [f"{letter(i)} {run.name}", *[str(values[i]) for _, values in columns], verdict,
                 "n/a" if tput is None else f"{tput:,.4g}", "n/a" if after is None else f"{after:.4f}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines + [""]


def verdict_lines(runs: list[Any]) -> list[str]:
    """The report's first lines: each run's verdict."""
    if len(runs) == 1:
        return [f"**Verdict: {headline(of_record(runs[0].record))}**", ""]
    return [f"**Verdict {letter(i)}: {headline(of_record(run.record))}**  " for i, run in enumerate(runs)] + [""]


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "cannot be compared (a figure is missing)"
    if before == after:
        return f"is unchanged ({after:.4g})"
    pct = f" ({100 * (after - before) / before:+.1f}%)" if before else ""
    return f"goes from {before:,.4g} to {after:,.4g}{pct}"


def comparison_paragraph(runs: list[Any], throughput: list[dict], evals: list[tuple]) -> list[str]:
    """One paragraph: what changed between A and B, and its effect on throughput and eval."""
    found = factors(runs[0].record, runs[1].record)
    if not found:
        what = "Nothing that shapes a run differs between A and B (same config, image, code, spec, cluster)"
    elif len(found) == 1:
        key, va, vb = found[0]
        what = f"B differs from A in one factor, `{key}`: {va} -> {vb}"
    else:
        shown = ", ".join(f"`{k}` ({va} -> {vb})" for k, va, vb in found[:4])
        what = (f"{len(found)} factors differ ({shown}{', ...' if len(found) > 4 else ''}), so no single one can "
                "be credited with the differences below")
    tput = [t.get("tokens_per_s") for t in throughput]
    after = [e[1] for e in evals]
    gain = [e[0] - e[1] if e[0] is not None and e[1] is not None else None for e in evals]
    verdicts = [(of_record(run.record) or {}).get("verdict", "none") for run in runs]
    text = (f"{what}. Steady-state throughput {_change(*tput)} tokens/s; the held-out loss after training "
            f"{_change(*after)}, an improvement over its start of "
            f"{' vs '.join('n/a' if g is None else f'{g:.4f}' for g in gain)} (A vs B). "
            f"Verdicts: A {verdicts[0]}, B {verdicts[1]}.")
    if tput[0] and tput[1] and found and all(k.startswith(("train.seed", "data.seed", "train.lr")) for k, _, _ in found):
        text += (" This factor does not change the work per step, so a throughput difference here is run-to-run "
                 "noise of the machine, not an effect of the change.")
    return ["## What changed", "", text, ""]


def marker_steps(run: Any) -> dict[str, list[int]]:
    """Steps where a checkpoint was written and where the held-out loss was measured."""
    ckpts = [c.get("step") for c in run.record.get("checkpoints") or [] if isinstance(c, dict)]
    return {"checkpoint": sorted({s for s in ckpts if isinstance(s, int)}),
            "eval": sorted({r[STEP] for r in run.evals if isinstance(r.get(STEP), int)})}


def mark_steps(ax: Any, runs: list[Any]) -> None:
    """Eval steps as dashed vertical lines, checkpoint steps as triangles on the top edge (they
    often coincide with eval steps; two line styles on one x would hide one of them)."""
    steps = {kind: sorted({s for run in runs for s in marker_steps(run)[kind]}) for kind in ("checkpoint", "eval")}
    for index, step in enumerate(steps["eval"]):
        ax.axvline(step, linestyle="--", color="tab:purple", alpha=0.4, linewidth=1,
                   label="eval steps" if index == 0 else None)
    resumes = sorted({s for run in runs for s in getattr(run, "resumes", [])})
    for index, step in enumerate(resumes):
        # Drawn where the restarted attempt logged again: the steps right of it are its writes.
        ax.axvline(step, linestyle="-", color="tab:red", alpha=0.6, linewidth=1.5,
                   label="resumed here" if index == 0 else None)
    if steps["checkpoint"]:
        ax.plot(steps["checkpoint"], [1.0] * len(steps["checkpoint"]), linestyle="none", marker="v", markersize=8,
                color="tab:green", transform=ax.get_xaxis_transform(), clip_on=False, label="checkpoint steps")
