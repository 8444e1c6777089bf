"""Spot and elastic on real Ray, driven from outside: a head and a second Ray node on this machine.

One job (tiny Qwen2, synthetic tokens, global batch 4, ``parallel.min_nodes = 1`` of 2 nodes x 2
workers) runs as ``python -m training`` against a head started by ``ray start --head`` and a
second node started by ``ray start --address`` with its own CPUs. From outside the run:

1. the second node is drained the way Ray Core drains a node for a spot reclaim: ``ray
   drain-node`` (the GCS DrainNode RPC, reason PREEMPTION, a deadline; ray 2.58
   ``ray/scripts/scripts.py`` ``drain_node``, the same call the autoscaler makes), given while the
   workers are paused (SIGSTOP) so the run cannot end before it -> the workers commit a
   checkpoint at the step boundary and hold; inside the notice the node is killed whole
   (every process of it, SIGKILL: the node runs in a session of its own), as EC2 reclaims it;
2. the run goes on at 2 workers from that checkpoint (0 steps lost);
3. a new node joins (``ray start --address``) -> Ray Train's elastic policy grows the run back to 4
   (the two workers are paused with SIGSTOP while the node starts and Ray Train notices it: on
   this loaded 2-core machine that takes 10-60 s, and the 2-worker run would finish first).

The reference is the same job with no faults in one plain process (training/launch.py
``run_in_process``: the loop with no Ray, 1 worker summing the 4 micro batches), run before the
Ray head starts. Every step's loss of the elastic run equals the reference's within
:data:`LOSS_TOLERANCE`: the data of each step and the global batch are the same at every size
(training/data/stream.py); only the order of the reduction differs (4 workers sum 1 micro batch
each, 2 workers 2). run.json names each incident.
A node killed without notice takes the same restart path as step 1 after its kill (Ray Train's
worker health check instead of its PREEMPTING state); its record is tested in test_incidents.py.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from raytrain_eks.backends.local_services import LOOPBACK, free_port, ray_head
from ray_session import TEST_ENV

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOSS_TOLERANCE = 1e-5
"""Absolute, per step: fp32 sums over 4 micro batches in another order (measured 2.5e-7 over 60
steps at 4 -> 2 -> 4 workers against 4 Ray workers throughout, and 2.5e-7 between those 4 workers and
one process summing the 4 micro batches)."""
DRAIN_DEADLINE_S = 600
"""The notice's deadline: the test kills the node itself once the checkpoint on notice is noted,
so the deadline only has to outlast that on a loaded machine (it is recorded, never waited out)."""
MAX_STEPS = 30
"""Steps the run never reaches before the test acted: the workers are paused at each
observation the test acts on (the drain, the node's start), so only the few steps between an
observation and the pause are spent meanwhile (60 steps before the drain was paused: at a load
average of 40 the notice landed at step 46)."""

HEAD_ENV = {"RAY_health_check_period_ms": "1000"}
"""For the test head's GCS: how often it checks each raylet (ray 2.58 ``ray_config_def.h``
``health_check_period_ms``, 3000 by default; read from ``RAY_<name>`` by every Ray process). A
node is marked dead after ``health_check_failure_threshold`` (5) failed checks in a row: a
raylet killed whole is found dead in ~5 s instead of ~15 s (measured: 5.2 s against 12.1 s). A
live raylet fails a check only by not answering within ``health_check_timeout_ms`` (10 s, kept),
so a busy machine cannot lose a node this way."""
NODE_ENV = {"RAY_memory_monitor_refresh_ms": "0"}
"""For every raylet of the test cluster (head included): no memory monitor. A raylet kills the
newest workers once the MACHINE's memory passes 95 % (``memory_usage_threshold``), whoever holds
it; on a machine shared with other test processes that failed 3 of 4 runs of this test. "To
disable worker killing, set the environment variable RAY_memory_monitor_refresh_ms to zero"
(ray 2.58's own OutOfMemoryError text). The kernel's OOM killer still acts on a real lack."""

JOB = """name = "elastic"
[model]
config = {{ hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 2, num_key_value_heads = 1, intermediate_size = 64, vocab_size = 512, max_position_embeddings = 128, tie_word_embeddings = true }}
[data]
kind = "synthetic"
[train]
seq_len = 32
micro_batch_size = 1
global_batch_size = 4
max_steps = {steps}
lr = 3e-3
warmup_steps = 2
log_every_n_steps = 1
report_every_n_steps = 1
[parallel]
strategy = "full_shard"
num_workers = 4
workers_per_node = 2
min_nodes = {min_nodes}
cpus_per_worker = 0.5
use_gpu = false
[checkpoint]
storage_path = "{storage}"
run_name = "{run}"
every_n_steps = 3
keep_last = 2
max_failures = 3
export_hf = false
[eval]
max_batches = 1
[evidence]
require_transport = "any"
"""


class Node(NamedTuple):
    """A Ray node this test started with ``ray start --address``."""

    port: int
    """Its node manager port: what names its raylet (``ray.nodes()`` ``NodeManagerPort``)."""
    session: int
    """The session its ``ray start`` led (``start_new_session``): every process of the node is in
    it. The raylet, its log monitor (the raylet's sibling, not its child: ``ray start`` starts
    both, then exits) and its agents share that session's process group; each Ray worker is in a
    process group of its own, still in the session."""


def _start_node(head, temp_root: Path, name: str, cpus: int = 1) -> Node:
    """``ray start --address``: a second Ray node on loopback with ``cpus`` CPUs (1: 2 workers of
    0.5), its own ports and ``head.client_env`` (what the node's raylet and its workers inherit),
    in a session of its own. On a busy machine a raylet can miss Ray's start-up wait: what it
    left is killed and it starts again."""
    for attempt in range(3):
        node, code = _start_node_once(head, temp_root, name, cpus)
        if code == 0:
            return node
        _kill_node(node)
        if attempt == 2:
            log = (temp_root / f"{name}.log").read_text()[-3000:]
            raise AssertionError(f"ray start of {name} exited {code}: {log}")


def _start_node_once(head, temp_root: Path, name: str, cpus: int = 1) -> tuple[Node, int]:
    port = free_port()
    ports = {flag: free_port() for flag in ("--object-manager-port", "--metrics-export-port",
                                            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                            "--runtime-env-agent-port")}
    cmd = [str(Path(sys.executable).with_name("ray")), "start", f"--address={head.gcs_address}",
           f"--node-ip-address={LOOPBACK}", f"--num-cpus={cpus}", "--num-gpus=0", f"--node-manager-port={port}",
           "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats",
           *(f"{flag}={p}" for flag, p in ports.items())]
    env = {**os.environ, **NODE_ENV, **head.client_env, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(temp_root / f"{name}.log", "a") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            code = -1  # killed with the rest of its session by the caller
    return Node(port=port, session=proc.pid), code


def _node_processes(node: Node) -> list:
    """Every process of ``node`` still running (a zombie has exited: it only waits to be reaped):
    those of its session, and its raylet's descendants wherever they are."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            raylet = (proc.info["cmdline"] and "raylet" in proc.info["cmdline"][0]
                      and f"--node_manager_port={node.port}" in " ".join(proc.info["cmdline"]))
            if os.getsid(proc.pid) == node.session or raylet:
                found[proc.pid] = proc
                if raylet:
                    found.update((c.pid, c) for c in proc.children(recursive=True))
        except (ProcessLookupError, psutil.Error):  # gone meanwhile
            pass
    return [p for p in found.values() if _runs(p)]


def _runs(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_node(node: Node, bound_s: float = 60) -> list:
    """The node killed whole, as EC2 reclaims an instance: SIGKILL to its session's process group
    (raylet, log monitor and agents at once), then to every other process of it (its workers),
    again until none runs. Returns what still runs after ``bound_s`` (nothing: callers assert
    it)."""
    import psutil

    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.session, signal.SIGKILL)
    deadline = time.monotonic() + bound_s
    while (left := _node_processes(node)) and time.monotonic() < deadline:
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        time.sleep(0.1)
    return [_described(p) for p in left if _runs(p)]


def _described(proc) -> str:
    import psutil

    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return str(proc.pid)


def _train_workers(head, *nodes: Node) -> list:
    """The Ray Train worker processes of this head (under its own raylet, named by its temp dir)
    and of ``nodes``."""
    import psutil

    raylets = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
               and "raylet" in p.info["cmdline"][0] and any(head.temp_dir in a for a in p.info["cmdline"])]
    procs = [c for r in raylets for c in r.children(recursive=True)] + [p for n in nodes for p in _node_processes(n)]
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if "RayTrainWorker" in " ".join(proc.cmdline() or [proc.name()]):
                out.append(proc)
    return out


