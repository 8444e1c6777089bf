"""Render a run (or several side by side) as Markdown plus PNG plots, from its run directory alone.

A run directory (local or ``s3://``) holds ``run.json`` (training/run_record.py) and
``metrics.jsonl`` (``train`` rows, ``eval`` rows and one ``summary`` row; every key is named in
:mod:`training.contract`). Missing keys, files or
values are tolerated: what is absent is said, not drawn.

metrics.jsonl is read by step (:func:`by_step`): one row per step, the last write wins, and the
report says where a run resumed. The job appends to ``metrics.jsonl`` for the whole life of a run
directory. When an attempt dies and Ray Train restarts the workers from the last complete
checkpoint (or a later submit resumes the run by name), the steps after that checkpoint are
trained and logged again, so the file's order is not the steps' order: step 15, then 11, 12, ...
A reader that takes the file order draws a zigzag and pairs step 11 of one run with step 16 of
another. Every reader of the metrics (the report's tables and plots, ``reproduce --against``)
goes through :func:`load_run`.

Two runs: every difference between the records is listed, grouped by what it can explain:
inputs (image, code, spec, config, cluster, versions), run-time conditions (transport, hosts),
outcomes (throughput, eval, status) and identity (names and times, which always differ).

The command (``add_arguments`` and ``run``, at the end of this module): `raytrain-eks report RUN_DIR [RUN_DIR ...]`: a run as Markdown + PNG plots, or several side by side.

RUN_DIR is a run's directory in storage (local or s3://) holding run.json and metrics.jsonl.
The report leads with the verdict. With two runs it labels them by the factor that differs,
says in one paragraph what that did to throughput and held-out loss, and lists every difference
in their records (image, code, config, cluster, versions, transport). With three or more, one
row per run with the factors that differ as columns, its verdict, throughput and held-out loss.

Exit codes for one run: its verdict's (0 accepted, 3 rejected, 1 execution-failed, 4 no verdict
yet); 0 for a comparison; 2 when a run cannot be read.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytrain_eks.runs.listing import cost_text
from training import contract, incidents
from training.contract import METRICS_NAME, RECORD_NAME
from training.storage.files import read_bytes, read_json

PLOTS = (  # file stem, metric key, y label
    ("loss", contract.LOSS, "training loss"),
    ("eval", contract.EVAL_LOSS, "held-out loss"),
    ("tokens_per_s", contract.TOKENS_PER_S, "tokens/s (all devices)"),
    ("mfu", contract.MFU, "MFU"),
)
RUNTIME = ("transport", "hosts", "ranks", "nccl_logs", "attempts", "incidents")
OUTCOMES = ("status", "exit_code", "error", "throughput", "eval", "checkpoints", "duration_s", "verdict", "failure",
            "reproducibility", "cost")
IDENTITY = ("run_dir", "start_time", "end_time")


@dataclass(kw_only=True)
class Run:
    """One run directory: its record and its metrics rows."""

    source: str
    record: dict[str, Any] = field(default_factory=dict)
    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)
    """The first step each resumed attempt logged again (:func:`by_step`)."""

    @property
    def name(self) -> str:
        config = self.record.get("job_config") or {}
        ckpt = config.get("checkpoint") or {}
        return ckpt.get("run_name") or config.get("name") or Path(self.source.rstrip("/")).name


def _read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def by_step(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """``(rows, resumes)``: one row per step in step order, the row written last for a step
    winning (it is what the finished run's weights came from), and the first step each later
    attempt logged (a step at or below the step logged before it). Rows without a step keep
    their order after the stepped ones."""
    latest: dict[int, dict[str, Any]] = {}
    unstepped: list[dict[str, Any]] = []
    resumes: list[int] = []
    previous: int | None = None
    for row in rows:
        step = row.get(contract.STEP)
        if not isinstance(step, int) or isinstance(step, bool):
            unstepped.append(row)
            continue
        if previous is not None and step <= previous:
            resumes.append(step)
        latest[step] = row
        previous = step
    return [latest[s] for s in sorted(latest)] + unstepped, resumes


def load_run(run_dir: str) -> Run:
    """Read run.json and metrics.jsonl; a missing or bad line becomes a note, not an error."""
    base = run_dir.rstrip("/")
    run = Run(source=base)
    try:
        run.record = read_json(f"{base}/{RECORD_NAME}")
    except (OSError, ValueError) as err:
        run.notes.append(f"no readable {RECORD_NAME}: {err}")
    try:
        text = _read_text(f"{base}/{METRICS_NAME}")
    except OSError as err:
        run.notes.append(f"no readable {METRICS_NAME}: {err}")
        text = ""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            run.notes.append(f"{METRICS_NAME} line {number} is not JSON: skipped")
            continue
        if contract.EVAL_LOSS in row or row.get(contract.KIND) == contract.KIND_EVAL:
            run.evals.append(row)
        elif contract.LOSS in row and row.get(contract.KIND, contract.KIND_TRAIN) == contract.KIND_TRAIN:
            run.train.append(row)
    if not (run.record or run.train or run.evals):
        raise FileNotFoundError(f"{run_dir}: neither {RECORD_NAME} nor {METRICS_NAME} could be read")
    run.train, run.resumes = by_step(run.train)
    run.evals, _ = by_step(run.evals)
    if run.resumes:
        run.notes.append(f"resumed {len(run.resumes)} time(s), logging again from step "
                         f"{', '.join(map(str, run.resumes))}: each step shows its last write")
    return run


def _values(rows: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r[contract.STEP], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and contract.STEP in r]


def throughput_summary(run: Run) -> dict[str, Any]:
    """The run's steady-state figures by :func:`training.contract.throughput_summary` (the very
    definition the job writes into run.json), from the metrics; each figure the metrics lack is
    taken from the record's own summary."""
    recorded = run.record.get("throughput") or {}
    out = contract.throughput_summary(run.train) if run.train else {}
    for key in (*contract.THROUGHPUT_KEYS, contract.PEAK_MEMORY_GIB):
        if out.get(key) is None:
            out[key] = recorded.get(key)
    out["steps"] = len(run.train)
    return out


