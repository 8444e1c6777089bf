"""Resume with Ray Train and S3 (moto on 127.0.0.1): 2 CPU workers, FSDP2 on gloo, tiny Qwen2.

The reference: 8 uninterrupted steps of the same model and data on 2 plain gloo processes (no
Ray, no checkpoints). Then three ``TorchTrainer.fit`` calls:
1. ``faulty``: 6 steps, checkpoints at 2, 4 and 6; rank 1's worker process is SIGKILLed from
   outside (this test's process) once Ray Train has registered the step-4 checkpoint, while the
   session's store holds the step-6 upload (devtools/strike.py: so the run can neither register a
   newer checkpoint nor end before the kill, however far it got); Ray restarts the workers, they
   restore step 4 via ``get_checkpoint`` and every replayed step equals the reference bit for bit
   (loss and data position).
2. ``faulty`` again, max 8 steps, on a "new cluster": Ray's own run snapshot is deleted first,
   so the only thing left is the run name and storage; ``plan_resume`` finds the newest
   complete checkpoint (6) and steps 7-8 equal the reference.
3. ``sigterm``: SIGTERM to one worker mid-run -> every rank stops at the same step with a
   complete checkpoint of that step in S3, and the run ends cleanly.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (one server per session)

pytestmark = pytest.mark.slow

WORLD = 2
VOCAB = 65536
"""Widened from test_checkpoint_dcp's 128 (the tokens stay below 128) so that a rank's checkpoint
shard is ~12 MB: large enough for the store to hold its upload until the fault has struck
(devtools/strike.py ``HOLD``). Costs a second or so per checkpoint, nothing per step."""


def _train_fn(config: dict) -> None:
    """The worker: the same model/step as test_checkpoint_dcp, wired like the real loop."""
    import ray.train
    import torch.distributed as dist
    from test_checkpoint_dcp import build, tiny_config, train_step

    from training.checkpointing import CheckpointManager, TrainerState, install_worker_handler, restore

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    out = Path(config["out"])
    (out / f"{config['name']}.pid{rank}").write_text(str(os.getpid()))
    install_worker_handler(grace_seconds=60, run_name=config["name"])
    model, optimizer, scheduler, stream = build(rank, VOCAB)
    trainer = TrainerState(data=stream, scheduler=scheduler)
    restored = restore(model=model, optimizer=optimizer, trainer=trainer, local_root=config["local_root"],
                       resume_from=config.get("resume_from", ""))
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=config["local_root"],
                                run_name=config["name"], every_n_steps=config["every"], model_config=tiny_config(VOCAB))
    with open(out / f"{config['name']}.rank{rank}.jsonl", "a") as log:
        log.write(json.dumps({"attempt_restored": restored, "start": trainer.step}) + "\n")
        for step in range(trainer.step + 1, config["max_steps"] + 1):
            loss = train_step(model, optimizer, scheduler, stream)
            trainer.step = step
            log.write(json.dumps({"step": step, "loss": loss, "position": stream.position}) + "\n")
            log.flush()
            time.sleep(config.get("sleep", 0))
            if manager.step_end(step, {"loss": loss}, max_steps=config["max_steps"]):
                break
        manager.finish(trainer.step, {"loss": loss})
    ray.train.report({"step": trainer.step, "stopped_by_signal": manager.stopped_by_signal})
    dist.barrier()


def _fit(name: str, storage: str, out: Path, *, max_steps: int, every: int, env: dict | None = None, **extra):
    import pyarrow.fs as pafs
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    # Explicit keys: the controller (it deletes old checkpoints) gets them whatever ray.init saw.
    fs = pafs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                           endpoint_override=endpoint)
    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    trainer = TorchTrainer(
        _train_fn,
        train_loop_config={"name": name, "out": str(out), "local_root": str(out / "node"), "max_steps": max_steps,
                           "every": every, **extra},
        scaling_config=ScalingConfig(num_workers=WORLD),
        run_config=RunConfig(name=name, storage_path=storage.removeprefix("s3://"), storage_filesystem=fs,
                             failure_config=FailureConfig(max_failures=1),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             # one intra-op thread, as the reference runs, whatever the caller exported
                             worker_runtime_env={"env_vars": {**aws, **(env or {}), "OMP_NUM_THREADS": "1",
                                                              "PYTHONPATH": _pythonpath()}}),
    )
    return trainer.fit()


def _pythonpath() -> str:
    here = Path(__file__).resolve()
    return os.pathsep.join([str(here.parent), str(here.parents[1]), str(here.parents[2]),
                            os.environ.get("PYTHONPATH", "")])


def _steps(out: Path, name: str, rank: int) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (out / f"{name}.rank{rank}.jsonl").read_text().splitlines()]
    return [r for r in rows if "attempt_restored" in r], [r for r in rows if "step" in r]


def _by_attempt(out: Path, name: str, rank: int) -> list[list[dict]]:
    """The steps each attempt logged, in order."""
    attempts: list[list[dict]] = []
    for line in (out / f"{name}.rank{rank}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "attempt_restored" in row:
            attempts.append([])
        else:
            attempts[-1].append(row)
    return attempts


@pytest.fixture(scope="module")
def storage(s3_bucket, ray_cluster, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ray-ckpt")
    return f"{s3_bucket}/resume-{out.name}", out


def _reference_rank(rank: int, out_dir: str, max_steps: int) -> None:
    """One rank of the reference: the same model, data and steps as ``_train_fn``, uninterrupted,
    in a plain gloo process with no checkpoints. One intra-op thread, as ``_fit``'s workers run
    (their OMP_NUM_THREADS=1 is what Ray would set for one CPU, ray 2.58 ``ray/_private/utils.py``
    ``set_omp_num_threads_if_unset``, but only where the caller exported none)."""
    import torch.distributed as dist
    from test_checkpoint_dcp import build, train_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{out_dir}/store")
    model, optimizer, scheduler, stream = build(rank, VOCAB)
    rows = []
    for step in range(1, max_steps + 1):
        loss = train_step(model, optimizer, scheduler, stream)
        rows.append({"step": step, "loss": loss, "position": stream.position})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rows": rows}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference():
    """8 uninterrupted steps per rank: what every step of a resumed run must equal."""
    from spawn_ranks import spawn_ranks

    ranks = spawn_ranks(_reference_rank, 8, nprocs=WORLD)
    return {rank: {r["step"]: r for r in ranks[rank]["rows"]} for rank in range(WORLD)}


def test_failure_then_resume_is_bit_identical_and_a_new_cluster_continues_from_s3(s3_server, storage, reference):  # noqa: F811
    from devtools.strike import Strike, registered
    from raytrain_eks.runs.results import s3_client
    from training.checkpointing import ExistingRunError, plan_resume
    from training.checkpointing.manager import checkpoint_dir_name
    from training.storage.files import filesystem_for

    prefix, out = storage
    s3, saved = s3_client(s3_server.ray_env_vars), checkpoint_dir_name(4)

    def kill_rank1() -> int:
        pid = int((out / "faulty.pid1").read_text())  # the first attempt's rank 1 (the pid its worker wrote)
        os.kill(pid, signal.SIGKILL)
        return pid

    # the step-6 upload is held until rank 1 is killed: step 4 stays the newest registered checkpoint
    with Strike(s3_server.store, held=f"/faulty/{checkpoint_dir_name(6)}/", what=f"{saved} of faulty registered",
                ready=lambda: registered(s3, f"{prefix}/faulty") == saved, fault=kill_rank1):
        result = _fit("faulty", prefix, out, max_steps=6, every=2)
    assert result.error is None
    for rank in range(WORLD):
        attempts, _ = _steps(out, "faulty", rank)
        assert len(attempts) == 2, attempts  # one failure, one restart
        assert attempts[1]["attempt_restored"].endswith(f"/faulty/{saved}") and attempts[1]["start"] == 4, attempts
        first, after = _by_attempt(out, "faulty", rank)
        # the first attempt ran at least to the registered step 4, however far past it the kill found it
        assert len(first) >= 4 and first == [reference[rank][step] for step in range(1, len(first) + 1)]
        assert [r["step"] for r in after] == [5, 6]
        for row in after:
            assert row == reference[rank][row["step"]]  # loss and data position, exactly

    # A new cluster: Ray's bookkeeping gone, only <storage>/<run> with our checkpoints left.
    fs, run_path = filesystem_for(f"{prefix}/faulty")
    fs.delete_file(f"{run_path}/checkpoint_manager_snapshot.json")
    with pytest.raises(ExistingRunError, match="already reached"):
        plan_resume(storage_path=prefix, run_name="faulty", on_existing_run="resume", max_steps=6)
    plan = plan_resume(storage_path=prefix, run_name="faulty", on_existing_run="resume", max_steps=8)
    assert plan.resume_step == 6
    result = _fit("faulty", prefix, out, max_steps=8, every=2, resume_from=plan.resume_from)
    assert result.error is None
    for rank in range(WORLD):
        attempts, rows = _steps(out, "faulty", rank)
        assert attempts[-1] == {"attempt_restored": plan.resume_from, "start": 6}
        assert rows[-2:] == [reference[rank][7], reference[rank][8]]


def test_sigterm_to_one_worker_leaves_a_complete_checkpoint(storage):
    from training.checkpointing import find_latest_complete

    prefix, out = storage

    def kill_rank1_mid_run() -> None:
        log = out / "sigterm.rank1.jsonl"
        deadline = time.time() + 240
        while time.time() < deadline:
            if log.exists() and sum(1 for line in log.read_text().splitlines() if '"step"' in line) >= 2:
                os.kill(int((out / "sigterm.pid1").read_text()), signal.SIGTERM)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_rank1_mid_run, daemon=True)
    killer.start()
    result = _fit("sigterm", prefix, out, max_steps=200, every=0, sleep=0.3)
    killer.join(timeout=1)
    assert result.error is None and result.metrics["stopped_by_signal"] is True  # the final checkpoint's metrics
    stopped = result.metrics["step"]
    assert result.checkpoint.path.endswith(f"sigterm/checkpoint_{stopped:08d}")
    assert 2 <= stopped < 200
    latest = find_latest_complete(f"{prefix}/sigterm")
    assert latest is not None and latest.step == stopped and latest.marker["world_size"] == WORLD
    for rank in range(WORLD):
        assert _steps(out, "sigterm", rank)[1][-1]["step"] == stopped


def test_driver_sigterm_is_forwarded_to_workers(ray_cluster):
    """The driver's SIGTERM handler sets the named flag; a worker watching it sees a stop."""
    import ray

    from training.checkpointing import forward_driver_sigterm

    @ray.remote(num_cpus=0)
    def worker_waits_for_stop(run_name: str) -> bool:
        from training.checkpointing import signals

        signals.reset()
        assert signals.watch_driver_flag(run_name)
        deadline = time.time() + 60
        while time.time() < deadline:
            if signals.stop_requested():
                return True
            time.sleep(0.05)
        return False

    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = forward_driver_sigterm("forward-test", grace_seconds=30)
        ray.get(flag.__ray_ready__.remote())  # the named actor exists before a worker looks it up
        waiting = worker_waits_for_stop.remote("forward-test")
        time.sleep(1.0)
        assert not ray.wait([waiting], timeout=0)[0]  # no stop before the signal
        os.kill(os.getpid(), signal.SIGTERM)
        assert ray.get(waiting, timeout=60) is True
    finally:
        signal.signal(signal.SIGTERM, previous)