@contextlib.contextmanager
def _paused(procs: list):
    """``procs`` stopped (SIGSTOP, as a stalled host pauses them) until the block ends: the run
    cannot go on while the test acts, however long the action takes on a loaded machine."""
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            try:
                proc.send_signal(signal.SIGCONT)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _controller_said(head, text: str) -> bool:
    """Ray Train's controller log of this head's session holds ``text``."""
    logs = Path(head.temp_dir) / "session_latest" / "logs" / "train"
    return any(text in f.read_text(errors="replace") for f in logs.glob("ray-train-sys-controller-*.log"))


def _node_id(head, port: int) -> str:
    code = ("import ray, json; ray.init(address='%s', log_to_driver=False); "
            "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerPort'] == %d]))"
            % (head.gcs_address, port))
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **head.client_env}, capture_output=True,
                         text=True, timeout=600, check=True)  # a bound on a hang: a loaded machine's driver start
    return json.loads(out.stdout.strip().splitlines()[-1])[0]


def _notes(run_dir: Path) -> list[dict]:
    from training.incidents import read_notes

    return read_notes(str(run_dir))


def _wait(what: str, check, timeout: float, proc: subprocess.Popen) -> None:
    began = time.time()
    while time.time() - began < timeout:
        if check():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _losses(run_dir: Path) -> dict[int, float]:
    """The loss of every step; a step done again after a restore: its FIRST record (the steps
    done at 2 workers are redone at 4 from the last periodic checkpoint: their last record would
    be a 4-worker one, and the comparison would never see a 2-worker step)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "train":
            out.setdefault(row["step"], row["loss"])
    return out


def _reached(run_dir: Path) -> int:
    """The highest step metrics.jsonl holds while the run writes it (0 for none yet). A restart
    writes the file anew from what storage holds (training/metrics.py): read meanwhile, it can be
    empty or end in half a line."""
    try:
        return max(_losses(run_dir) or [0])
    except (OSError, ValueError):  # not there yet, or a line still being written
        return 0


_REFERENCE = """
import sys
from training.config import load_job_config
from training.launch import run_in_process
from training.loop import local_context

