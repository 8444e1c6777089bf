"""The cdk8s app run outside make (``cdk8s synth`` runs ``python -m charts.main``) prints no
Node.js end-of-life warning as Python bytes.

Oracle: the installed jsii wheel, ``jsii/_kernel/providers/process.py`` (``stderr_sink``): a line
of the Node runtime's stderr that is not its JSON protocol is printed raw with ``print(line)``,
i.e. as ``b'...'``; the Node runtime writes its end-of-life warning so unless
``JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION`` names the running Node major.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_alone_prints_no_bytes_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE")}
    proc = subprocess.run([sys.executable, "-m", "charts.main", "--outdir", str(tmp_path / "dist")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "b'" not in proc.stderr and 'b"' not in proc.stderr, proc.stderr[-2000:]
