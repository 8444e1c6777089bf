"""bench/suite_cpu.py counts a test's CPU by its worker's cgroup: a process the test started and
that left the test's process tree (daemonized, as ``ray start`` does) is still the test's cost; its
process census names what kind of process the CPU went to, by the command lines Ray and others set."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace
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

BURNER = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
          "print('burnt', flush=True)\ntime.sleep(600)")
"""A child that burns a CPU-second, says so, then idles (600 s: only a bound on a hang). Its
command line reads as a job driver's (``training --config``), so the census names its kind."""

LEFT_RUNNING = """
import json, os, subprocess, sys

import suite_cpu  # the plugin this pytest runs with: its _state holds this process's cgroup

def test_leaves_a_job_driver_running_in_a_nested_cgroup():
    # a child whose command line reads as a job driver's, in a cgroup nested in the worker's (as a
    # pytest run inside a worker's test makes them), left running past the end of the run: the
    # census's last sample, taken after pytest ends and before the cgroups go, must find it there
    child = subprocess.Popen([sys.executable, "-c", os.environ["BURNER"], "training", "--config", "burn.toml"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    nested = suite_cpu._state["group"] / "census-burner"
    nested.mkdir()
    (nested / "cgroup.procs").write_text(str(child.pid))
    with open(os.environ["LEFT"], "w") as f:
        json.dump({"pid": child.pid, "cgroup": str(nested)}, f)
    assert child.stdout.readline() == "burnt\\n"  # its CPU-second is spent
"""


def _cgroups_writable() -> bool:
    """Whether bench/suite_cpu.py can make this machine's process a cgroup of its own: tried for
    real, in a child process that moves itself and exits (its cgroup then removed), as the
    permission to move a process depends on more than one file's mode."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import suite_cpu\n"
             f"try:\n    group, _ = suite_cpu._cgroup_counter('probe-{os.getpid()}')\nexcept Exception:\n"
             "    sys.exit(1)\nprint(group)")
    out = subprocess.run([sys.executable, "-c", probe, str(ROOT / "bench")], capture_output=True, text=True)
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
                         # as in CI, where this test runs in an xdist worker: the variable is inherited
                         env={**os.environ, "TEST_WORKERS": workers, "DONE": str(done), "OWN": str(own),
                              "PYTEST_XDIST_WORKER": "gw1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0 and result["cgroups_left_holding_processes"] == {}, result
    assert result["worker_cgroups"] == max(1, int(workers)), result  # the workers only, never the controller
    [(name, burner)] = result["costliest_modules"].items()
    assert name.endswith("test_target.py") and burner["tests"] == 1, result
    # the daemon's second of CPU, beyond all that the test's own getrusage holds
    assert done.exists() and burner["cpu_s"] - json.loads(own.read_text()) >= 1.0, result
    assert result["workers_cpu_s"] >= burner["cpu_s"]  # the workers' totals hold their tests and more


def test_the_census_keeps_a_process_killed_by_sigkill_up_to_its_last_sample(tmp_path):
    """A process killed by SIGKILL (a fault from outside) is gone from /proc, but the census keeps
    what its samples saw, under its kind: the samples are the thread's own :meth:`Census.sample`."""
    from suite_cpu import Census, _run_roots, cgroup_pids

    if not _cgroups_writable():
        pytest.skip("this process may not make a cgroup of its own (needs root or a delegated cgroup)")
    group = _run_roots()[0] / f"census-test-{os.getpid()}"
    group.mkdir()
    child = subprocess.Popen([sys.executable, "-c", BURNER, "training", "--config", "burn.toml"],
                             stdout=subprocess.PIPE, text=True)
    try:
        (group / "cgroup.procs").write_text(str(child.pid))
        assert child.stdout.readline() == "burnt\n"
        census = Census(lambda: cgroup_pids([group]))
        census.sample()
    finally:
        child.kill()
        child.wait()
    census.sample()  # the child is gone: nothing new, nothing lost
    group.rmdir()
    driver = census.report()["by_kind"]["job driver"]
    assert driver["count"] == 1 and driver["cpu_s"] >= 0.95, census.report()  # a CPU-second, in clock ticks