def eval_before_after(run: Run) -> tuple[float | None, float | None]:
    losses = _values(run.evals, contract.EVAL_LOSS)
    if losses:
        return losses[0][1], losses[-1][1]
    ev = run.record.get("eval") or {}
    get = lambda side: (ev[side].get(contract.EVAL_LOSS, ev[side].get("loss"))  # noqa: E731
                        if isinstance(ev.get(side), dict) else None)
    return get("before"), get("after")


def plot_runs(runs: list[Run], out_dir: Path, names: list[str] | None = None) -> dict[str, str]:
    """One PNG per metric, every run on the same axes; returns {stem: file name} for those drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from raytrain_eks.runs.report_story import letter, mark_steps

    drawn = {}
    for stem, key, label in PLOTS:
        series = [(run, _values(run.evals if key == contract.EVAL_LOSS else run.train, key)) for run in runs]
        if not any(points for _, points in series):
            continue
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        for index, (run, points) in enumerate(series):
            if points:
                xs, ys = zip(*points)
                # B dashed over A solid: identical curves (same seed) stay visible as one.
                ax.plot(xs, ys, linestyle="-" if index == 0 else "--", marker="o" if len(points) < 30 else None,
                        markersize=3 if index == 0 else 5, fillstyle="full" if index == 0 else "none",
                        label=(names or [])[index] if names else run.name)
        mark_steps(ax, runs)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if key == contract.MFU:
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.set_title(label + (f" ({' vs '.join(letter(i) for i in range(len(runs)))})" if len(runs) > 1
                              else f": {runs[0].name}"))
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}.png")
        plt.close(fig)
        drawn[stem] = f"{stem}.png"
    return drawn


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.0.c": leaf}`` for nested dicts and lists (an empty container is a leaf)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[tuple[str, Any, Any]]]:
    """Every leaf that differs between two records, grouped (inputs, runtime, outcomes, identity)."""
    flat_a, flat_b = flatten(a), flatten(b)
    missing = "(absent)"
    groups: dict[str, list[tuple[str, Any, Any]]] = {"inputs": [], "runtime": [], "outcomes": [], "identity": []}
    for path in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(path, missing), flat_b.get(path, missing)
        if va == vb:
            continue
        top = path.split(".", 1)[0]
        if top in IDENTITY or (top == "transport" and ".evidence" in path):  # verbatim log lines: pids, times
            group = "identity"
        elif top in RUNTIME:
            group = "runtime"
        elif top in OUTCOMES:
            group = "outcomes"
        else:
            group = "inputs"  # unknown keys count as inputs: never hide a possible cause
        groups[group].append((path, va, vb))
    return groups


def _fmt(value: Any, width: int = 130) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = json.dumps(value) if not isinstance(value, str) else value
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _ran(value: Any) -> Any:
    """``{"ran", "manifest"}`` hashes: the one that ran, flagged when the manifest said otherwise."""
    if not isinstance(value, dict):
        return value
    ran, manifest = value.get("ran"), value.get("manifest")
    return ran if not manifest or manifest == ran else f"{ran} (manifest: {manifest})"


def _transport_text(transport: dict[str, Any]) -> str:
    counts = transport.get("counts") or {}
    ranks = ", ".join(f"{kind}: {n} rank(s)" for kind, n in counts.items())
    return transport.get("transport", "unknown") + (f" ({ranks})" if ranks else "")


def exposed_comm_text(value: Any) -> str | None:
    """run.json's ``exposed_comm`` as the report's row, its label first (``predicted 12.1-24.0%
    of the step ...``, ``measured ...``, ``unknown: ...``; run.json says more); None for a
    record without it."""
    if not isinstance(value, dict):
        return None
    label, share = value.get("label", "unknown"), value.get("share")
    if label == "unknown" or not share:
        return "unknown: the job does not time its collectives and had no step-model prediction (run.json: exposed_comm)"
    low, high = min(share), max(share)
    span = f"{100 * low:.1f}%" if low == high else f"{100 * low:.1f}-{100 * high:.1f}%"
    seconds = value.get("seconds") or []
    timing = f"{min(seconds):.2f}-{max(seconds):.2f} s; " if seconds else ""
    source = "raytrain_eks/planning/step_model.py" if label == "predicted" else "timed by the job"
    return f"{label} {span} of the step ({timing}{source})"


def predicted_step_text(value: Any) -> str | None:
    """The step model's prediction the run was handed (run.json ``exposed_comm``, label
    ``predicted``): step time and MFU ranges beside the measured ones, with the figures it
    assumed (the rest are published or calibrated by ``make gpu-check``); None without one."""
    if not isinstance(value, dict) or value.get("label") != "predicted" or not value.get("step_s"):
        return None
    (lo, hi), mfu = value["step_s"], value.get("mfu") or []
    text = f"predicted {hi:.2f}-{lo:.2f} s (slow-fast)"
    if mfu:
        text += f", MFU {100 * min(mfu):.1f}-{100 * max(mfu):.1f}%"
    assumed = value.get("assumed")
    basis = ("assumed: " + ", ".join(assumed)) if assumed else "every figure published or measured"
    if value.get("calibrated"):
        basis += "; calibrated by make gpu-check"
    return f"{text} (raytrain_eks/planning/step_model.py; {basis})"


def node_hours_text(record: dict[str, Any]) -> str | None:
    """``2.000 h g6.12xlarge spot at $1.84/h (spot estimate ...)``, one entry per type and capacity."""
    rows = (record.get(contract.COST) or {}).get("node_hours") or []
    return "; ".join(f"{r['node_hours']:.3f} h {r['instance_type']} {r['capacity_type']} at "
                     f"${r['usd_per_node_hour']:g}/h ({r['price']})" for r in rows) or None


def netcheck_summary_text(summary: dict[str, Any] | None) -> str | None:
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


def _summary_rows(run: Run) -> list[tuple[str, Any]]:
    r, t = run.record, throughput_summary(run)
    before, after = eval_before_after(run)
    cluster = r.get("cluster") or {}
    transport = r.get("transport") or {}
    return [
        ("run", run.name), ("directory", run.source), ("status", r.get("status")),
        ("kind", r.get("kind") + (" (synthetic data: proves the infrastructure, not a model)"
                                  if r.get("is_infrastructure_check") else "") if r.get("kind") else None),
        ("image", r.get("image") or "(local: no image)"),
        ("code hash", _ran(r.get("code_hash"))),
        ("spec hash", r.get("spec_hash") or None), ("job config hash", _ran(r.get("job_config_hash"))),
        ("cluster", f"{cluster.get('nodes', '?')} node(s) x {cluster.get('gpus_per_node', '?')} GPU(s)"
                    f" {cluster.get('instance_type') or ''}".strip()),
        ("strategy", ((r.get("job_config") or {}).get("parallel") or {}).get("strategy")),
        ("transport", _transport_text(transport)),
        ("steps", t["steps"]), ("tokens/s", t[contract.TOKENS_PER_S]),
        ("tokens/s per device", t[contract.TOKENS_PER_S_PER_DEVICE]),
        ("TFLOP/s per device", t[contract.TFLOPS_PER_DEVICE]),
        ("MFU", None if t[contract.MFU] is None else f"{100 * t[contract.MFU]:.2f}%"),
        ("exposed communication", exposed_comm_text(r.get("exposed_comm"))),
        ("network (netcheck)", netcheck_summary_text(r.get("netcheck"))),
        ("step time (s)", t[contract.STEP_TIME_S]),
        ("step time, predicted", predicted_step_text(r.get("exposed_comm"))),
        ("peak memory (GiB)", t[contract.PEAK_MEMORY_GIB]), ("eval loss before", before), ("eval loss after", after),
        ("objective", _objective_text(r.get("objective"))),
        ("reward accuracy before -> after", _rewards_text(r.get("eval") or {})),
        ("duration (s)", r.get("duration_s")), ("checkpoints", len(r.get("checkpoints") or [])),
        ("cost", cost_text(r)), ("cost per 1M tokens", cost_text(r, per_1m_tokens=True)),
        ("node-hours", node_hours_text(r)),
        ("incidents", incidents.summary(incidents.of_record(r)) or "none"),
        ("started", r.get("start_time")), ("error", r.get("error")),
    ]


def _objective_text(objective: Any) -> str | None:
    if not isinstance(objective, dict):
        return None
    options = ", ".join(f"{k} {v}" for k, v in objective.items() if k != "name")
    return f"{objective.get('name')}" + (f" ({options})" if options else "")


def _rewards_text(evals: dict[str, Any]) -> str | None:
    """DPO's held-out reward accuracy before and after (None for other objectives)."""
    side = lambda name: (evals.get(name) or {}).get("eval_rewards_accuracy")  # noqa: E731
    if side("after") is None:
        return None
    before = side("before")
    return f"{'?' if before is None else f'{before:.3f}'} -> {side('after'):.3f} (chance 0.5)"


