"""The loop under Ray Train through a fault, its resume and its record: 2 CPU workers, FSDP2
full_shard on gloo, tiny Qwen2, the session's moto S3 and Ray cluster.

ONE faulted ``TorchTrainer.fit`` of the real loop (``training.launch.build_trainer``, the driver's
``start_record``/``finish_record`` around it) backs the loop's figures, its record and the resume
(a Ray fit costs ~50-60 CPU-s of start-ups; the references below are not Ray runs). 6 steps of
micro batch 1 x accumulation 2, checkpoints at 2, 4 and 6; one worker process is SIGKILLed from
outside (this test's process) once Ray Train has registered the step-4 checkpoint, while the
store holds the step-6 upload (devtools/strike.py: so the run can neither register a newer
checkpoint nor end before the kill, however far the loop got); Ray restarts the workers, they
restore step 4 (``get_checkpoint``) and finish. Held against:

- ``reference``: the same loop on 2 plain gloo processes (tests/spawn_ranks.py), same job, 8
  uninterrupted steps, no checkpoints, no Ray: every step the Ray run logged (the first attempt's,
  the replayed ones, the new cluster's) equals its loss bit for bit, and each rank's trainer state
  in every checkpoint the run stored (4, 6, then 8: step, tokens seen, data position) equals the
  reference's after that step.
- ``single_process``: the same loop in one process at micro batch 4 (no accumulation) on the
  same global batches: every step's loss and the eval before/after within 1e-4 (the accumulation
  sums in another order, so not bit for bit).

The schedule is warm-up then constant (``optim.schedule``): its factor depends on the step only,
so one 8-step reference covers the 6-step run and its continuation to 8, and the warm-up spans the
restored step 4, so a restore that lost the scheduler's position changes the replayed steps' lr.

Then, on what that fit left in the store, a second fit of the loop on a "new cluster": Ray's own
run snapshot is deleted, so only the run name and storage are left; ``plan_resume`` refuses max 6
steps (already reached) and finds the newest complete checkpoint (6) for more; the fit continues
from it, its steps 7-8 and each rank's state at 8 equal the reference's, and once step 8 is in the
store one of its workers gets SIGTERM from outside: every rank stops at the same step with a
complete checkpoint of that step in S3, and the run ends cleanly (no error, the stop in its last
report and summary). Last, the driver's SIGTERM reaches a worker through the named flag actor.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (one server per session)
from tiny_qwen import tiny_qwen2_config

pytestmark = pytest.mark.slow

WORLD = 2
STEPS = 6
"""The faulted fit's steps."""
MORE = 8
"""The reference's steps: the new cluster's fit must log steps 7 and 8 equal to them."""
LONG = 100
"""The new cluster's max steps: far more than it reaches before the SIGTERM stops it (metrics.jsonl
reaches the store every 2 steps, and the signal follows within a poll), and a bound on what it
stores if the signal never comes (a checkpoint every 2 steps, all kept, ~26 MB each)."""
SAVED = 4
"""The checkpoint the faulted fit resumes from: registered by Ray Train before the kill."""
VOCAB = 32768
"""Widened from the tiny model's 512 so that a rank's checkpoint shard is ~13 MB: large enough
for the store to hold its upload until the fault has struck (devtools/strike.py ``HOLD``)."""
WARMUP = 5
"""Warm-up steps (the most ``train.max_steps`` = 6 allows): the lr factor of steps 1-5 is 1/5..5/5."""


def _job(storage: str, *, workers: int, micro: int, max_steps: int = STEPS, keep_last: int = 2):
    from training.config import job_config_from_dict

    return job_config_from_dict({
        "name": "loop-test",
        "model": {"config": tiny_qwen2_config(VOCAB)},
        "data": {"kind": "synthetic"},
        "train": {"seq_len": 32, "micro_batch_size": micro, "global_batch_size": 4, "max_steps": max_steps,
                  "lr": 1e-3, "warmup_steps": WARMUP, "report_every_n_steps": 2},
        "optim": {"schedule": "constant"},
        "parallel": {"strategy": "full_shard", "num_workers": workers, "workers_per_node": workers},
        "checkpoint": {"storage_path": storage, "every_n_steps": 2, "max_failures": 1, "export_hf": False,
                       "keep_last": keep_last},
        "eval": {"max_batches": 8},  # all 16 held-out synthetic blocks at either world size
    }, "test")


