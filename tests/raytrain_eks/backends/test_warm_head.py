"""`submit --local` onto a warm local head (``RAYTRAIN_LOCAL_HEAD``, raytrain_eks/backends/local.py):
a file that names no warm head, or a head that does not answer, is one line before anything
starts. The warm head in use: tests/conftest.py ``warm_head`` (the e2e runs that share it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain_eks.backends.local import LOCAL_HEAD_ENV

pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[3]


def _submit(tmp_path: Path, named: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raytrain_eks.cli", "submit", "jobs/local.toml", "--local",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, LOCAL_HEAD_ENV: str(named)})


def test_no_warm_head_at_the_named_file_is_one_line_before_anything_starts(tmp_path):
    fix = f"start one with `python -m raytrain_eks.backends.local {tmp_path / 'head.json'}`, or unset {LOCAL_HEAD_ENV}"
    missing = _submit(tmp_path, tmp_path / "head.json")
    assert missing.returncode == 2, missing.stderr[-3000:]
    assert missing.stderr.strip() == f"error: {LOCAL_HEAD_ENV}={tmp_path / 'head.json'}: no such file: {fix}"

    # a file whose head is gone (its port closed): exit 5, as for a cluster kubectl cannot reach
    (tmp_path / "head.json").write_text(json.dumps({
        "gcs_address": "127.0.0.1:9", "dashboard_url": "http://127.0.0.1:9", "temp_dir": str(tmp_path),
        "metrics_url": "", "auth_token": "0" * 64, "storage_endpoint": "http://127.0.0.1:9"}))
    gone = _submit(tmp_path, tmp_path / "head.json")
    assert gone.returncode == 5, gone.stderr[-3000:]
    [line] = gone.stderr.strip().splitlines()
    assert line.startswith(f"error: {LOCAL_HEAD_ENV}={tmp_path / 'head.json'}: its Ray head at "
                           "http://127.0.0.1:9/api/version does not answer (") and line.endswith(fix)
    # nothing started: no storage, no head, no job handed over
    assert "storage http" not in gone.stdout and not (tmp_path / "out" / "local.json").exists()