@pytest.mark.parametrize("workers", ["0", "2"])  # pytest's own cgroup (named by main's pid), and a worker's
def test_the_process_census_reads_the_runs_nested_cgroups_and_names_the_kind(tmp_path, workers):
    """Through ``main()``, as the suite runs: the census reads the cgroups of the run, nested ones
    too, and names what it found there by kind; a process left running is named as holding them."""
    from suite_cpu import remove_cgroups

    if not _cgroups_writable():
        pytest.skip("this process may not make a cgroup of its own (needs root or a delegated cgroup)")
    target = tmp_path / "test_left_running.py"
    target.write_text(LEFT_RUNNING)
    left_file = tmp_path / "left.json"
    try:
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_cpu.py"), str(target), "-p", "no:cacheprovider",
                              "--rootdir", str(tmp_path), "-c", os.devnull],
                             cwd=ROOT, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "TEST_WORKERS": workers, "PYTEST_XDIST_WORKER": "gw1",
                                  "BURNER": BURNER, "LEFT": str(left_file)})
    finally:
        if left_file.exists():
            left = json.loads(left_file.read_text())
            os.kill(left["pid"], signal.SIGKILL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    held = result["cgroups_left_holding_processes"]
    assert remove_cgroups([Path(left["cgroup"]), *map(Path, held)]) == {}  # gone once the child is killed
    # the process left running holds its cgroup, so the cgroup above it is named as held by it
    assert result["exit_code"] == 0 and any("cgroup census-burner" in who for who in held.values()), result
    census = result["processes"]
    driver = census["by_kind"].get("job driver")
    assert census["period_s"] == 0.5 and driver and driver["count"] == 1 and driver["cpu_s"] >= 0.95, census
    assert list(census["by_kind"]) == sorted(census["by_kind"], key=lambda k: -census["by_kind"][k]["cpu_s"])
    assert census["sampled_cpu_s"] >= driver["cpu_s"], census


@pytest.mark.parametrize("titles, kind", [
    # Ray 2.58's titles: a worker starts as setup_worker.py/default_worker.py, is titled ray::IDLE,
    # then ray::<Actor> and ray::<Actor>.<method> while it runs one
    (["/v/bin/python /v/lib/python3.11/site-packages/ray/_private/workers/setup_worker.py /v/lib/python3.11/site-packages/"
      "ray/_private/workers/default_worker.py --node-ip-address=192.0.2.2", "ray::IDLE", "ray::RayTrainWorker.run_train_fn"],
     "Ray Train worker"),
    (["ray::IDLE", "ray::RayTrainWorker.init_train_context", "ray::execute._set_torch_distributed_env_vars"], "Ray Train worker"),
    (["ray::IDLE", "ray::TrainController.__init__", "ray::TrainController.run"], "Ray Train controller and helper actors"),
    (["ray::IDLE", "ray::PlacementGroupCleaner"], "Ray Train controller and helper actors"),
    (["ray::IDLE", "ray::_AutoscalingCoordinatorActor.request_resources"], "Ray Train controller and helper actors"),
    (["ray::IDLE", "ray::JobSupervisor"], "Ray job supervisor"),
    (["ray::IDLE", "ray::PreemptionWatcher", "ray::RayTrainWorker"], "Ray actor or task, other"),  # the first name decides
    (["ray::IDLE"], "Ray worker, never an actor"),
    (["ray::IDLE", "ray::some_task", "ray::IDLE"], "Ray actor or task, other"),  # a task's worker goes back to IDLE
    (["/v/bin/python /v/lib/python3.11/site-packages/ray/_private/workers/default_worker.py --node-ip-address=192.0.2.2"],
     "Ray worker, never an actor"),
    (["/v/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray/session_1/logs"], "Ray head/node daemon"),
    (["/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/s/sockets/raylet"],
     "Ray head/node daemon"),
    (["/v/bin/python -u /v/lib/python3.11/site-packages/ray/dashboard/agent.py --node-id=3e38", "ray::DashboardAgent"],
     "Ray head/node daemon"),
    (["/v/bin/python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=26, pipe_handle=49) --multiprocessing-fork",
      'ray-dashboard-StateHead-0 (/v/bin/python -c "from multiprocessing.spawn import spawn_main")'], "Ray head/node daemon"),
    (["/v/bin/python -u /v/lib/python3.11/site-packages/ray/_private/log_monitor.py --session-dir=/tmp/ray/s"],
     "Ray head/node daemon"),
    (["/v/bin/python /v/bin/ray job submit --no-wait --address http://127.0.0.1:8265 -- python -m training --config jobs/local.toml"],
     "Ray CLI (ray start, ray job submit/logs)"),
    (["/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"], "pytest"),
    (["/v/bin/python -m pytest -n 2 --dist loadgroup -m not cluster -p suite_cpu"], "pytest"),
    # a child forked from an xdist worker is named by what it execs
    (["/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "/v/bin/python /v/bin/ray start --head --port=6379"],
     "Ray CLI (ray start, ray job submit/logs)"),
    (["/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "sleep 1"], "other"),
    (["python -m training --config x.toml"], "job driver"),
    (["/v/bin/python -m training --config /tmp/pytest-of-root/pytest-185/popen-gw0/t0/elastic.toml"], "job driver"),
    (["/v/bin/python -c from multiprocessing.forkserver import main; main(14, 19, ['torch'])"],
     "spawned rank (multiprocessing spawn/forkserver)"),
    # the forkserver a Ray Train worker starts, seen once between its fork and its exec
    (["ray::RayTrainWorker.run_train_fn", "/v/bin/python -c from multiprocessing.forkserver import main; main(14, 19, [])"],
     "spawned rank (multiprocessing spawn/forkserver)"),
    (["node /x/cdk.js"], "node (cdk, cdk8s)"),
    (["/usr/bin/node --max-old-space-size=4069 --preserve-symlinks /tmp/tmp3y/lib/program.js"], "node (cdk, cdk8s)"),
    (["/v/bin/python -m raytrain_eks.cli submit jobs/local.toml --local --out /tmp/pytest-of-root/pytest-185/popen-gw1/t0"], "other"),
    ([], "other"),
    (["", "/v/bin/python -m pytest -q"], "pytest"),  # a zombie's empty command line is no title
])
def test_a_process_is_named_by_its_titles(titles, kind):
    from suite_cpu import process_kind

    assert process_kind(titles) == kind


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


def test_cgroups_are_removed_deepest_first_and_a_daemon_left_is_named():
    """CI met a parent cgroup refused because its child was still there (a pytest started inside an
    xdist worker took a cgroup of its own, its workers' nested in it): the run's cgroups are removed
    deepest first, a process leaving is waited for, and one that stays is named by pid and name."""
    if not _cgroups_writable():
        pytest.skip("this process may not make a cgroup of its own (needs root or a delegated cgroup)")
    from suite_cpu import _own_cgroup, remove_cgroups

    root = Path("/sys/fs/cgroup/cpuacct")
    root, controller = (root, "cpuacct") if (root / "cgroup.procs").is_file() else (Path("/sys/fs/cgroup"), None)
    parent = _own_cgroup(root, controller) / f"suite-cpu-test-{os.getpid()}"
    nested, exiting, daemon = parent / "nested", parent / "exiting", parent.with_name(parent.name + "-daemon")
    children = []
    try:
        for group in (parent, nested, exiting, daemon):
            group.mkdir()
        for group, lifetime in ((exiting, "1.0"), (daemon, "600")):  # 600 s: the test kills it
            child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({lifetime})"])
            children.append(child)
            (group / "cgroup.procs").write_text(str(child.pid))
        threading.Thread(target=children[0].wait).start()  # reaped as it ends, as a worker's parent would
        # the parent listed first; 30 s only ends a hang: the exiting child sleeps one second
        assert remove_cgroups([parent, nested, exiting], patience_s=30.0) == {} and not parent.exists()
        left = remove_cgroups([daemon], patience_s=0.5)
        assert list(left) == [str(daemon)], left
        [(pid, state, name)] = [line.split() for line in left[str(daemon)]]
        assert pid == str(children[1].pid) and name == Path(sys.executable).name[:15], left  # 15: the kernel's
    finally:
        for child in children:
            child.kill()
            child.wait()
        remove_cgroups([g for g in (parent, nested, exiting, daemon) if g.exists()])


@pytest.mark.parametrize("inherited", [None, "gw1"])  # a pytest started inside an xdist worker inherits gw1
@pytest.mark.parametrize("role, expected", [
    ("controller -n 2", None), ("controller --tx", None), ("worker", "gw0"), ("-n 0", "main"), ("no xdist", "main")])
def test_only_the_processes_that_run_tests_take_a_cgroup(monkeypatch, tmp_path, inherited, role, expected):
    """As pytest-xdist 3.8 leaves each process's config when plugins configure: a controller has
    a ``--dist`` mode and its ``tx`` list (plugin.py ``pytest_cmdline_main``, ``_is_distribution_mode``);
    a worker its ``workerinput`` (remote.py), set before any plugin's ``pytest_configure``; ``-n 0``
    no ``tx``; ``-p no:xdist`` neither option. The variable a worker's environment holds decides nothing."""
    import suite_cpu

    options = {"controller -n 2": dict(numprocesses=2, dist="loadgroup", tx=["popen"] * 2),
               "controller --tx": dict(dist="load", tx=["2*popen"]),
               "worker": dict(numprocesses=None, dist="no", tx=[]),
               "-n 0": dict(numprocesses=0, dist="loadgroup", tx=[]),
               "no xdist": {}}[role]
    config = SimpleNamespace(option=SimpleNamespace(**options))
    if role == "worker":
        config.workerinput = {"workerid": "gw0"}
    taken = []
    monkeypatch.setattr(suite_cpu, "_cgroup_counter", lambda worker: (taken.append(worker), (tmp_path / worker, None))[1])
    monkeypatch.setattr(suite_cpu, "_state", {})
    monkeypatch.setenv(suite_cpu.OUT_ENV, str(tmp_path))
    if inherited:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", inherited)
    else:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    suite_cpu.pytest_configure(config)
    if "out" in suite_cpu._state:
        suite_cpu._state["out"].close()
    assert taken == ([expected] if expected else [])