class _Run:
    """The run's folder in the store."""

    def __init__(self, s3, uri: str):
        from raytrain_eks.runs.results import split_uri

        self.s3, (self.bucket, self.key) = s3, split_uri(uri)

    def text(self, name: str) -> str:
        return self.s3.get_object(Bucket=self.bucket, Key=f"{self.key}/{name}")["Body"].read().decode()

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.text("metrics.jsonl").splitlines() if line.strip()]

    def folders(self) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.key}/", Delimiter="/")
        return [p["Prefix"][len(self.key) + 1:].rstrip("/") for p in listed.get("CommonPrefixes", [])]

    def trainer_states(self, step: int) -> list[dict]:
        """Each rank's trainer state as the checkpoint of ``step`` stores it (``trainer.rank<r>``),
        read back with DCP as a restore reads it, from a copy of the folder."""
        import torch.distributed.checkpoint as dcp

        from training.checkpointing.manager import checkpoint_dir_name
        from training.checkpointing.state import _from_bytes, trainer_key

        prefix = f"{self.key}/{checkpoint_dir_name(step)}/"
        with tempfile.TemporaryDirectory() as local:
            listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix)["Contents"]
            for name in (item["Key"][len(prefix):] for item in listed):
                if name and "/" not in name:  # the folder's own marker key (empty name) is no file
                    self.s3.download_file(self.bucket, prefix + name, os.path.join(local, name))
            states = {trainer_key(rank): {"payload": b""} for rank in range(WORLD)}
            dcp.load(states, checkpoint_id=local, no_dist=True)
        return [_from_bytes(states[trainer_key(rank)]["payload"]) for rank in range(WORLD)]


def _workers() -> list[dict]:
    """The live Ray Train workers of the session's cluster, from its GCS actor table (the
    session's cluster has no dashboard for the state API)."""
    import ray

    return [a for a in ray._private.state.actors(actor_state_name="ALIVE").values()
            if a["ActorClassName"] == "RayTrainWorker"]


@pytest.fixture(scope="module")
def faulted(s3_server, s3_bucket, ray_cluster, tmp_path_factory):  # noqa: F811
    """The faulted fit, and what it left in the store read right after it (the new cluster's fit
    later adds to the same run)."""
    from devtools.strike import Strike, registered
    from raytrain_eks.runs.results import s3_client
    from training.checkpointing.manager import checkpoint_dir_name
    from training.launch import build_trainer, finish_record, run_dir, start_record

    job = _job(f"{s3_bucket}/{tmp_path_factory.mktemp('loop').name}", workers=WORLD, micro=1)
    s3, saved = s3_client(s3_server.ray_env_vars), checkpoint_dir_name(SAVED)
    record = start_record(job, ["python", "-m", "training", "--config", "test"])  # as the driver does
    trainer = build_trainer(job)

    def kill_a_worker() -> int:
        pid = _workers()[-1]["Pid"]
        os.kill(pid, signal.SIGKILL)
        return pid

    with Strike(s3_server.store, held=f"/{job.run_name}/{checkpoint_dir_name(STEPS)}/", fault=kill_a_worker,
                ready=lambda: registered(s3, run_dir(job)) == saved, what=f"{saved} registered") as strike:
        result = trainer.fit()
    finish_record(record, returned=result.return_value, error=result.error)
    run = _Run(s3, run_dir(job))
    return {"job": job, "result": result, "run": run, "killed": strike.struck, "rows": run.rows(),
            "record": json.loads(run.text("run.json")), "folders": run.folders(),
            "states": {step: run.trainer_states(step) for step in (SAVED, STEPS)}}


