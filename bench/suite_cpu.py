"""The suite's CPU-seconds per test, tier and module, counted by the kernel (docs/testing.md: how long).

Wall time per test misleads on a 2-core machine: a test's wall grows with whatever the other
worker runs, and the costly tests start processes that outlive the call into daemons (``ray start``
daemonizes; moto and the warm head run in sessions of their own), which no ``resource.getrusage``
of the worker counts. A cgroup does: every process forked from a member stays a member however
it re-parents. So each pytest-xdist worker moves itself into a cgroup of its own at start
(``pytest_configure``; a child of the cgroup it runs in), and each test's CPU is the cgroup's
counter after it minus before it (cgroup v1 ``cpuacct.usage``, nanoseconds; cgroup v2 ``cpu.stat``
``usage_usec``). A session fixture's start lands on the first test that takes it, its idle burn on
the tests that follow on that worker. What no test's row holds (collection, the waits between
units, a daemon's burn after the worker's last test) is in the worker's total, read as its run ends.

Run from the repository root, as root or in a cgroup delegated to you (one you may create
children in and move your processes between):

    python bench/suite_cpu.py [pytest args...]     # default: the tiers of `make test`

It runs pytest as ``make test`` does (the venv's bin/ first on PATH, ``TEST_WORKERS`` workers,
default 2, ``--dist loadgroup``, ``-m "not cluster"``) with this module as a plugin, then prints
one JSON line: CPU-seconds and wall per tier, the 25 costliest modules, the workers' totals, and
the capacity used (the workers' total CPU over the machine's cores x pytest's wall); a worker's
cgroup still holding processes at the end (a daemon nobody stopped) is named with them (pid, state,
name).
The plugin alone, under ``make test``: ``BENCH_SUITE_CPU_OUT=<dir> PYTHONPATH=bench make test
PYTEST_ARGS="-p suite_cpu"``, one ``<cgroup>.jsonl`` per worker in <dir>. Measured, never asserted.

The process census (``processes`` in that JSON, ``python bench/suite_cpu.py`` only) answers which
kind of process costs the CPU, where the rows answer which test: while pytest runs, a thread reads
every ``PERIOD_S`` the pids in each cgroup of this run (the workers' and any nested in them, from
``cgroup.procs``) and, for each, ``/proc/PID/stat`` (utime + stime) and, while it has shown fewer than
``TITLES_KEPT`` of them, its command line, which Ray rewrites (``ray::IDLE``, then ``ray::<Actor>``).
Each process (pid and start time) keeps the last CPU seen, so one killed by SIGKILL counts up to its
last sample; each is named by :func:`process_kind` (the table ``PROCESS_KINDS``), and the kinds are
summed: count, CPU-seconds, median per process. What it misses: a process's CPU after its last sample
(up to one period each), and a process that lives less than a period may not be seen at all. What
it holds that the cgroups' counters do not: a pytest process's CPU from its start, before it moved
into its cgroup. Measured, never asserted.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
"""Not a ``bench_*`` script: `make bench` (run_all.py) would run the whole suite."""
OUT_ENV = "BENCH_SUITE_CPU_OUT"
TIERS = ("unit", "subprocess", "synth", "ray", "cluster")
_state: dict = {}


def _own_cgroup(root: Path, controller: str | None) -> Path:
    """The cgroup this process runs in under ``root`` (``/proc/self/cgroup``: v1 by its
    controller's line, v2 the ``0::`` line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (controller in controllers.split(",")) if controller else number == "0":
            return root / path.lstrip("/")
    return root


HIERARCHIES = (
    (Path("/sys/fs/cgroup/cpuacct"), "cpuacct", lambda d: int((d / "cpuacct.usage").read_text()) / 1e9),
    (Path("/sys/fs/cgroup"), None,
     lambda d: int(dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())["usage_usec"]) / 1e6))
"""Where the CPU is counted, in the order tried: cgroup v1's cpuacct (nanoseconds), else v2's
``cpu.stat`` (microseconds); each with the controller ``/proc/self/cgroup`` names it by and its reader."""