job_file, local = sys.argv[1:3]
job = load_job_config(job_file, ["parallel.num_workers=1", "parallel.workers_per_node=1", "parallel.min_nodes=0",
                                 "checkpoint.every_n_steps=0"])
record = run_in_process(job, local_context(local, run_dir=f"{job.checkpoint.storage_path}/{job.run_name}"))
sys.exit(0 if record.get("status") == "succeeded" else 1)
"""


def _reference(tmp: Path) -> subprocess.Popen:
    """The job with no faults in one plain process (no Ray): the same global batch of 4 micro
    batches each step, summed by one worker; no periodic checkpoint (nothing resumes from it).
    Its metrics.jsonl is in its local directory, ``reference-local``."""
    job = tmp / "reference.toml"
    job.write_text(JOB.format(steps=MAX_STEPS, min_nodes=0, storage=tmp / "store", run="reference"))
    (tmp / "reference-local").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY")}
    # one intra-op thread, as Ray gives each worker of 0.5 CPU (ray 2.58 ``ray/_private/utils.py``
    # ``set_omp_num_threads_if_unset``); more spin against each other on a loaded machine
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", _REFERENCE, str(job), str(tmp / "reference-local")], cwd=ROOT,
                            env=env, stdout=open(tmp / "reference.out", "w"),
                            stderr=subprocess.STDOUT)


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen):
    """``proc``, killed on the way out if it still runs."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _launch(tmp: Path, head, run: str, min_nodes: int) -> subprocess.Popen:
    job = tmp / f"{run}.toml"
    job.write_text(JOB.format(steps=MAX_STEPS, min_nodes=min_nodes, storage=tmp / "store", run=run))
    env = {**os.environ, **head.client_env, "RAY_ADDRESS": head.gcs_address,
           # the controller's poll (tests/ray_session.py): each checkpoint report waits for one
           **TEST_ENV,
           # Ray Train checks for more capacity this often (training/launch.py); the capacity it
           # sees is Ray Data's AutoscalingCoordinator's view, refreshed every 20 s
           # (ray 2.58 data/_internal/cluster_autoscaler/default_autoscaling_coordinator.py
           # TICK_INTERVAL_S): a shorter check only stops adding to that
           "RAYTRAIN_ELASTIC_RESIZE_INTERVAL_S": "2", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
           # The bound on the placement group's reservation only (ray 2.58
           # train/v2/_internal/execution/worker_group/worker_group.py: ``pg_handle.wait``; actor
           # start-up comes after it, unbounded), ready within 0.1 s here whenever the CPUs exist
           # (measured at a load average of 20). After the node is lost a restart is sized from
           # the coordinator's view, stale until its next 20 s tick (4 workers), and waits out
           # this bound before Ray Train sizes it again: each try that cannot be placed is a
           # controller failure Ray Train retries (training/launch.py ``placement_retries``), so
           # a bound of 10 s ends the wait at most 10 s after the tick, where 30 s always took 30.
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10",
           # the two workers are paused on purpose while a node joins: not a hang for the
           # progress watchdog (training/watchdog.py)
           "RAYTRAIN_HANG_FLOOR_S": "900",
           "RAYTRAIN_CHECKPOINT_LOCAL_DIR": str(tmp / "scratch")}
    return subprocess.Popen([sys.executable, "-m", "training", "--config", str(job)], cwd=ROOT, env=env,
                            stdout=open(tmp / f"{run}.out", "w"), stderr=subprocess.STDOUT)