def _reference_rank(rank: int, out_dir: str) -> None:
    """One rank of the reference: the loop's own ``train`` on a plain gloo group, :data:`MORE`
    steps, no checkpoints; the data position recorded after each step (the stream's state, read
    between the loop's calls for the next micro batch)."""
    import torch.distributed as dist

    from training.loop import local_context, open_data, train

    job = _job("", workers=WORLD, micro=1, max_steps=MORE)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{out_dir}/store")
    local = os.path.join(out_dir, f"node{rank}")  # each rank's own scratch, as each Ray worker has
    os.makedirs(local)
    ctx = local_context(local, rank=rank, world_size=WORLD)
    data, tokenizer = open_data(job, ctx)
    stream, taken, positions = data.train, [0], {}
    next_batch = stream.next_batch

    def recorded():
        if taken[0] % job.grad_accum_steps == 0:  # a step's first micro batch: the last step has ended
            positions[taken[0] // job.grad_accum_steps] = stream.state_dict()
        taken[0] += 1
        return next_batch()

    stream.next_batch = recorded
    summary = train(job, ctx, data=data, tokenizer=tokenizer)
    positions[MORE] = stream.state_dict()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "losses": summary["losses"], "eval_loss_before": summary["eval_loss_before"], "positions": positions,
        "tokens_per_step": job.tokens_per_step}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference():
    """:data:`MORE` uninterrupted steps on 2 plain processes: what every step of the Ray run, and
    each rank's stored trainer state, must equal."""
    from spawn_ranks import spawn_ranks

    ranks = spawn_ranks(_reference_rank, nprocs=WORLD)
    assert ranks[0]["losses"] == ranks[1]["losses"] and len(ranks[0]["losses"]) == MORE  # one global loss a step
    return ranks


@pytest.fixture(scope="module")
def single_process():
    import torch.distributed as dist

    from training.loop import local_context, train

    with tempfile.TemporaryDirectory() as tmp:
        job = _job("", workers=1, micro=4)
        try:
            return train(job, local_context(tmp))
        finally:
            dist.destroy_process_group()


def _assert_states_match(states: list[dict], reference: list[dict], step: int) -> None:
    """Each rank's stored trainer state equals the reference rank's after ``step``."""
    for rank, state in enumerate(states):
        expected = reference[rank]
        assert state["step"] == step and state["tokens_seen"] == step * expected["tokens_per_step"], (rank, state)
        assert state["data"] == expected["positions"][str(step)], (rank, state["data"])


def test_two_ray_workers_match_one_process_across_a_fault(faulted, single_process):
    # Given 2 Ray workers (micro batch 1, accumulation 2) of which one dies after step 4, and
    # one process (micro batch 4) on the same global batches, when the Ray run restarts from its
    # last registered checkpoint and finishes, then every step's loss equals the single process's.
    result, rows = faulted["result"], faulted["rows"]
    assert result.error is None and faulted["killed"] > 0
    summary = rows[-1]
    # the step-4 checkpoint was the newest registered when the worker was killed (the step-6
    # upload was held): the restart resumes from exactly it
    assert summary["resumed_from"] and summary["resumed_from"].endswith(f"checkpoint_{SAVED:08d}"), summary
    train = [r for r in rows if r["kind"] == "train"]
    last_per_step = {r["step"]: r["loss"] for r in train}
    assert [last_per_step[s] for s in range(1, STEPS + 1)] == pytest.approx(single_process["losses"], abs=1e-4)
    assert summary["eval_loss_before"] == pytest.approx(single_process["eval_loss_before"], abs=1e-4)
    assert summary["eval_loss_after"] == pytest.approx(single_process["eval_loss_after"], abs=1e-4)