def benchmark_lines(runs: list[Run]) -> list[str]:
    """The benchmark scores of each run: the base model (before training) and the trained one."""
    lines: list[str] = []
    for run in runs:
        scores = run.record.get("benchmarks") or {}
        after = (scores.get("after") or {}).get("tasks") or {}
        if not after:
            continue
        before = (scores.get("before") or {}).get("tasks") or {}
        lines += ["", f"## Benchmarks: {run.name}", "", "| task | metric | base model | after training | questions |",
                  "|---|---|---|---|---|"]
        for task, figures in after.items():
            for metric, value in figures.items():
                if metric != "questions":
                    lines.append(f"| {task} | {metric} | {_fmt((before.get(task) or {}).get(metric))} | {_fmt(value)} "
                                 f"| {figures.get('questions')} |")
    return lines


def render_markdown(runs: list[Run], plots: dict[str, str]) -> str:
    from raytrain_eks.runs import report_story as story

    names = story.labels(runs)
    title = runs[0].name if len(runs) == 1 else " vs ".join(names)
    lines = [f"# Run report: {title}", "", *story.verdict_lines(runs)]
    outcome = ([throughput_summary(r) for r in runs], [eval_before_after(r) for r in runs])
    if len(runs) == 2:
        lines += story.comparison_paragraph(runs, *outcome)
    elif len(runs) > 2:
        lines += story.factor_table(runs, *outcome)
    rows = [_summary_rows(run) for run in runs]
    columns = [story.letter(i) for i in range(len(runs))] if len(runs) > 1 else ["value"]
    lines += ["| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    for index, (label, _) in enumerate(rows[0]):
        lines.append(f"| {label} | " + " | ".join(_fmt(r[index][1]) for r in rows) + " |")
    for run in runs:
        for note in run.notes:
            lines.append(f"\n> note ({run.name}): {note}")
    for run in runs:  # what went wrong and what it cost, each fault in full (training/incidents.py)
        found = incidents.of_record(run.record)
        if found:
            lines += ["", f"## Incidents ({run.name}): {incidents.summary(found)}", ""]
            lines += [f"{n}. {incidents.line(entry)}" for n, entry in enumerate(found, 1)]
    lines += benchmark_lines(runs)
    if len(runs) == 2:
        lines += ["", "## Differences between the records", "",
                  "Every leaf of run.json that differs. Inputs and run-time conditions are what can explain a "
                  "throughput or loss difference; outcomes are the differences to explain.", ""]
        for group, items in differences(runs[0].record, runs[1].record).items():
            lines.append(f"### {group} ({len(items)})")
            lines.append("")
            if not items:
                lines.append("(none)")
            else:
                lines += ["| field | A | B |", "|---|---|---|"]
                lines += [f"| `{path}` | {_fmt(va, 240)} | {_fmt(vb, 240)} |" for path, va, vb in items]
            lines.append("")
    lines += ["", "## Plots", ""]
    missing = [stem for stem, _, _ in PLOTS if stem not in plots]
    lines += [f"![{stem}]({name})" for stem, name in plots.items()]
    if missing:
        lines.append(f"\nNot drawn (no values in the metrics): {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def render_report(run_dirs: list[str], out_dir: str | Path) -> Path:
    """Write ``report.md`` and the PNGs into ``out_dir``; returns the Markdown path."""
    if not run_dirs:
        raise ValueError("report: no run directory given")
    runs = [load_run(d) for d in run_dirs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from raytrain_eks.runs.report_story import labels

    plots = plot_runs(runs, out, labels(runs))
    path = out / "report.md"
    path.write_text(render_markdown(runs, plots), encoding="utf-8")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (local or s3://)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: reports/<run> or reports/<run-a>-vs-<run-b>)")


def run(args: argparse.Namespace) -> int:

    names = [Path(r.rstrip("/")).name for r in args.runs]
    out = args.out or str(Path("reports") / "-vs-".join(names))
    try:
        path = render_report(args.runs, out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    if len(args.runs) > 1:
        return 0
    from training.verdict import exit_code, headline, of_record

    verdict = of_record(load_run(args.runs[0]).record)
    print(f"verdict: {headline(verdict)}")
    return exit_code(verdict)
