"""The suite's CPU-seconds per test, tier and module, counted by the kernel (docs/testing.md: how long).

Wall time per test misleads on a 2-core machine: a test's wall grows with whatever the other
worker runs, and the costly tests start processes that outlive the call into daemons (``ray start``
daemonizes; moto and the warm head run in sessions of their own), which no ``resource.getrusage``
of the worker counts. A cgroup does: every process forked from a member stays a member however
it re-parents. So each pytest-xdist worker moves itself into a cgroup of its own at start
(``pytest_configure``), and each test's CPU is the cgroup's counter after it minus before it
(cgroup v1 ``cpuacct.usage``, nanoseconds; cgroup v2 ``cpu.stat`` ``usage_usec``). A session
fixture's start lands on the first test that takes it, its idle burn on the tests that follow on
that worker: both are real costs of the suite.

Run from the repository root (root, or any user who may create cgroups):

    python bench/suite_cpu.py [pytest args...]     # default: the tiers of `make test`

It runs pytest as ``make test`` does (2 workers, ``--dist loadgroup``, ``-m "not cluster"``)
with this module as a plugin, then prints one JSON line: CPU-seconds and wall per tier and the
25 costliest modules, and the machine's capacity used (sum of CPU over workers x wall). Measured,
never asserted.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
"""Not a ``bench_*`` script: `make bench` (run_all.py) would run the whole suite."""
OUT_ENV = "BENCH_SUITE_CPU_OUT"
TIERS = ("unit", "subprocess", "synth", "ray", "cluster")
_state: dict = {}


def _cgroup_counter() -> tuple[Path, Callable[[Path], float]]:
    """A fresh cgroup for this process, and a reader of its CPU-seconds (v1 cpuacct, else v2)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"suite-cpu-{os.getppid()}-{worker}"
    for root, read in ((Path("/sys/fs/cgroup/cpuacct"), lambda d: int((d / "cpuacct.usage").read_text()) / 1e9),
                       (Path("/sys/fs/cgroup"), lambda d: int(dict(line.split() for line in
                                                                   (d / "cpu.stat").read_text().splitlines())
                                                              ["usage_usec"]) / 1e6)):
        if not (root / "cgroup.procs").is_file():
            continue
        group = root / name
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        return group, read
    raise SystemExit("suite_cpu: no writable cgroup (v1 /sys/fs/cgroup/cpuacct or v2 /sys/fs/cgroup): "
                     "run it where you may create cgroups")


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(OUT_ENV) or os.environ.get("PYTEST_XDIST_WORKER") is None and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        return  # the xdist controller runs no test: only its workers count
    group, read = _cgroup_counter()
    _state.update(group=group, read=read, out=open(Path(os.environ[OUT_ENV]) / f"{group.name}.jsonl", "a"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if "read" not in _state:
        yield
        return
    read = _state["read"]
    cpu, wall = read(_state["group"]), time.time()
    yield
    tier = next((m.name for m in item.iter_markers() if m.name in TIERS), "?")
    _state["out"].write(json.dumps({"test": item.nodeid, "tier": tier, "cpu_s": round(read(_state["group"]) - cpu, 2),
                                    "wall_s": round(time.time() - wall, 2)}) + "\n")
    _state["out"].flush()


def report(rows: list[dict], wall_s: float, workers: int) -> dict:
    by_tier, by_module = collections.defaultdict(lambda: [0, 0.0, 0.0]), collections.defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        for table, key in ((by_tier, row["tier"]), (by_module, row["test"].split("::")[0])):
            table[key][0] += 1
            table[key][1] += row["cpu_s"]
            table[key][2] += row["wall_s"]
    cpu = sum(r["cpu_s"] for r in rows)
    shape = lambda n, c, w: {"tests": n, "cpu_s": round(c, 1), "worker_wall_s": round(w, 1)}
    return {"name": "suite_cpu", "pytest_wall_s": round(wall_s, 1), "workers": workers, "cpu_s": round(cpu, 1),
            "capacity_used": round(cpu / (os.cpu_count() * wall_s), 3) if wall_s else None,
            "by_tier": {t: shape(*v) for t, v in sorted(by_tier.items(), key=lambda kv: -kv[1][1])},
            "costliest_modules": {m: shape(*v) for m, v in sorted(by_module.items(), key=lambda kv: -kv[1][1])[:25]}}


def main(args: list[str]) -> None:
    workers = int(os.environ.get("TEST_WORKERS", "2"))
    out = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q",
               *(["-n", str(workers), "--dist", "loadgroup"] if workers else []), *(args or ["-m", "not cluster"])]
    start = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))  # the plugin, in every worker
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, OUT_ENV: str(out), "PYTHONDONTWRITEBYTECODE": "",
                                                  "PYTHONPATH": path})
    wall = time.perf_counter() - start
    rows = []
    for written in out.glob("*.jsonl"):
        rows += [json.loads(line) for line in written.read_text().splitlines() if line]
        for root in (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")):
            with contextlib.suppress(OSError):  # removable once its processes ended; a daemon left running keeps it
                (root / written.stem).rmdir()
    result = report(rows, wall, workers)
    result["exit_code"] = proc.returncode
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