def test_failure_then_resume_is_bit_identical(faulted, reference):
    # Attempt 1 logged steps 1..n (n >= 4: how far past the checkpoint its metrics reached the
    # store before the kill depends on the machine); attempt 2 restored step 4 and logged 5..6.
    train = [r for r in faulted["rows"] if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    before, after = train[:SAVED - STEPS], train[SAVED - STEPS:]
    n = len(before)
    assert steps == list(range(1, n + 1)) + list(range(SAVED + 1, STEPS + 1)) and n >= SAVED, steps
    losses = reference[0]["losses"]
    # every step, before the kill and replayed after it, exactly as the uninterrupted run
    assert [r["loss"] for r in before] == losses[:n]
    assert [r["loss"] for r in after] == losses[SAVED:STEPS]
    assert faulted["rows"][-1]["eval_loss_before"] == reference[0]["eval_loss_before"]
    # what each rank stored at step 4 (before the kill) and at step 6 (after the replay)
    for step in (SAVED, STEPS):
        _assert_states_match(faulted["states"][step], reference, step)


def test_metrics_jsonl_holds_every_figure(faulted):
    job, records = faulted["job"], faulted["rows"]
    step = next(r for r in records if r["kind"] == "train")
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_device", "tflops_per_device",
                "step_time_s", "compute_s", "peak_memory_gib", "tokens_seen"):
        assert isinstance(step[key], float | int), key
    assert step["mfu"] is None  # CPU: no peak to compare with
    assert step["tokens_per_s_per_device"] == pytest.approx(step["tokens_per_s"] / 2)
    assert step["tokens_seen"] == job.tokens_per_step
    evals = [r for r in records if r["kind"] == "eval"]
    # The resumed attempt keeps the step-0 figure from its checkpoint; the first attempt may have
    # measured the end (step 6) already when the kill found it waiting on its held last upload.
    assert [e["step"] for e in evals] in ([0, STEPS], [0, STEPS, STEPS])
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["eval_loss_before"] == evals[0]["eval_loss"]
    assert summary["eval_loss_after"] == evals[-1]["eval_loss"]


def test_run_record_and_checkpoints(faulted):
    record = faulted["record"]  # the driver merged what rank 0 returned
    assert record["status"] == "succeeded" and record["verdict"]["verdict"] == "accepted"
    assert record["kind"] == "infrastructure_check"  # synthetic tokens
    assert record["transport"]["transport"] == "single-node"
    assert {"0", "1"} <= set(record["hosts"])
    assert record["eval"]["before"]["step"] == 0 and record["eval"]["after"]["step"] == STEPS
    assert record["throughput"]["tokens_per_s"] > 0
    assert record["command"] == ["python", "-m", "training", "--config", "test"]
    assert sorted(p for p in faulted["folders"] if p.startswith("checkpoint_0")) == ["checkpoint_00000004",
                                                                                     "checkpoint_00000006"]


