"""Chaos on the local path: real faults, injected from outside the job's processes, while real
Ray runs the local job (synthesized as ``submit`` writes it, submitted with the job API to a
real local Ray head with token auth, storage moto's S3). ONE run meets three faults in turn, as a
run hours in meets them: it heals each time, its losses equal an uninterrupted run's step for
step, and its run.json names the three incidents in order.

One head and one store (the machine is small): the head holds one worker's CPU, a second Ray
node (``ray start --address``, as a worker pod joins on EKS) the other's, so the run spans two
nodes as a multi-node job does. ONE Ray job: the faulted run (a job costs ~50-60 CPU-seconds of
start-ups: its driver, controller, two workers importing torch and transformers, Ray Train's helper
actors; three faulted runs cost three of them). The uninterrupted run its losses must equal step
for step (``==``) is the same job trained without Ray on the same two ranks (``reference``: two
plain gloo processes running the Ray workers' loop), run before the head starts. The faults, in
the order the run meets them:

1. a rank frozen with SIGSTOP (a process that is alive and answers nothing: Ray Train's health
   check would wait ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``, 600 s): the progress watchdog
   (training/watchdog.py) declares the hang, saves the stacks, kills the frozen rank; the run
   resumes from step 4;
2. the second node killed whole (its raylet and every process of it, SIGKILL: an instance lost),
   a third node joining afterwards as a replacement would; the run resumes from step 8;
3. a rank killed with SIGKILL (what the OOM killer does) while the store, slowed under a
   checkpoint (devtools/slow_store.py), takes the step-16 checkpoint: Ray Train restarts the
   group and the run resumes from the last checkpoint the store completed, step 12.

Every fault strikes at a known point: once Ray Train has registered the checkpoint the run must
resume from (its checkpoint manager's snapshot in the store names it; the first fault also waits
for step :data:`FIRST_FAULT_AFTER_STEP`), while the store holds the NEXT checkpoint's upload
(:data:`HOLD`) until the fault has struck and that attempt's workers are gone: the checkpoints
upload in the background (ASYNC), so on a loaded machine the loop can run a checkpoint or two
ahead of the controller's registration, and without the hold the next checkpoint could be
registered before the fault. Each fault's hold replaces the one before at once (the next
checkpoint is held as the one the fault after it resumes from completes), so a later fault's
readiness (a newer checkpoint registered) can only be reached by the attempt after the fault
before it. Nothing here races the clock. Three failures are more than the local job's failure
budget (``checkpoint.max_failures``, 2 by default; Ray Train's ``FailureConfig.max_failures``,
training/launch.py): :data:`SETS` raises it to 3, which the three faults use up exactly. The
watchdog runs at its production floor (60 s); bench/bench_recovery.py measures fault-to-progress
times.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.slow_store import slow_store
from devtools.strike import HOLD, ray_train_workers, registered
from training.contract import ENV_CACHE_DIR

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 18
"""Long enough for three faults, each after a registered checkpoint and before a held one, and
for the last fault's held checkpoint (16) to fall mid-run, not at the last step. (The local job's
own length is 10 steps; its acceptance criteria, eval loss <= 10.5, are met by 10.)"""
CHECKPOINT_EVERY = 4
"""Checkpoints at steps 4, 8, 12, 16 and 18 (the last step's)."""
RESUMES_FROM = {"hang": 4, "node_lost": 8, "worker_lost": 12}
"""The faults in the order the run meets them, each with the checkpoint it resumes from:
registered by Ray Train before the fault strikes, the next one held until it has struck."""
FIRST_FAULT_AFTER_STEP = 5
"""The first fault (the hang) strikes once this step is logged (and step 4 is registered). Three
plain steps (1->2, 2->3, 4->5) and one checkpointing step (3->4) are measured by then: the
watchdog's bound is its floor, not its first-steps bound."""
SETS = [f"train.max_steps={MAX_STEPS}", f"checkpoint.every_n_steps={CHECKPOINT_EVERY}", "checkpoint.keep_last=5",
        "eval.every_n_steps=0", "checkpoint.export_hf=false", f"checkpoint.max_failures={len(RESUMES_FROM)}"]
"""``checkpoint.max_failures``: the job's failure budget (2 by default) must hold the three
faults; the reference gets the same (it changes no loss) so both train one job config."""
HANG_ENV = {"RAYTRAIN_HANG_FLOOR_S": "60", "RAYTRAIN_HANG_FIRST_STEP_S": "300"}
"""The production floor (60 s), named: the session's Ray processes carry the tests' 600 s
(tests/ray_session.py ``TEST_ENV``) and the head inherits this process's environment; a lower one
declared a false hang here when the shared machine slowed one 6 s step to 28 s. The first-step
bound is shortened (the faults strike later)."""
NO_HOST_OOM_KILLS = {"RAY_memory_monitor_refresh_ms": "0"}
"""Ray 2.58's memory monitor (its raylet kills workers once memory use passes
``RAY_memory_usage_threshold``, 0.95; "To disable worker killing, set the environment variable
`RAY_memory_monitor_refresh_ms` to zero", its own message) reads this process tree's host: on the
shared test machine other projects' processes pushed it past 95% and it killed the reference
run's worker and the controller's helper actors ("Ray killed 3 worker(s) based on the killing
policy"), a fault no case injected. On EKS a Ray pod's monitor reads its own cgroup's limit.
Off for these clusters."""
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
FAST = 512 * 2**20
POLL_S = 0.5
"""How often a wait looks again (the bounds below are generous; only the polls are short)."""


def _wait(predicate, bound_s: float, what: str):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """A worker Ray node of this machine: ``ray start --address ... --block`` in its own session."""

    def __init__(self, head, env: dict[str, str], name: str):
        self.head, self.env, self.name = head, env, name
        self.log = open(Path(head.temp_dir) / f"{name}.log", "a")
        self._start()

    def up(self) -> bool:
        """Start it again if it exited (on a loaded machine Ray's fixed 30 s raylet registration
        wait can run out, as raytrain_eks/backends/local_services.py's heads retry for); False."""
        if self.proc.poll() is not None:
            self._start()
        return False

    def _start(self) -> None:
        from raytrain_eks.backends.local_services import free_port

        head, env, name = self.head, self.env, self.name
        self.temp_dir = f"{head.temp_dir}/{name}"  # under the head's: its cleanup stops this node too
        ports = [f"{flag}={free_port()}" for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                                       "--runtime-env-agent-port", "--metrics-export-port")]
        cmd = [str(Path(sys.executable).with_name("ray")), "start", f"--address={head.gcs_address}",
               "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0", f"--temp-dir={self.temp_dir}",
               "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", "--block", *ports]
        child = {**os.environ, **env, **head.client_env, "RAY_API_SERVER_ADDRESS": head.dashboard_url,
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        self.proc = subprocess.Popen(cmd, env=child, start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self, actor_pids: list[int]) -> None:
        """The node lost whole: every process of its session (its raylet first, so no one is
        left to report a worker's death as a worker's: the instance is gone), then any worker
        of it that left the session, SIGKILL."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in actor_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


def _alive_nodes(head) -> int:
    from ray.util.state import list_nodes

    # a filter that leaves nodes out is "truncation" to the state API unless told otherwise
    return len(list_nodes(address=head.dashboard_url, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False))


def _workers(head) -> list:
    return ray_train_workers(head.dashboard_url)


@pytest.fixture(scope="module")
def cluster():
    """Head (one worker's CPU) + a worker node (the other's), over a store whose speed a case sets."""
    from raytrain_eks.backends.local_services import ray_head

    with slow_store(FAST) as store:
        env = {**store.client_env, **HANG_ENV, **NO_HOST_OOM_KILLS}
        with ray_head(num_cpus=1, env=env) as head:
            saved = {k: os.environ.get(k) for k in (*store.client_env, *head.client_env)}
            os.environ.update({**store.client_env, **head.client_env})
            nodes = [Node(head, env, "node-b")]
            try:
                _wait(lambda: nodes[0].up() or _alive_nodes(head) == 2, 600, "the second node to join")
                yield {"head": head, "store": store, "env": env, "nodes": nodes}
            finally:
                for node in nodes:
                    node.kill([])
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value


class _Job:
    """The local job synthesized as ``submit`` writes it for ``run`` (its code in the store); not
    yet submitted."""

    def __init__(self, cluster, tmp: Path, run: str):
        from charts.main import read_rayjob
        from environment import load_environment
        from raytrain_eks.backends.local import job_client
        from raytrain_eks.runs.manifest import synth_run
        from raytrain_eks.runs.results import s3_client, upload_if_missing

        self.head, self.run = cluster["head"], run
        spec = ROOT / "environment.toml"
        manifests = synth_run(load_environment(spec), ROOT / "jobs" / "local.toml", run=run, overrides=SETS,
                              outdir=tmp, spec_text=spec.read_text(encoding="utf-8"))
        self.s3 = s3_client(cluster["store"].client_env)
        upload_if_missing(self.s3, manifests.code_path, manifests.code_uri, create_bucket=True)
        self.rayjob, self.run_uri = read_rayjob(manifests.rayjob), manifests.run_uri
        self.client = job_client(self.head.dashboard_url, self.head.client_env)

    def submit(self) -> None:
        from raytrain_eks.backends.local import submit

        submit(self.head.dashboard_url, self.run, self.rayjob.entrypoint, self.rayjob.runtime_env_yaml,
               auth_env=self.head.client_env)

    def status(self) -> str:
        value = self.client.get_job_status(self.run)
        return str(getattr(value, "value", value))

    def logs(self) -> str:
        return self.client.get_job_logs(self.run)

    def read(self, name: str) -> bytes:
        from raytrain_eks.runs.results import split_uri

        bucket, key = split_uri(f"{self.run_uri}/{name}")
        return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    def attempt_trained(self) -> int:
        """The highest train step of the current attempt that rank 0 has stored in
        ``metrics.jsonl`` (every ``train.report_every_n_steps``), 0 if none. The file is the run's
        history, appended in order, and a resumed attempt starts again from its checkpoint: the
        current attempt's rows follow the last row whose step is not above the one before it. (A
        torn-down attempt stores nothing more: its rank 0 is gone.)"""
        try:
            text = self.read("metrics.jsonl").decode()
        except self.s3.exceptions.NoSuchKey:
            return 0
        steps = [row["step"] for row in map(json.loads, filter(str.strip, text.splitlines()))
                 if row.get("kind") == "train"]
        starts = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
        return max(steps[starts[-1] if starts else 0:], default=0)

    def wait_registered(self, step: int, *, logged: int | None = None, trained: int | None = None) -> None:
        """Until Ray Train's newest registered checkpoint is step ``step``'s (and, with ``logged``,
        that step is in the job's log; with ``trained``, the current attempt has stored that step
        or a later one); the job must still be running then."""
        from training.checkpointing.manager import checkpoint_dir_name

        def ready() -> bool:
            if self.status() in TERMINAL:
                return True
            if logged is not None and not re.search(rf"\bstep {logged}/{MAX_STEPS} \|", self.logs()):
                return False
            if trained is not None and self.attempt_trained() < trained:
                return False
            return registered(self.s3, self.run_uri) == checkpoint_dir_name(step)

        _wait(ready, 900, f"{checkpoint_dir_name(step)} of {self.run} registered")
        assert self.status() == "RUNNING", self.logs()[-4000:]

    def finish(self) -> dict:
        """Wait for the end; run.json, the losses by step and the logs."""
        _wait(lambda: self.status() in TERMINAL, 1200, f"{self.run} to end")
        logs = self.logs()
        try:
            metrics = self.read("metrics.jsonl").decode()
        except Exception as err:  # noqa: BLE001 - the job's own log says why
            raise AssertionError(f"{self.run}: no metrics.jsonl ({err}):\n{logs[-6000:]}") from None
        losses: dict[int, float] = {}
        for line in metrics.splitlines():
            row = json.loads(line)
            if row.get("kind") == "train":
                losses[row["step"]] = row["loss"]  # a step redone after a resume: the later write wins
        return {"record": json.loads(self.read("run.json")), "losses": losses, "logs": logs}


def _run(cluster, tmp: Path, run: str, fault=None) -> dict:
    """One job with at most one fault (bench/bench_recovery.py times each fault alone):
    ``fault(client, run)`` strikes at the first fault's point (step :data:`FIRST_FAULT_AFTER_STEP`
    logged, step 4 registered, step 8's upload held until it has struck). :meth:`_Job.finish`'s."""
    from training.checkpointing.manager import checkpoint_dir_name

    job = _Job(cluster, tmp, run)
    if fault is None:
        job.submit()
        return job.finish()
    with cluster["store"].slowed(HOLD, only=f"/{run}/{checkpoint_dir_name(2 * CHECKPOINT_EVERY)}/"):
        job.submit()
        job.wait_registered(CHECKPOINT_EVERY, logged=FIRST_FAULT_AFTER_STEP)
        fault(job.client, run)
    return job.finish()


WORLD = 2
"""The local job's workers (``parallel.num_workers``): the oracle runs as many ranks."""


