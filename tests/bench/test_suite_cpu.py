"""bench/suite_cpu.py counts a test's CPU by its worker's cgroup: a process the test started and
that left the test's process tree (daemonized, as ``ray start`` does) is still the test's cost."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

BURN = """
import json, os, resource, subprocess, sys, time

def test_starts_a_daemon_that_burns_a_second():
    # a grandchild re-parented away from the test (the middle process exits at once), as `ray start`
    # daemonizes: it burns one CPU-second, then writes DONE
    own = lambda: sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    before = own()
    done = os.environ["DONE"]
    code = ("import os, time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass\\n"
            f"open({done!r}, 'w').close()")
    subprocess.run([sys.executable, "-c", "import subprocess, sys, os; "
                    f"subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True); os._exit(0)"], check=True)
    deadline = time.time() + 600  # ends a hang only: the daemon burns a fixed second of CPU
    while not os.path.exists(done) and time.time() < deadline:
        time.sleep(0.1)
    with open(os.environ["OWN"], "w") as f:  # what getrusage sees: the test's process and its waited-for child
        json.dump(own() - before, f)
"""


def _cgroups_writable() -> bool:
    """Whether bench/suite_cpu.py can make this machine's process a cgroup of its own: tried for
    real, in a child process that moves itself and exits (its cgroup then removed), as the
    permission to move a process depends on more than one file's mode."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import suite_cpu\n"
             "try:\n    group, _ = suite_cpu._cgroup_counter()\nexcept Exception:\n    sys.exit(1)\nprint(group)")
    out = subprocess.run([sys.executable, "-c", probe, str(ROOT / "bench")], capture_output=True, text=True,
                         env={**os.environ, "PYTEST_XDIST_WORKER": f"probe-{os.getpid()}"})
    if out.returncode != 0:
        return False
    Path(out.stdout.strip()).rmdir()  # empty: its one process has exited
    return True


@pytest.mark.parametrize("workers", ["0", "2"])  # in the one process, and in a pytest-xdist worker
def test_a_daemonized_process_is_counted_for_the_test_that_started_it(tmp_path, workers):
    if not _cgroups_writable():  # tried here, not at collection: the probe is a process
        pytest.skip("this process may not make a cgroup of its own (needs root or a delegated cgroup)")
    target = tmp_path / "test_target.py"
    target.write_text(BURN)
    done, own = tmp_path / "done", tmp_path / "own.json"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_cpu.py"), str(target), "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), "-c", os.devnull],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "TEST_WORKERS": workers, "DONE": str(done), "OWN": str(own)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0 and result["cgroups_left_holding_processes"] == {}, result
    [(name, burner)] = result["costliest_modules"].items()
    assert name.endswith("test_target.py") and burner["tests"] == 1, result
    # the daemon's second of CPU, beyond all that the test's own getrusage holds
    assert done.exists() and burner["cpu_s"] - json.loads(own.read_text()) >= 1.0, result
    assert result["workers_cpu_s"] >= burner["cpu_s"]  # the workers' totals hold their tests and more


def test_the_report_sums_by_tier_and_module():
    from suite_cpu import report

    rows = [{"test": "tests/a.py::t1", "tier": "ray", "cpu_s": 10.0, "wall_s": 6.0},
            {"test": "tests/a.py::t2", "tier": "unit", "cpu_s": 0.5, "wall_s": 0.5},
            {"test": "tests/b.py::t", "tier": "ray", "cpu_s": 3.0, "wall_s": 4.0},
            {"cgroup": "/sys/fs/cgroup/cpuacct/suite-cpu-1-gw0", "worker_cpu_s": 9.0},
            {"cgroup": "/sys/fs/cgroup/cpuacct/suite-cpu-1-gw1", "worker_cpu_s": 7.0}]
    got = report(rows, wall_s=10.0, workers=2)
    assert (got["tests_cpu_s"], got["workers_cpu_s"]) == (13.5, 16.0)
    assert got["by_tier"] == {"ray": {"tests": 2, "cpu_s": 13.0, "worker_wall_s": 10.0},
                              "unit": {"tests": 1, "cpu_s": 0.5, "worker_wall_s": 0.5}}
    assert list(got["costliest_modules"]) == ["tests/a.py", "tests/b.py"]
    assert got["capacity_used"] == round(16.0 / (os.cpu_count() * 10.0), 3)


def test_a_worker_still_exiting_is_waited_for_and_a_daemon_left_is_named():
    """CI met it: pytest-xdist's controller returned while a worker was still exiting, the first
    rmdir of its cgroup was refused, and the cgroup was reported as left holding no process. A
    process that exits is waited for; one that stays is named by pid, state and name."""
    if not _cgroups_writable():
        pytest.skip("this process may not make a cgroup of its own (needs root or a delegated cgroup)")
    from suite_cpu import _own_cgroup, remove_cgroup

    root = Path("/sys/fs/cgroup/cpuacct")
    root, controller = (root, "cpuacct") if (root / "cgroup.procs").is_file() else (Path("/sys/fs/cgroup"), None)
    groups, children = [], []
    try:
        for name, lifetime in (("exiting", "1.0"), ("daemon", "600")):  # 600 s: the test kills it
            group = _own_cgroup(root, controller) / f"suite-cpu-test-{os.getpid()}-{name}"
            group.mkdir()
            groups.append(group)
            child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({lifetime})"])
            children.append(child)
            (group / "cgroup.procs").write_text(str(child.pid))
        # reap the exiting child as soon as it ends, as the worker's parent would
        reaper = threading.Thread(target=children[0].wait)
        reaper.start()
        assert remove_cgroup(groups[0]) is None and not groups[0].exists()  # waited for, not reported
        held = remove_cgroup(groups[1], patience_s=0.5)
        assert groups[1].exists() and [line.split()[0] for line in held] == [str(children[1].pid)], held
        assert held[0].split()[2] == Path(sys.executable).name[:15]  # the kernel's name: 15 characters at most
    finally:
        for child in children:
            child.kill()
            child.wait()
        for group in groups:
            if group.exists():
                remove_cgroup(group)
