"""What a local Ray head costs in CPU, by process kind: its start-up, an idle spell, one short job.

Two heads, each as the project starts it: ``product`` (``raytrain_eks.backends.local_services.ray_head``,
what ``submit --local``, the warm head and ``make demo`` run, and a one-line ``ray job submit``
through its job supervisor) and ``session`` (the tests' ``ray.init`` cluster, tests/ray_session.py
``start_session_cluster``, and 8 tasks and one actor of its driver). CPU-seconds are read from
/proc (``utime + stime`` of each process of the head's own tree, every 0.5 s, keyed by pid and
start time), so other work on the machine does not count; wall times do depend on it.

Run: ``.venv/bin/python bench/bench_head_cpu.py [product|session] [IDLE_S]`` (default both, 60 s idle;
about 4 minutes);
``HEAD_ENV=K=V,K=V`` sets variables for the head (e.g. ``RAY_enable_worker_prestart=1,
RAY_prestart_worker_first_driver=1`` for Ray's default prestart). Prints a table, then ONE JSON
object on its last line. Figures are reported, never asserted.
"""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from raytrain_eks.backends.local_services import _processes, head_processes, ray_head  # noqa: E402
from suite_cpu import Census  # noqa: E402  (the one /proc sampler: per pid and start time, SIGKILLed processes kept)

SCRIPTS = ("log_monitor", "dashboard/dashboard.py", "autoscaler/_private/monitor.py", "runtime_env/agent",
           "setup_worker", "ray.util.client.server", "default_worker")


def _kind(titles: list[str]) -> str:
    """A finer kind than the suite's census (bench/suite_cpu.py ``process_kind``): each daemon of a
    head by its own name, by the latest command line the census saw."""
    cmdline = titles[-1] if titles else ""
    program = Path(cmdline.split(" ", 1)[0]).name
    if program in ("raylet", "gcs_server"):  # their command lines name other scripts (the agents')
        return program
    if (named := re.search(r"ray::([\w.]+)", cmdline)) is not None:
        return "ray::" + named.group(1)
    return next((s.rsplit("/", 1)[-1] for s in SCRIPTS if s in cmdline), program)


def watch(census: Census, seconds: float, until=None) -> None:
    """Sample every 0.5 s for ``seconds`` (or while ``until()``), then once more."""
    end = time.monotonic() + seconds
    while (until() if until else time.monotonic() < end):
        census.sample()
        time.sleep(0.5)
    census.sample()


def totals(census: Census) -> tuple[collections.Counter, collections.Counter]:
    """CPU-seconds and processes so far, by kind."""
    kinds = census.by_kind()
    return (collections.Counter({k: sum(v) for k, v in kinds.items()}),
            collections.Counter({k: len(v) for k, v in kinds.items()}))


def _descendants() -> set[int]:
    table, children = _processes(), collections.defaultdict(list)
    for pid, proc in table.items():
        children[proc.parent].append(pid)
    found, todo = set(), list(children[os.getpid()])
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def product(idle_s: float) -> tuple[dict, dict]:
    phases, notes = {}, {}
    began = time.monotonic()
    with ray_head(num_cpus=4) as head:
        census = Census(lambda: head_processes(head.temp_dir, head.gcs_address), kind=_kind)
        notes["up_s"] = round(time.monotonic() - began, 1)
        watch(census, 0)
        phases["start"] = totals(census)
        watch(census, idle_s)
        phases["idle"] = totals(census)
        job = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "job", "submit", "--", "python", "-c",
                                "print('hello job')"], env={**os.environ, **head.client_env, "RAY_ADDRESS": head.dashboard_url},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watch(census, 0, until=lambda: job.poll() is None)
        watch(census, 5)
        phases["job"] = totals(census)
        notes["job_ok"] = job.returncode == 0 and "hello job" in job.stdout.read()
    return phases, notes


def session(idle_s: float) -> tuple[dict, dict]:
    import ray
    from ray_session import start_session_cluster

    phases, notes, census = {}, {}, Census(_descendants, kind=_kind)
    began = time.monotonic()
    start_session_cluster(ray)
    notes["up_s"] = round(time.monotonic() - began, 1)
    watch(census, 3)
    phases["start"] = totals(census)
    watch(census, idle_s)
    phases["idle"] = totals(census)

    @ray.remote
    def task(i):
        return i

    @ray.remote
    class Actor:
        def ping(self):
            return "pong"

    actor = Actor.remote()
    notes["job_ok"] = ray.get([task.remote(i) for i in range(8)]) == list(range(8)) and ray.get(actor.ping.remote()) == "pong"
    del actor
    watch(census, 5)
    phases["job"] = totals(census)
    ray.shutdown()
    return phases, notes


def _report(mode: str, idle_s: float) -> dict:
    phases, notes = {"product": product, "session": session}[mode](idle_s)
    (start, _), (idle, _), (job, count) = phases["start"], phases["idle"], phases["job"]
    rows = {kind: {"n": count[kind], "start": round(start[kind], 2), "idle": round(idle[kind] - start[kind], 2),
                   "job": round(job[kind] - idle[kind], 2)} for kind in sorted(job, key=lambda k: -job[k])}
    print(f"{'kind':26s} {'n':>3s} {'start':>7s} {'idle':>7s} {'job':>7s}   CPU-s ({mode}, idle {idle_s:.0f} s)")
    for kind, row in rows.items():
        print(f"{kind:26s} {row['n']:3d} {row['start']:7.2f} {row['idle']:7.2f} {row['job']:7.2f}")
    total = {phase: round(sum(r[phase] for r in rows.values()), 2) for phase in ("start", "idle", "job")}
    print(f"{'TOTAL':26s}     {total['start']:7.2f} {total['idle']:7.2f} {total['job']:7.2f}", flush=True)
    return {**notes, "total_cpu_s": total, "by_kind": rows}


def main() -> None:
    modes = [sys.argv[1]] if len(sys.argv) > 1 else ["product", "session"]
    idle_s = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    for pair in filter(None, os.environ.get("HEAD_ENV", "").split(",")):
        key, value = pair.split("=", 1)
        os.environ[key] = value
    figures = {mode: _report(mode, idle_s) for mode in modes}
    print(json.dumps({"name": "head_cpu", "idle_s": idle_s, "head_env": os.environ.get("HEAD_ENV", ""), **figures}))


if __name__ == "__main__":
    main()