def _cgroup_counter(worker: str) -> tuple[Path, Callable[[Path], float]]:
    """A fresh cgroup for this process (``worker``: its xdist id, or ``main``), a child of its own,
    and a reader of its CPU-seconds (v1 cpuacct, else v2)."""
    name = f"suite-cpu-{os.getppid()}-{worker}"
    for root, controller, read in HIERARCHIES:
        if not (root / "cgroup.procs").is_file():
            continue
        group = _own_cgroup(root, controller) / name
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as err:
            raise pytest.UsageError(f"suite_cpu: cannot make {group} this worker's cgroup ({err.strerror}): run it "
                                    "as root or in a cgroup delegated to you") from None
        return group, read
    raise pytest.UsageError("suite_cpu: no cgroup file system (v1 /sys/fs/cgroup/cpuacct or v2 /sys/fs/cgroup)")


def pytest_configure(config: pytest.Config) -> None:
    # A worker is told by its own input (``config.workerinput``, which pytest-xdist sets in workers
    # only), never by ``PYTEST_XDIST_WORKER``: a pytest started inside a worker's test inherits that
    # variable (tests/bench/test_suite_cpu.py, run in a worker in CI), and its controller then took
    # a cgroup of its own with its workers' nested inside, counted twice and removed parent first.
    worker = getattr(config, "workerinput", {}).get("workerid")
    # a controller as xdist 3.8 tells one (plugin.py ``_is_distribution_mode``): -n N or --tx, with
    # a --dist mode; -n 0 leaves ``dist`` "no" and ``tx`` empty
    in_controller = worker is None and getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
    if not os.environ.get(OUT_ENV) or in_controller:
        return  # the xdist controller runs no test: only its workers count
    group, read = _cgroup_counter(worker or "main")
    _state.update(group=group, read=read, out=open(Path(os.environ[OUT_ENV]) / f"{group.name}.jsonl", "a"))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The worker's total: its tests, collection and waits, and what its daemons burnt so far."""
    if "read" in _state:
        _state["out"].write(json.dumps({"cgroup": str(_state["group"]), "worker_cpu_s": round(_state["read"](_state["group"]), 2)}) + "\n")
        _state["out"].close()


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
    """Tests' rows summed by tier and module; the workers' totals (their ``worker_cpu_s`` rows)
    against the machine's capacity over ``wall_s``."""
    tests = [row for row in rows if "test" in row]
    totals = [row["worker_cpu_s"] for row in rows if "worker_cpu_s" in row]
    by_tier, by_module = collections.defaultdict(lambda: [0, 0.0, 0.0]), collections.defaultdict(lambda: [0, 0.0, 0.0])
    for row in tests:
        for table, key in ((by_tier, row["tier"]), (by_module, row["test"].split("::")[0])):
            table[key][0] += 1
            table[key][1] += row["cpu_s"]
            table[key][2] += row["wall_s"]
    shape = lambda n, c, w: {"tests": n, "cpu_s": round(c, 1), "worker_wall_s": round(w, 1)}
    return {"name": "suite_cpu", "pytest_wall_s": round(wall_s, 1), "workers": workers,
            "tests_cpu_s": round(sum(row["cpu_s"] for row in tests), 1), "workers_cpu_s": round(sum(totals), 1),
            "worker_cgroups": len(totals),
            "capacity_used": round(sum(totals) / (os.cpu_count() * wall_s), 3) if wall_s and totals else None,
            "by_tier": {t: shape(*v) for t, v in sorted(by_tier.items(), key=lambda kv: -kv[1][1])},
            "costliest_modules": {m: shape(*v) for m, v in sorted(by_module.items(), key=lambda kv: -kv[1][1])[:25]}}


def cgroup_members(group: Path) -> list[str]:
    """What keeps ``group`` from being removed: ``"<pid> <state> <name>"`` for each process its
    ``cgroup.procs`` lists (the kernel's own list: a thread-group leader that exited while its
    other threads run is on it too) and ``"cgroup <name>"`` for each child cgroup."""
    found = [f"cgroup {child.name}" for child in group.iterdir() if child.is_dir()]
    for pid in dict.fromkeys((group / "cgroup.procs").read_text().split()):  # v1 may list a pid twice
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        found.append(f"{pid} {stat[stat.rindex(')') + 2]} {stat[stat.index('(') + 1:stat.rindex(')')]}")
    return found


