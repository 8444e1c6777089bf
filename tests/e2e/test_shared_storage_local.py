"""A shared file system as the run storage, proven on this machine's path: ``raytrain-eks submit
jobs/local.toml --local`` with a spec whose ``storage.shared_path`` is a local folder. The charts
give the job ``file://<path>``, the job (Ray Train's storage, its record, checkpoint and model)
writes there instead of the bucket, and submit reads the results back from the path: one spec
value, no other change. (On EKS the same path is the claim every Ray pod mounts, tests/charts.)
The run goes to the session's warm head (``warm_head`` in tests/conftest.py), a Ray job of its own."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spec_template import template_raw
from toml_writer import toml_text

from training.storage import RunStorage

ROOT = Path(__file__).resolve().parents[2]
SETS = ("train.max_steps=2", "train.warmup_steps=1", "checkpoint.every_n_steps=0", "eval.every_n_steps=0",
        "accept.eval_loss_after_max=0", "accept.improvement_min=0")


def submit(tmp_path: Path, shared: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``raytrain-eks submit jobs/local.toml --local`` as a user runs it, on environment.toml with
    ``storage.shared_path`` = ``shared``."""
    raw = template_raw()
    raw["storage"].update(shared_path=str(shared), shared_claim="fsx-runs")
    (tmp_path / "env.toml").write_text(toml_text(raw))
    argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local",
            "--env", str(tmp_path / "env.toml"), "--out", str(tmp_path / "out")]
    for item in SETS:
        argv += ["--set", item]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)


@pytest.mark.subprocess
def test_a_shared_path_not_mounted_here_is_refused_before_anything_starts(tmp_path):
    proc = submit(tmp_path, tmp_path / "fsx" / "runs")
    assert proc.returncode == 2 and not (tmp_path / "fsx").exists() and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'env.toml'}: storage.shared_path: '{tmp_path / 'fsx' / 'runs'}' is not a "
        "directory on this machine: submit hands the run its inputs and reads its results there (mount the file "
        "system here, or leave storage.shared_path empty for the bucket)")


@pytest.mark.slow
def test_a_local_run_lands_on_the_shared_path_and_is_read_from_there(tmp_path, warm_head):
    shared = tmp_path / "fsx" / "runs"
    shared.mkdir(parents=True)  # the mount
    proc = submit(tmp_path, shared, warm_head)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    run = re.search(r"^run (local-\d{4}-\d{6}): new, job local, storage (\S+)$", proc.stdout, re.M)
    assert run and run.group(2) == RunStorage(f"file://{shared}").run(run.group(1)), proc.stdout[:2000]
    stored = shared / run.group(1)
    record = json.loads((stored / "run.json").read_text())
    assert record["job_config"]["checkpoint"]["storage_path"] == f"file://{shared}"
    assert record["run_dir"] == str(stored) and record["status"] == "succeeded"
    assert sorted(p.name for p in stored.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_00000002"]
    assert (stored / "hf" / "config.json").is_file()
    # submit read the results back from the path: the copies are the stored files
    assert (tmp_path / "out" / "run.json").read_text() == (stored / "run.json").read_text()
    assert (tmp_path / "out" / "hf" / "config.json").is_file() and "    verdict:   ACCEPTED" in proc.stdout
