"""The session's one local run (the ``local_run`` fixture in tests/conftest.py): how it is made,
so the tests that read it know what was asked for."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOCAL_RUN_SETS = ("train.report_every_n_steps=3", "train.max_steps=10", "checkpoint.every_n_steps=5",
                  "eval.every_n_steps=5")
"""The user's ``--set`` of the shared local run: the shipped local job, shortened to 10 steps (its
own ``[accept]`` criteria are met by then: the tiny model's held-out loss falls from 11.9 to
below 10), with a checkpoint and an evaluation every 5 steps."""


def submit_local(out: Path) -> subprocess.CompletedProcess:
    """``raytrain-eks submit jobs/local.toml --local --set ... --out <out>``, as a user types it."""
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local", "--out", str(out)]
    for value in LOCAL_RUN_SETS:
        argv += ["--set", value]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    (out / "submit.log").write_text(proc.stdout + proc.stderr)
    return proc