def remove_cgroup(group: Path, patience_s: float = 10.0) -> list[str] | None:
    """Remove a worker's cgroup: None when removed (or already gone), else what still holds it after
    ``patience_s`` (:func:`cgroup_members`): a daemon the run left. The patience is for a process
    that is leaving at that moment (a daemon a test's teardown has just stopped)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            group.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno != errno.EBUSY:  # not a process or child cgroup: waiting cannot help
                return [f"rmdir refused: {err.strerror}"]
        if time.monotonic() >= deadline:  # EBUSY: a process or a child cgroup is still in it
            try:
                return cgroup_members(group) or ["busy, with no process or child cgroup listed"]
            except FileNotFoundError:  # removed meanwhile
                return None
            except OSError as err:  # the report must still come out
                return [f"unreadable: {err.strerror}"]
        time.sleep(0.2)


def remove_cgroups(groups: list[Path], patience_s: float = 10.0) -> dict[str, list[str]]:
    """Remove the run's cgroups, the deepest first (a cgroup with a child cannot go before it);
    those left, with what holds each."""
    left = {}
    for group in sorted(set(groups), key=lambda g: len(g.parts), reverse=True):
        if held := remove_cgroup(group, patience_s):
            left[str(group)] = held
    return left


PROCESS_KINDS = tuple((re.compile(pattern), kind) for pattern, kind in (
    # Ray's own titles (setproctitle): the actor's class, then the method it runs
    (r"^ray::RayTrainWorker\b", "Ray Train worker"),
    (r"^ray::(TrainController|DatasetManager|SynchronizationActor|PlacementGroupCleaner|_AutoscalingCoordinatorActor)\b",
     "Ray Train controller and helper actors"),
    (r"^ray::(JobSupervisor\b|_ray_internal_job_actor_)", "Ray job supervisor"),
    (r"^ray::(DashboardAgent|RuntimeEnvAgent)\b", "Ray head/node daemon"),
    # the daemons `ray start` leaves, by their command lines; the dashboard's modules are spawned
    # (multiprocessing.spawn) and then titled ray-dashboard-<Module>-0
    (r"^(\S*/)?(gcs_server|raylet)(\s|$)|/ray/dashboard/|^ray-dashboard-|/ray/(_private/log_monitor|autoscaler/_private/monitor)\.py"
     r"|-m ray\.util\.client\.server",
     "Ray head/node daemon"),
    (r"^ray::IDLE\b|/ray/_private/workers/(default|setup)_worker\.py", "Ray worker, never an actor"),
    (r"^ray::", "Ray actor or task, other"),
    (r"(^|/)ray (start|stop|job|status)\b", "Ray CLI (ray start, ray job submit/logs)"),
    (r"training --config\b", "job driver"),
    # an xdist worker as execnet starts it; pytest itself (never a path under /tmp/pytest-of-*)
    (r"import sys;exec\(eval\(sys\.stdin\.readline\(\)\)\)|(^|/|-m )pytest(\s|$)", "pytest"),
    (r"multiprocessing\.(spawn|forkserver)", "spawned rank (multiprocessing spawn/forkserver)"),
    (r"^(\S*/)?node(\s|$)", "node (cdk, cdk8s)"),
))
"""(pattern, kind), the first that matches wins: :func:`process_kind` reads it."""


def process_kind(titles: list[str]) -> str:
    """The kind of a process by the command lines it showed, in the order seen (``PROCESS_KINDS``).
    A Ray worker (its latest title Ray's, ``ray::...``) is named by its first title that is not
    ``ray::IDLE``: an actor's title goes from its class to the method it runs and back, a task
    worker's back to IDLE. Any other process by its latest: a child forked from a pytest worker (or
    a Ray worker) shows its parent's command line until it execs its own."""
    titles = [title for title in titles if title]
    title = titles[-1] if titles else ""
    if title.startswith("ray::"):
        title = next((t for t in titles if t.startswith("ray::") and not t.startswith("ray::IDLE")), title)
    return next((kind for pattern, kind in PROCESS_KINDS if pattern.search(title)), "other")


PERIOD_S = 0.5
TITLES_KEPT = 6


def cgroup_pids(groups: list[Path]) -> list[str]:
    """The processes of ``groups`` and of the cgroups nested in them (a pytest run inside a worker's
    test makes those), each once."""
    pids = []
    for group in groups:
        for directory, _, _ in os.walk(group):
            try:
                pids += (Path(directory) / "cgroup.procs").read_text().split()
            except OSError:  # removed meanwhile
                continue
    return list(dict.fromkeys(pids))  # v1 may list a pid twice


