"""The session's one local run (the ``local_run`` fixture in tests/conftest.py): how it is made,
so the tests that read it know what was asked for.

One ``raytrain-eks submit jobs/local.toml --local`` serves every test that only reads a finished
run: submitted as a user does it from a folder outside the repository, on a data file outside it
(tests/e2e/test_local_run_commands.py), with ``[tracking]`` pointing at a real MLflow server
(tests/e2e/test_tracking_submit.py); its results in ``.work/runs/<run>/``, where the run
commands (status, logs, list, stop) find it by name."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ray_session import TEST_ENV

ROOT = Path(__file__).resolve().parents[1]

LOCAL_RUN_SETS = ("train.report_every_n_steps=3", "train.max_steps=10", "checkpoint.every_n_steps=5",
                  "eval.every_n_steps=5")
"""The user's ``--set`` of the shared local run: the shipped local job with its steps, checkpoint
and evaluation cadence pinned here (10 steps, every 5: what the tests that read the run rely on,
whatever the shipped file says), reported every 3 steps (windows of 3, 3, 3 and 1 step)."""
NETCHECK_FIRST_SETS = ("netcheck.run_first=true", "netcheck.max_bytes=1048576", "netcheck.iters=2",
                       "netcheck.compare_socket=false")
"""The run measures the network first (``netcheck.run_first``, as jobs/smoke.toml sets it), on
the smallest sizes: tests/e2e/test_netcheck_local.py reads that measurement from this run. NCCL's
mode only: on one node the run forced to sockets decides no check and gives no figure
(training/netcheck/__init__.py ``judge``: ``efa_faster`` and ``socket_run`` need an inter-node
EFA figure), and it cost a TorchTrainer fit of its own; both modes are measured by
tests/e2e/test_netcheck_local.py's own netcheck job."""
MLFLOW_EXPERIMENT = "submit-local"
"""The experiment the run's MLflow run goes to (``tracking.mlflow_experiment``)."""
USER_DATA = ROOT / "training" / "assets" / "demo_corpus" / "jsonl" / "notes.jsonl"
"""The job's own corpus, copied to the user's folder: the run trains on that copy."""


def local_run_sets(data: Path, mlflow_uri: str) -> list[str]:
    """Every ``--set`` of the shared run, the pinned cadence first (in the entrypoint's order)."""
    tracking = [f'tracking.mlflow_uri="{mlflow_uri}"', f'tracking.mlflow_experiment="{MLFLOW_EXPERIMENT}"']
    return [*LOCAL_RUN_SETS, *NETCHECK_FIRST_SETS, f"data.path={data}", *(tracking if mlflow_uri else [])]


def submit_local(user: Path, mlflow_uri: str = "") -> tuple[Path, subprocess.CompletedProcess]:
    """``raytrain-eks submit <repo>/jobs/local.toml --local --env <repo>/environment.toml --set ...``
    typed in ``user`` (a folder outside the repository, holding the data file ``my-data/notes.jsonl``);
    ``(the run's results folder, the finished process)``. Without ``mlflow_uri`` the run is not
    tracked (no ``.work/tracking-venv``: the test that reads the MLflow run skips)."""
    from raytrain_eks.backends.local import RUNS_DIR

    data = user / "my-data" / "notes.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(USER_DATA, data)
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", str(ROOT / "jobs" / "local.toml"), "--local",
            "--env", str(ROOT / "environment.toml")]
    for value in local_run_sets(data, mlflow_uri):
        argv += ["--set", value]
    # Ray Train's controller polls fast on the run's head (tests/ray_session.py TEST_ENV)
    proc = subprocess.run(argv, cwd=user, capture_output=True, text=True, timeout=1800, env={**os.environ, **TEST_ENV})
    (user / "submit.log").write_text(proc.stdout + proc.stderr)
    named = re.search(r"^run (\S+): new,", proc.stdout, re.M)
    return RUNS_DIR / (named.group(1) if named else "the-submit-named-no-run"), proc
