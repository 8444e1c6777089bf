"""`raytrain-eks submit jobs/local-dpo.toml --local` with a worker killed mid-run: the local DPO job
from the job file to the verdict on moto's S3 server and a real Ray head on 127.0.0.1 (the
local backend of `submit --local`), its RayJob's own entrypoint and code archive.

The fault is the demo's (`make demo FAULT=1`, devtools/demo.py): RAYTRAIN_FAULT_AT_STEP and
RAYTRAIN_FAULT_RANK set on the Ray cluster (here: the submit's environment, which the local Ray
head and its workers inherit), never in the job; rank 1 exits hard after step 7, Ray Train
restarts the workers, the run resumes from the checkpoint of step 5. The steps trained both
before the fault and after the resume must be bit-identical (DPO's loss and rewards), the run
must end ACCEPTED on its held-out reward accuracy (above chance), and the export must load with
``from_pretrained``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ray_session import TEST_ENV

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    from raytrain_eks.backends.local import RUNS_DIR

    user = tmp_path_factory.mktemp("dpo-user")
    # Ray Train's controller polls fast on the run's head (tests/ray_session.py TEST_ENV)
    env = {**os.environ, **TEST_ENV, "RAYTRAIN_FAULT_AT_STEP": "7", "RAYTRAIN_FAULT_RANK": "1"}
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", str(ROOT / "jobs" / "local-dpo.toml"), "--local",
            "--env", str(ROOT / "environment.toml"), "--set", "eval.benchmark_max_questions=4"]
    proc = subprocess.run(argv, cwd=user, env=env, capture_output=True, text=True, timeout=2400)
    named = re.search(r"^run (\S+): new,", proc.stdout, re.M)
    out = RUNS_DIR / (named.group(1) if named else "the-submit-named-no-run")
    yield out, proc
    shutil.rmtree(out, ignore_errors=True)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_dpo_job_ends_accepted_above_chance(dpo_run):
    out, proc = dpo_run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "    verdict:   ACCEPTED: " in proc.stdout
    record = json.loads((out / "run.json").read_text())
    (criterion,) = [c for c in record["verdict"]["criteria"] if c["criterion"] == "rewards_accuracy_min"]
    assert criterion["met"] and criterion["measured"] > 0.5
    assert record["objective"]["name"] == "dpo" and record["objective"]["beta"] == 0.1
    assert record["benchmarks"]["before"]["tasks"]["tiny-arith"]["questions"] == 4
    assert "## Benchmarks" in (out / "report" / "report.md").read_text()


def test_the_resume_through_the_fault_is_bit_identical(dpo_run):
    out, proc = dpo_run
    rows = _rows(out)
    summary = [r for r in rows if r.get("kind") == "summary"][-1]
    assert summary["resumed_from"] and summary["steps"] == 10
    by_step: dict[int, list[tuple]] = {}
    for r in rows:
        if r.get("kind") == "train":
            by_step.setdefault(r["step"], []).append((r["loss"], r["rewards_accuracy"], r["rewards_margin"]))
    assert sorted(by_step) == list(range(1, 11))
    redone = {s: v for s, v in by_step.items() if len(v) > 1}
    assert redone, "no step was logged both before the fault and after the resume"
    for step, values in redone.items():
        assert len(set(values)) == 1, f"step {step} differs after the resume: {values}"


def test_the_export_loads(dpo_run):
    from transformers import AutoModelForCausalLM

    out, _ = dpo_run
    model = AutoModelForCausalLM.from_pretrained(out / "hf")
    assert model.config.hidden_size == 64
