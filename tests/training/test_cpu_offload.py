"""``parallel.cpu_offload``: FSDP2's CPUOffloadPolicy through the job's own ``parallelize``,
optimizer and checkpoints, on 2 gloo processes (no Ray, no GPU).

One spawn of 2 processes trains 6 steps four ways with a checkpoint every 2 (async DCP, as the
job saves): without offload, with offload, with offload resumed from the offload run's
checkpoint 4, and WITHOUT offload resumed from that same checkpoint. On CPU offload copies
nothing (the "host" is the device), so every loss must be bit-identical: the option changes
where the state lives, never the numbers, and a checkpoint does not depend on it.

What only a GPU shows (the copies' time, pinned memory) is measured by
bench/bench_offload_transfer.py's byte count and the preflight's host-memory plan.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tiny_qwen import tiny_qwen2_config

pytestmark = pytest.mark.slow  # trains in 2 spawned processes

WORLD, STEPS, EVERY = 2, 6, 2
PHASES = (("plain", False, "", "cpu"), ("offload", True, "", "cpu"), ("offload-resumed", True, "offload", "cpu"),
          ("switched-resumed", False, "offload", "cpu"), ("offload-staged", True, "", "cuda"),
          ("staged-resumed", True, "offload-staged", "cpu"), ("offload-fused", True, "", "cpu", "fused"))
"""(run, cpu_offload, resumed from, checkpoint device[, optim.kernel]): ``offload-fused`` steps the
host-held DTensor shards with the fused CPU AdamW that ``optim.kernel = "auto"`` picks on a GPU
node (training/optim.py)."""
"""(name, cpu_offload, the run whose checkpoint 4 it resumes from, the device the checkpoint
manager is told the job runs on). ``cuda`` takes the GPU job's save path (DCP's ``async_save``
through :func:`pinned_stager`) with the state on host, as ``cpu_offload`` leaves it on a GPU
worker; only the device the manager is given is injected (pinning itself needs CUDA: torch 2.13
``_state_dict_stager.py`` ``StateDictStager.__init__`` drops it with a warning)."""


class Stream:
    """A deterministic per-rank token stream whose position is its state."""

    def __init__(self, rank: int):
        self.rank, self.position = rank, 0

    def next_batch(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1000 * self.rank + self.position)
        self.position += 1
        return torch.randint(0, 500, (2, 16), generator=generator)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def _phase(rank: int, workdir: str, name: str, cpu_offload: bool, resume_run: str, device: str,
           kernel: str = "auto") -> dict:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training import optim
    from training.checkpointing import CheckpointManager, TrainerState, copy_report, restore
    from training.config_sections import OptimConfig, TrainConfig
    from training.parallel import build_mesh, parallelize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()))
    parallelize(model, build_mesh("full_shard", WORLD, False), strategy="full_shard", on_gpu=False,
                cpu_offload=cpu_offload)
    train = TrainConfig(lr=1e-2, warmup_steps=1, max_steps=STEPS, weight_decay=0.1)
    optimizer = optim.build_optimizer(model, train, OptimConfig(kernel=kernel))
    scheduler = optim.build_scheduler(optimizer, train, OptimConfig())
    stream = Stream(rank)
    trainer = TrainerState(data=stream, scheduler=scheduler)
    resume_from = f"{workdir}/storage/{resume_run}/checkpoint_00000004" if resume_run else ""
    restore(model=model, optimizer=optimizer, trainer=trainer, local_root=f"{workdir}/node", resume_from=resume_from)
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=f"{workdir}/node",
                                run_name=name, every_n_steps=EVERY, report=copy_report(f"{workdir}/storage/{name}"),
                                model_config=tiny_qwen2_config(), device=torch.device(device))
    group = model._get_fsdp_state()._fsdp_param_group
    record = {"start": trainer.step, "offloaded": [p.offload_to_cpu for p in group.fsdp_params], "steps": {}}
    for step in range(trainer.step + 1, STEPS + 1):
        ids = stream.next_batch()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = optim.clip_gradients(model, train.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.step = step
        record["steps"][str(step)] = {"loss": loss.item(), "grad_norm": norm.item()}
        manager.step_end(step, {"loss": loss.item()}, max_steps=STEPS)
    manager.finish(trainer.step, {})
    return record


def _worker(rank: int, workdir: str) -> None:
    import torch.distributed as dist

    # a file store: a port picked beforehand could be taken before the ranks bind it
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=WORLD)
    for name, cpu_offload, resume_run, device, *kernel in PHASES:
        record = _phase(rank, workdir, name, cpu_offload, resume_run, device, *kernel)
        Path(f"{workdir}/{name}.rank{rank}.json").write_text(json.dumps(record))
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    workdir = tmp_path_factory.mktemp("offload")
    mp.spawn(_worker, args=(str(workdir),), nprocs=WORLD, join=True)
    return {name: [json.loads((workdir / f"{name}.rank{r}.json").read_text()) for r in range(WORLD)]
            for name, *_ in PHASES}


def test_offload_is_fsdp2s_cpu_offload_on_every_parameter(runs):
    assert all(all(r["offloaded"]) for r in runs["offload"]) and not any(any(r["offloaded"]) for r in runs["plain"])


@pytest.mark.parametrize("run", ["offload", "offload-staged"])
def test_offload_changes_no_number(runs, run):
    for plain, offload in zip(runs["plain"], runs[run], strict=True):
        assert offload["steps"] == plain["steps"]  # losses and gradient norms, bit for bit


@pytest.mark.parametrize("resumed", ["offload-resumed", "switched-resumed", "staged-resumed"])
def test_resume_is_bit_identical_with_the_option_kept_or_changed(runs, resumed):
    """``staged-resumed`` resumes from checkpoints the GPU save path (the pinned stager) wrote
    while the state was already on host."""
    for full, again in zip(runs["offload"], runs[resumed], strict=True):
        assert again["start"] == 4
        assert again["steps"] == {step: full["steps"][step] for step in ("5", "6")}


def test_the_offload_backend_is_one_torch_and_ray_take_as_nccl_with_gloo_for_cpu():
    """Oracles: torch 2.13 ``distributed_c10d.py`` ``BackendConfig`` (the ``device:backend`` list
    init_process_group parses) and Ray 2.58 ``train/torch/config.py`` ``_is_backend_nccl`` (which
    sets NCCL's async error handling); the transport gate (training/transport.py ``uses_nccl``)
    must read it as NCCL too, or an offload run on EFA would be judged a non-NCCL run."""
    from ray.train.torch.config import _is_backend_nccl
    from torch.distributed.distributed_c10d import BackendConfig

    from training.parallel import backend_for
    from training.transport import uses_nccl

    mixed = backend_for(True, cpu_offload=True)
    assert BackendConfig(mixed).get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}
    for backend in (mixed, backend_for(True), backend_for(False), backend_for(False, cpu_offload=True)):
        assert uses_nccl(backend) == _is_backend_nccl(backend), backend


def test_the_fused_cpu_adamw_steps_offloaded_shards_as_foreach_does(runs):
    """The fused CPU kernel over FSDP2's host-held DTensor shards: the same losses and gradient
    norms as the foreach run within float rounding (a kernel that skipped a shard, or stepped
    the full tensor, would move the loss at the first step after it)."""
    for plain, fused in zip(runs["plain"], runs["offload-fused"], strict=True):
        for step, figures in plain["steps"].items():
            assert fused["steps"][step]["loss"] == pytest.approx(figures["loss"], rel=1e-4), step
            assert fused["steps"][step]["grad_norm"] == pytest.approx(figures["grad_norm"], rel=1e-3), step
