"""`raytrain-eks ... | head`: a reader that leaves early ends the command quietly.

The rule is Python's own (docs.python.org/3/library/signal.html, "Note on SIGPIPE"; CPython
3.11 ignores SIGPIPE at start-up, so a write to a closed pipe raises BrokenPipeError, also in
the interpreter's final flush of stdout): catch it, point stdout at devnull, exit as a
SIGPIPE'd command does. The pipe's read end is closed before the command writes, so every
write fails: no race with the reader.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["summary"], ["runs", str(ROOT / "tests" / "fixtures" / "runs")],
                                  ["--help"]])
def test_a_closed_pipe_is_no_traceback(argv):
    proc = subprocess.Popen([sys.executable, "-m", "raytrain_eks.cli", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code in (0, 141), err