def _oracle_rank(rank: int, out_dir: str) -> None:
    """One rank of the oracle: the job :class:`_Job` submits (jobs/local.toml and :data:`SETS`,
    run from the repository root as the job runs from its unpacked code archive, the same files)
    trained by training/launch.py ``run_in_process`` (the Ray workers' loop; rank 0 also the
    driver's record code) in a plain gloo process, its checkpoints in a local folder. One
    intra-op thread (tests/spawn_ranks.py), as Ray gives each one-CPU worker."""
    import torch.distributed as dist

    from training.config import load_job_config
    from training.launch import run_in_process
    from training.loop import local_context

    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{out_dir}/pg-store")
    os.chdir(ROOT)
    os.environ[ENV_CACHE_DIR] = f"{out_dir}/cache"
    storage = f"{out_dir}/store"
    job = load_job_config(ROOT / "jobs" / "local.toml",
                          [*SETS, "checkpoint.run_name=chaos-oracle", f"checkpoint.storage_path={storage}"])
    local = Path(out_dir, f"local-{rank}")
    local.mkdir()
    record = run_in_process(job, local_context(str(local), rank=rank, world_size=WORLD,
                                               run_dir=f"{storage}/chaos-oracle"), argv=["chaos-oracle"])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"record": record, "metrics": (local / "metrics.jsonl").read_text() if rank == 0 else ""}, default=str))


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run the faulted one is compared with: the same job, the same length, on
    the same two ranks, with no Ray (a Ray job of its own cost ~50-60 CPU-seconds of start-ups).
    The loop is the Ray workers' own and each step's loss is all-reduced over the same two ranks in
    the same order, so a step's loss is the Ray job's bit for bit: a Ray reference job's 18 losses
    (measured on this machine) equalled these. One process summing the two ranks' micro batches
    would not (tests/training/test_elastic_spot_ray.py: 2.5e-7 apart, another reduction order).
    The oracle's own record must be a clean run's (accepted, no incident, a checkpoint every 4
    steps and at the last). That a clean local job on Ray is accepted with no incident is the
    session's shared run's proof (tests/e2e/test_submit_local.py)."""
    from spawn_ranks import spawn_ranks

    rank0, _ = spawn_ranks(_oracle_rank, nprocs=WORLD)
    record = rank0["record"]
    losses = {row["step"]: row["loss"] for row in map(json.loads, rank0["metrics"].splitlines())
              if row.get("kind") == "train"}
    assert record["verdict"]["verdict"] == "accepted", record["verdict"]
    assert record["incidents"] == [] and sorted(losses) == list(range(1, MAX_STEPS + 1))
    assert [c["step"] for c in record["checkpoints"]] == [4, 8, 12, 16, MAX_STEPS], record["checkpoints"]
    return {"record": record, "losses": losses}


def lose_node(cluster, lost: set[str]) -> None:
    """The second node lost whole (:meth:`Node.kill`), its Ray node id added to ``lost``; a third
    node joins as its replacement, as an autoscaler's would (bench/bench_recovery.py too)."""
    from ray.util.state import list_nodes

    head, node = cluster["head"], cluster["nodes"][0]
    [head_node] = [n.node_id for n in list_nodes(address=head.dashboard_url, filters=[("is_head_node", "=", "True")],
                                               raise_on_missing_output=False)]
    lost.update(w.node_id for w in _workers(head) if w.node_id != head_node)
    node.kill([w.pid for w in _workers(head) if w.node_id != head_node])
    replacement = Node(head, cluster["env"], "node-c")
    cluster["nodes"].append(replacement)
    _wait(lambda: replacement.up() or any(n.node_id not in lost | {head_node} for n in list_nodes(
        address=head.dashboard_url, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)),
        600, "the replacement node")


