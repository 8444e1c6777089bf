"""The session's one local run (the ``local_run`` fixture in tests/conftest.py): how it is made,
so the tests that read it know what was asked for."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOCAL_RUN_SETS = ("train.report_every_n_steps=3", "train.max_steps=10", "checkpoint.every_n_steps=5",
                  "eval.every_n_steps=5")
"""The user's ``--set`` of the shared local run: the shipped local job with its steps, checkpoint
and evaluation cadence pinned here (10 steps, every 5: what the tests that read the run rely on,
whatever the shipped file says), reported every 3 steps (windows of 3, 3, 3 and 1 step)."""


def submit_local(out: Path) -> subprocess.CompletedProcess:
    """``raytrain-eks submit jobs/local.toml --local --set ... --out <out>``, as a user types it."""
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local", "--out", str(out)]
    for value in LOCAL_RUN_SETS:
        argv += ["--set", value]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    (out / "submit.log").write_text(proc.stdout + proc.stderr)
    return proc