class Census:
    """CPU per process of a set of processes (the module docstring: the process census), sampled
    every ``PERIOD_S`` by a thread between :meth:`start` and :meth:`stop`, or by the caller's own
    :meth:`sample` calls (bench/bench_head_cpu.py samples a Ray head's tree so), named by ``kind``."""

    def __init__(self, pids: Callable[[], list], kind: Callable[[list[str]], str] = process_kind):
        self.pids = pids  # found anew each sample: the workers make their cgroups as they start
        self.kind = kind
        self.seen: dict[tuple[int, int], dict] = {}  # (pid, start time in ticks) -> {"titles", "cpu_s"}
        self.tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suite-cpu-census", daemon=True)
        self.sampler_cpu_s = 0.0

    def sample(self) -> None:
        for pid in self.pids():
            try:
                stat = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
                fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
                key = (int(pid), int(fields[19]))
                cpu_s = (int(fields[11]) + int(fields[12])) / self.tick
                record = self.seen.setdefault(key, {"titles": [], "cpu_s": 0.0})
                record["cpu_s"] = cpu_s
                if len(record["titles"]) < TITLES_KEPT:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()  # empty for a zombie
                    title = b" ".join(part for part in raw.split(b"\0") if part).decode(errors="replace").strip()[:500]
                    if title and title not in record["titles"]:
                        record["titles"].append(title)
            except (OSError, ValueError, IndexError):  # gone between the listing and the reading
                continue

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.sample()
        self.sampler_cpu_s = time.thread_time()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and take a last sample (what is still running then)."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def by_kind(self) -> dict[str, list[float]]:
        """Each kind's processes' CPU-seconds so far."""
        kinds = collections.defaultdict(list)
        for record in self.seen.values():
            kinds[self.kind(record["titles"])].append(record["cpu_s"])
        return kinds

    def report(self) -> dict:
        kinds = self.by_kind()
        return {"period_s": PERIOD_S, "sampled_cpu_s": round(sum(map(sum, kinds.values())), 1),
                "sampler_cpu_s": round(self.sampler_cpu_s, 1),
                "by_kind": {kind: {"count": len(cpu), "cpu_s": round(sum(cpu), 1), "median_cpu_s": round(statistics.median(cpu), 2)}
                            for kind, cpu in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))}}


XDIST_WORKER_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def _run_roots() -> list[Path]:
    """Where this process's runs make their cgroups: under its own (v1 cpuacct and v2)."""
    return [_own_cgroup(root, controller) for root, controller, _ in HIERARCHIES if (root / "cgroup.procs").is_file()]


def main(args: list[str]) -> None:
    workers = int(os.environ.get("TEST_WORKERS", "2"))
    out = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q",
               *(["-n", str(workers), "--dist", "loadgroup"] if workers else []), *(args or ["-m", "not cluster"])]
    # what xdist sets in each worker (remote.py), never a user's setting: this process is no worker's
    inherited = {k: v for k, v in os.environ.items() if k not in XDIST_WORKER_ENV}
    env = {**inherited, OUT_ENV: str(out), "PYTHONDONTWRITEBYTECODE": "",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),  # as the Makefile's
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env)
    # the run's cgroups as they appear: the workers' are named by their parent, pytest (proc.pid),
    # and without xdist pytest's own by this process, its parent
    census = Census(lambda: cgroup_pids([group for parent in _run_roots() for owner in (proc.pid, os.getpid())
                                         for group in parent.glob(f"suite-cpu-{owner}-*") if group.is_dir()]))
    census.start()
    proc.wait()
    wall = time.perf_counter() - start
    census.stop()  # before the cgroups go
    rows = []
    for written in out.glob("*.jsonl"):
        rows += [json.loads(line) for line in written.read_text().splitlines() if line]
    # every cgroup this run made, also a worker's that wrote no row (killed, crashed): named by the
    # run's pytest pid, the workers' parent
    made = [Path(row["cgroup"]) for row in rows if "cgroup" in row]
    made += [group for parent in {g.parent for g in made} | set(_run_roots())
             for group in parent.glob(f"suite-cpu-{proc.pid}-*") if group.is_dir()]
    left = remove_cgroups(made)
    result = report(rows, wall, workers)
    result.update(exit_code=proc.returncode, cgroups_left_holding_processes=left, processes=census.report())
    print(json.dumps(result))

if __name__ == "__main__":
    main(sys.argv[1:])