def _torn_down(head, group: set[int], what: str) -> None:
    """Until none of the worker processes ``group`` is a live Ray Train worker any more."""
    _wait(lambda: not group & {w.pid for w in _workers(head)}, 600, f"the worker group torn down after {what}")


def test_one_run_meets_a_hang_a_lost_node_and_a_killed_rank_in_turn_and_heals_each_time(reference, cluster, tmp_path):
    """Ray Train sees the lost node's worker first (its poll fails within seconds) and restarts
    the group, killing that worker, before the GCS marks the node dead (5 failed health checks,
    3 s apart): the record must still say the node was lost, and which. The killed rank's fault
    leaves a checkpoint half stored (a rank killed between two uploads is the same fault to Ray
    Train and to the record): the run resumes from the complete one before it."""
    from training.checkpointing.manager import checkpoint_dir_name

    head, store, run = cluster["head"], cluster["store"], "chaos-faults"
    held = lambda step: f"/{run}/{checkpoint_dir_name(step)}/"  # noqa: E731 - the store's hold of one checkpoint
    job = _Job(cluster, tmp_path, run)
    frozen, lost, uploading = {}, set(), []
    try:
        with store.slowed(HOLD, only=held(8)):
            job.submit()
            # 1. hang: step 5 logged, 4 registered, 8 held
            job.wait_registered(RESUMES_FROM["hang"], logged=FIRST_FAULT_AFTER_STEP)
            group = _workers(head)
            frozen.update(pid=group[-1].pid)
            os.kill(frozen["pid"], signal.SIGSTOP)
            # the watchdog declares the hang and kills the frozen rank, Ray Train the other: only
            # then may step 8 be stored (the frozen attempt can never register it)
            _torn_down(head, {w.pid for w in group}, "the hang")
            with store.slowed(HOLD, only=held(12)):
                # 2. node_lost: 8 registered (by the second attempt: the first's was held), step 9 stored
                # by the second attempt (a step lost to the fault), 12 held
                job.wait_registered(RESUMES_FROM["node_lost"], trained=RESUMES_FROM["node_lost"] + 1)
                lose_node(cluster, lost)
                with store.slowed(HOLD, only=held(16)):
                    # 3. worker_lost: 12 registered (by the third attempt), 16 held and uploading
                    job.wait_registered(RESUMES_FROM["worker_lost"])
                    _wait(lambda: any(held(16) in key for key in store.uploading()), 600, f"the upload of {held(16)}")
                    uploading.extend(sorted(key for key in store.uploading() if held(16) in key))
                    group = _workers(head)
                    os.kill(group[-1].pid, signal.SIGKILL)
                    # the store is fast again once Ray Train tore the group down (a faster store while
                    # the other rank still uploads could let that upload finish first)
                    _torn_down(head, {w.pid for w in group}, "the killed rank")
        ran = job.finish()
    finally:
        try:
            os.kill(frozen["pid"], signal.SIGKILL)  # never leave a stopped process behind
        except (KeyError, ProcessLookupError):
            pass

    record = ran["record"]
    assert record["verdict"]["verdict"] == "accepted", (record["verdict"], ran["logs"][-4000:])
    assert ran["losses"] == reference["losses"]
    found = record["incidents"]
    assert [i["kind"] for i in found] == list(RESUMES_FROM), found
    assert record["verdict"]["incidents"] == len(RESUMES_FROM), record["verdict"]
    assert all(kind in record["verdict"]["reason"] for kind in RESUMES_FROM), record["verdict"]
    for entry, (kind, resumed) in zip(found, RESUMES_FROM.items()):
        # the checkpoint registered before the fault, and no newer one (the next was held)
        assert entry["resumed_from_step"] == resumed and entry["step"] > resumed, entry
        assert entry["steps_lost"] == entry["step"] - entry["resumed_from_step"], entry
        assert entry["progress_again_s"] > 0 and entry["device_minutes_lost"] > 0 and entry["gpu_minutes_lost"] == 0, entry
        assert len(entry["ranks"]) == 1, entry
    for entry in found:  # the figures, for the reader (-rP); never asserted beyond the above
        print(f"{entry['kind']}: step {entry['step']}, resumed from {entry['resumed_from_step']}, "
              f"{entry['steps_lost']} steps lost, training again {entry['progress_again_s']} s after it was seen, "
              f"{entry['device_minutes_lost']} worker-minutes lost")
    hang, node_lost, worker_lost = found

    assert hang["step"] >= FIRST_FAULT_AFTER_STEP and "process T" in hang["detail"], hang
    stacks = {uri.rsplit("/", 1)[1]: job.read(uri.split(job.run_uri + "/", 1)[1]).decode() for uri in hang["saved"]}
    frozen_rank = hang["ranks"][0]
    assert "no stack: process state T" in stacks[f"rank-{frozen_rank}.txt"]
    other = stacks[f"rank-{1 - frozen_rank}.txt"]
    assert "training/loop.py" in other  # the live rank's stack: where it waited for the frozen one

    assert len(lost) == 1 and f"Ray node {next(iter(lost))} dead" in node_lost["detail"], node_lost

    # the step-16 checkpoint was still uploading at the fault: the resume is from the complete one before it
    assert uploading, uploading
    assert worker_lost["step"] >= 16 > worker_lost["resumed_from_step"], worker_lost