def test_drain_then_lost_node_then_growth_keeps_every_loss(tmp_path):
    store = tmp_path / "store"
    # first and alone: a Ray head starting beside it competes for the 2 cores with fixed start-up
    # waits (one such head failed its 3 starts on the loaded machine)
    with _reaped(_reference(tmp_path)) as reference:
        assert reference.wait(timeout=900) == 0, (tmp_path / "reference.out").read_text()[-3000:]
    with ray_head(num_cpus=1, env={**HEAD_ENV, **NODE_ENV}, keep_logs=tmp_path / "ray-logs") as head:
        second = _start_node(head, tmp_path, "node-b")
        third = None
        # asked while the run starts (a Ray driver of its own, seconds): the drain follows step 5
        # without this wait
        asking = concurrent.futures.ThreadPoolExecutor(1)
        second_id = asking.submit(_node_id, head, second.port)
        asking.shutdown(wait=False)

        run = _launch(tmp_path, head, "elastic", min_nodes=1)
        run_dir = store / "elastic"
        try:
            second_id = second_id.result(timeout=600)
            _wait("step 5", lambda: _reached(run_dir) >= 5, 600, run)
            # 1. the notice, as Ray Core gets it for a spot reclaim, given while the 4 workers
            # are paused: the CLI takes seconds to start on a loaded machine, and the run must
            # not end meanwhile; they take it at their next step boundary
            with _paused(_train_workers(head, second)):
                subprocess.run([str(Path(sys.executable).with_name("ray")), "drain-node",
                                f"--address={head.gcs_address}", f"--node-id={second_id}",
                                "--reason=DRAIN_NODE_REASON_PREEMPTION",
                                "--reason-message=spot interruption notice (test)",
                                f"--deadline-remaining-seconds={DRAIN_DEADLINE_S}"],
                               env={**os.environ, **head.client_env}, check=True, timeout=120)
            _wait("the checkpoint on notice", lambda: any(n["note"] == "notice" for n in _notes(run_dir)), 300, run)
            # the reclaim, inside the notice. Ray Train restarts once its poll of the killed
            # node's workers fails (when the GCS marks the node dead, HEAD_ENV), before the
            # deadline; its first try is sized from a view that may still count the node (see
            # RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S in _launch), the next from what is left
            assert _kill_node(second) == []  # nothing of it runs on: the log monitor neither
            # 2. on what is left, 3. a node joins again: back to 4
            _wait("2 workers", lambda: any(n["note"] == "start" and n["world_size"] == 2 for n in _notes(run_dir)),
                  300, run)
            [resumed] = [n["resumed_from_step"] for n in _notes(run_dir) if n["note"] == "start" and n["world_size"] == 2]
            _wait("a step at 2 workers", lambda: _reached(run_dir) > resumed, 300, run)
            # A 2-worker step takes ~0.3 s here; a node takes 10-60 s to start on this loaded
            # machine, and Ray Train sees it within 20 s more (the coordinator's tick): the two
            # workers are paused (SIGSTOP, as a stalled host pauses them) while the node joins,
            # and go on once Ray Train decided to grow (its health check waits 10 min).
            with _paused(_train_workers(head)):
                third = _start_node(head, tmp_path, "node-c")
                _wait("the decision to grow", lambda: _controller_said(head, "resize the worker group from 2 -> 4"),
                      600, run)
            _wait("4 workers again", lambda: [n["world_size"] for n in _notes(run_dir) if n["note"] == "start"][-1] == 4,
                  600, run)
            assert run.wait(timeout=1200) == 0, (tmp_path / "elastic.out").read_text()[-3000:]
        finally:
            if run.poll() is None:
                run.kill()
            left = {node.port: _kill_node(node) for node in (second, third) if node is not None}
        assert left == {second.port: [], **({third.port: []} if third else {})}, left

    record = json.loads((run_dir / "run.json").read_text())
    sizes = [a["world_size"] for a in record["attempts"]]
    assert sizes == [4, 2, 4], sizes
    [notice] = [i for i in record["incidents"] if i["kind"] == "preemption"]
    # the checkpoint on notice is the step the run went on from: no step lost
    assert notice["step"] == notice["resumed_from_step"] == record["attempts"][1]["resumed_from_step"]
    assert notice["steps_lost"] == 0 and not set(notice["nodes"]) & set(record["attempts"][1]["nodes"])
    assert record["cost"]["node_hours"] and record["cost"]["device_minutes_lost"] > 0, record["cost"]
    # ONE incident for the drain: the drained node's loss is folded into the preemption
    assert "node_lost" not in [i["kind"] for i in record["incidents"]], record["incidents"]
    # steps first done at 2 workers exist, and their first records are what is compared below
    starts = [n for n in _notes(run_dir) if n["note"] == "start"]
    at_two = range(starts[1]["resumed_from_step"] + 1, starts[2]["reached_step"] + 1)
    assert len(at_two) > 0, starts
    want, got = _losses(tmp_path / "reference-local"), _losses(run_dir)
    assert sorted(got) == sorted(want) == list(range(1, MAX_STEPS + 1))
    worst = max(abs(got[s] - want[s]) for s in want)
    print(f"elastic vs reference: worst |loss difference| over {len(want)} steps = {worst:.2e} "
          f"(2-worker steps {at_two.start}-{at_two.stop - 1}: {max(abs(got[s] - want[s]) for s in at_two):.2e}); "
          f"attempts {sizes}; incidents {[i['kind'] for i in record['incidents']]}")
    assert worst <= LOSS_TOLERANCE