def test_a_new_cluster_continues_from_s3_until_a_sigterm_stops_every_rank_at_one_step(s3_server, faulted,  # noqa: F811
                                                                                         reference):
    # Given what the faulted fit left in the store and Ray's own run snapshot deleted (a new
    # cluster), when the loop is started again on the same run name, then it continues from the
    # newest complete checkpoint (6) bit for bit; and when one of its workers gets SIGTERM mid-run,
    # then every rank stops at the same step with a complete checkpoint of that step and the run
    # ends cleanly.
    from devtools.strike import logged_step
    from raytrain_eks.runs.results import s3_client
    from training.checkpointing import ExistingRunError, find_latest_complete, plan_resume
    from training.launch import build_trainer, run_dir
    from training.storage.files import filesystem_for

    job, run = faulted["job"], faulted["run"]
    assert faulted["result"].error is None
    # A new cluster: Ray's bookkeeping gone, only <storage>/<run> with the loop's checkpoints left.
    fs, run_path = filesystem_for(run_dir(job))
    fs.delete_file(f"{run_path}/checkpoint_manager_snapshot.json")
    where = {"storage_path": job.checkpoint.storage_path, "run_name": job.run_name, "on_existing_run": "resume"}
    with pytest.raises(ExistingRunError, match="already reached"):
        plan_resume(**where, max_steps=STEPS)
    plan = plan_resume(**where, max_steps=LONG)
    assert plan.resume_step == STEPS
    # every checkpoint it writes kept: step 8's is read after the stop
    more = _job(job.checkpoint.storage_path, workers=WORLD, micro=1, max_steps=LONG, keep_last=LONG)
    s3, terminated, failed = s3_client(s3_server.ray_env_vars), [], []

    def terminate_a_worker_past_the_reference() -> None:
        deadline = time.monotonic() + 600
        try:
            while time.monotonic() < deadline and not terminated:
                if logged_step(s3, run_dir(more)) >= MORE:  # the steps the reference holds are in the store
                    pid = _workers()[-1]["Pid"]
                    os.kill(pid, signal.SIGTERM)
                    terminated.append(pid)
                time.sleep(0.2)
        except Exception as err:  # noqa: BLE001 - shown by the assertion below; the fit ends at LONG
            failed.append(repr(err))

    killer = threading.Thread(target=terminate_a_worker_past_the_reference, daemon=True)
    killer.start()
    result = build_trainer(more, resume_from=plan.resume_from).fit()
    killer.join(timeout=1)
    assert result.error is None and terminated, failed
    rows = run.rows()
    summary = rows[-1]
    assert summary["kind"] == "summary" and summary["resumed_from"] == plan.resume_from, summary
    train = {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}  # the last logged of each step
    assert [train[STEPS + 1], train[MORE]] == reference[0]["losses"][STEPS:MORE]  # bit for bit
    # the stop: at a step boundary after the signal, saved, and named by the run's last report
    stopped = summary["steps"]
    assert summary["stopped_by_signal"] is True and MORE <= stopped < LONG, summary
    assert result.metrics["stopped_by_signal"] is True  # the final checkpoint's metrics
    assert result.checkpoint.path.endswith(f"{job.run_name}/checkpoint_{stopped:08d}")
    latest = find_latest_complete(run_dir(job))
    assert latest is not None and latest.step == stopped and latest.marker["world_size"] == WORLD
    # every rank stopped at that same step; each rank's state at step 8 is the reference's
    assert [state["step"] for state in run.trainer_states(stopped)] == [stopped] * WORLD
    _assert_states_match(run.trainer_states(MORE), reference, MORE)


def test_driver_sigterm_is_forwarded_to_workers(ray_cluster):
    """The driver's SIGTERM handler sets the named flag; a worker watching it sees a stop."""
    import ray

    from training.checkpointing import forward_driver_sigterm

    @ray.remote(num_cpus=0)
    class Worker:
        """A process of its own watching the flag, as a Ray Train worker does."""

        def watch(self, run_name: str) -> bool:
            from training.checkpointing import signals

            signals.reset()
            return signals.watch_driver_flag(run_name)

        def stop_requested(self, wait_s: float) -> bool:
            from training.checkpointing import signals

            deadline = time.time() + wait_s  # only ends a hang: the stop ends the wait
            while not signals.stop_requested() and time.time() < deadline:
                time.sleep(0.05)
            return signals.stop_requested()

    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = forward_driver_sigterm("forward-test", grace_seconds=30)
        ray.get(flag.__ray_ready__.remote())  # the named actor exists before a worker looks it up
        worker = Worker.remote()
        assert ray.get(worker.watch.remote("forward-test"), timeout=600)  # watching, however slow its start
        assert ray.get(worker.stop_requested.remote(0), timeout=600) is False  # no stop before the signal
        os.kill(os.getpid(), signal.SIGTERM)
        assert ray.get(worker.stop_requested.remote(600), timeout=600) is True
    finally:
        signal.signal(signal.SIGTERM, previous)
