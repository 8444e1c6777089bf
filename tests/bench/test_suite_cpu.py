"""bench/suite_cpu.py counts a test's CPU by its worker's cgroup: a process the test started and
that left the test's process tree (daemonized, as ``ray start`` does) is still the test's cost."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

BURN = """
import os, subprocess, sys, time

def test_starts_a_daemon_that_burns_a_second():
    # a grandchild re-parented away from the test (the middle process exits at once), as `ray start` daemonizes
    subprocess.run([sys.executable, "-c", "import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "'import time; t = time.process_time()\\\\nwhile time.process_time() - t < 1.0: pass'], "
                    "start_new_session=True); os._exit(0)"], check=True)
    deadline = time.time() + 600  # ends a hang only: the daemon burns a fixed second of CPU
    while time.time() < deadline and b"process_time" in subprocess.run(["ps", "-eo", "args"], capture_output=True).stdout:
        time.sleep(0.05)

def test_idles():
    time.sleep(0.2)
"""


def _cgroups_writable() -> bool:
    return any(os.access(root, os.W_OK) and (Path(root) / "cgroup.procs").is_file()
               for root in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup"))


@pytest.mark.skipif(not _cgroups_writable(), reason="creating a cgroup needs root or a delegated cgroup")
def test_a_daemonized_process_is_counted_for_the_test_that_started_it(tmp_path):
    target = tmp_path / "test_target.py"
    target.write_text(BURN)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_cpu.py"), str(target), "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), "-c", os.devnull],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "TEST_WORKERS": "0"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0
    modules = result["costliest_modules"]
    [burner] = [m for m in modules if m.endswith("test_target.py")]
    # the daemon's second of CPU, which no getrusage of the test's process would hold
    assert modules[burner]["cpu_s"] >= 1.0 and modules[burner]["tests"] == 2, result


def test_the_report_sums_by_tier_and_module():
    from suite_cpu import report

    rows = [{"test": "tests/a.py::t1", "tier": "ray", "cpu_s": 10.0, "wall_s": 6.0},
            {"test": "tests/a.py::t2", "tier": "unit", "cpu_s": 0.5, "wall_s": 0.5},
            {"test": "tests/b.py::t", "tier": "ray", "cpu_s": 3.0, "wall_s": 4.0}]
    got = report(rows, wall_s=10.0, workers=2)
    assert got["cpu_s"] == 13.5
    assert got["by_tier"] == {"ray": {"tests": 2, "cpu_s": 13.0, "worker_wall_s": 10.0},
                              "unit": {"tests": 1, "cpu_s": 0.5, "worker_wall_s": 0.5}}
    assert list(got["costliest_modules"]) == ["tests/a.py", "tests/b.py"]
    assert got["capacity_used"] == round(13.5 / (os.cpu_count() * 10.0), 3)
