"""Reports and ``reproduce --against`` read metrics.jsonl by step after a resume.

The file is written the way the job writes it (training/loop.py appends one row per logged step
for the whole life of a run directory): an attempt that died after step 15 left steps 1..15, the
restarted attempt resumed from the step-10 checkpoint and logged 11..20 again, with identical
losses (same data, same weights: tests/e2e/test_demo.py proves that part on a real run).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from raytrain_eks.runs.report import load_run, render_report
from raytrain_eks.runs.reproduce import compare_runs

FIXTURE = Path(__file__).parents[2] / "fixtures" / "runs" / "efa-full"


def _loss(step: int) -> float:
    return 12.0 - 0.1 * step


def _run(tmp_path: Path, name: str, steps: list[int]) -> Path:
    run_dir = tmp_path / name
    run_dir.mkdir()
    record = json.loads((FIXTURE / "run.json").read_text())
    record["reproducibility"] = {"execution_pins": {"seed": 0, "data": "sha256:same"}}
    (run_dir / "run.json").write_text(json.dumps(record))
    rows = [{"kind": "eval", "step": 0, "eval_loss": 12.0}]
    rows += [{"kind": "train", "step": s, "loss": _loss(s), "tokens_per_s": 100.0 + s} for s in steps]
    rows += [{"kind": "eval", "step": 20, "eval_loss": 9.0}, {"kind": "summary", "steps": 20}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


RESUMED = [*range(1, 16), *range(11, 21)]


def test_a_resumed_run_reads_one_row_per_step_and_names_the_resume(tmp_path):
    run = load_run(str(_run(tmp_path, "resumed", RESUMED)))
    assert [r["step"] for r in run.train] == list(range(1, 21))
    assert run.resumes == [11]
    assert any("resumed 1 time(s)" in note for note in run.notes)


def test_reproduce_against_a_resumed_run_compares_step_by_step(tmp_path):
    # before the fix: "losses differ from step 16" (file position 16 held step 11 against step 16)
    pair = compare_runs(str(_run(tmp_path, "resumed", RESUMED)), str(_run(tmp_path, "straight", list(range(1, 21)))))
    assert pair["first_loss_difference"] is None and pair["result"] is True
    assert pair["steps"] == [20, 20]


def test_a_difference_is_named_by_its_step(tmp_path):
    a = _run(tmp_path, "a", list(range(1, 21)))
    b = _run(tmp_path, "b", list(range(1, 21)))
    rows = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row.get("step") == 7 and row["kind"] == "train":
            row["loss"] += 1e-6
    (b / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert compare_runs(str(a), str(b))["first_loss_difference"] == 7


def test_the_plots_of_a_resumed_run_are_monotonic_and_mark_the_resume(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    drawn: dict[str, list] = {}
    save = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        drawn[Path(path).stem] = [(line.get_label(), list(line.get_xdata())) for ax in fig.axes for line in ax.lines]
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    report = render_report([str(_run(tmp_path, "resumed", RESUMED))], tmp_path / "report")
    for stem in ("loss", "tokens_per_s"):
        series = [xs for label, xs in drawn[stem] if not label.startswith("_") and label not in
                  ("resumed here", "eval steps", "checkpoint steps")]
        assert series and all(xs == sorted(set(xs)) for xs in series), f"{stem}: {series}"
        assert ("resumed here", [11, 11]) in drawn[stem]
    assert "resumed 1 time(s), logging again from step 11" in report.read_text()


@pytest.mark.parametrize("steps", [[1, 2, 3], [5, 1, 2, 3, 1]])
def test_by_step_keeps_the_last_write(steps):
    from raytrain_eks.runs.report import by_step

    rows = [{"step": s, "order": i} for i, s in enumerate(steps)]
    out, resumes = by_step(rows)
    assert [r["step"] for r in out] == sorted(set(steps))
    assert all(r["order"] == max(i for i, s in enumerate(steps) if s == r["step"]) for r in out)
    assert resumes == [s for i, s in enumerate(steps) if i and s <= steps[i - 1]]
