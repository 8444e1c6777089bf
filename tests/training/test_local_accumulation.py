"""Local gradient accumulation (``parallel.accumulation = "local"``) on 4 gloo ranks, no Ray: a
2 x 2 hybrid-shard mesh (replicate 2 x shard 2, as 2 nodes x 2 workers).

1. The real loop (``training.loop.train``) trains 4 steps of 2 micro batches per rank with the
   parameters kept gathered, the shipped plan's combination; a single process trains the same
   global batch in one micro batch. Every step's loss and every exported parameter must equal it.
2. The collectives of one step of 3 micro batches (the loop's ``forward_backward``), counted by
   torch's ``CommDebugMode``: exactly ONE reduce-scatter per FSDP unit per step (the blocks and
   the root), and the replicate all-reduce once per unit too, all of them in the last micro batch.
   The step runs as the loop's ``forward_backward`` runs it (training/parallel.py's helpers).

Oracle (pytorch v2.13.0, torch/distributed/fsdp/_fully_shard/): ``set_requires_gradient_sync``
(``_fully_shard.py``) sets ``reduce_grads`` and ``all_reduce_grads`` of every unit's param group;
with ``reduce_grads`` False ``FSDPParamGroup.post_backward`` (``_fsdp_param_group.py``) returns
before ``foreach_reduce`` after keeping the unsharded gradient (``to_accumulated_grad_if_needed``
casts it to the reduce dtype, ``accumulate_unsharded_grad_if_needed`` adds the next one), and the
first backward with it True reduce-scatters the sum. So A micro batches issue one reduce-scatter
per unit, not A.

The oracle is shown failing: a deliberately broken schedule that keeps gradient sync off in the
last micro batch too (it skips the step's reduce-scatter) fails both checks: no reduce-scatter
counted, and no gradient for AdamW, so the parameters do not move.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config
from training.config import job_config_from_dict

pytestmark = pytest.mark.slow  # 4 spawned ranks

WORLD, PER_NODE = 4, 2
SEQ_LEN, GLOBAL_BATCH, STEPS = 32, 8, 4
LAYERS = 2
COUNTED_MICRO = 3


def _job(world: int, micro: int, storage: str, *, hybrid: bool):
    parallel = ({"strategy": "hybrid_shard", "num_workers": world, "workers_per_node": PER_NODE,
                 "keep_params_gathered": True, "accumulation": "local"} if hybrid
                else {"strategy": "full_shard", "num_workers": 1})
    return job_config_from_dict({
        "name": "local-accumulation",
        "model": {"config": tiny_qwen2_config(num_hidden_layers=LAYERS)},
        "train": {"seq_len": SEQ_LEN, "micro_batch_size": micro, "global_batch_size": GLOBAL_BATCH,
                  "max_steps": STEPS, "lr": 1e-2, "warmup_steps": 1, "report_every_n_steps": 100},
        "parallel": parallel,
        "checkpoint": {"storage_path": storage, "every_n_steps": 0, "keep_last": 1, "export_hf": True},
        "eval": {"max_batches": 1},
    }, "test")


def _train(job, rank: int, world: int, local_dir: str, run_dir: str) -> dict:
    from test_shipped_shape import UnevenBatches  # the same uneven global batches as the shipped shape

    from training.loop import local_context, train

    ctx = local_context(local_dir, rank=rank, world_size=world, run_dir=run_dir)
    summary = train(job, ctx, data=UnevenBatches(rank=rank, world=world, micro=job.train.micro_batch_size))
    return {"losses": summary["losses"]}


def _parameters(run_dir: str) -> dict[str, list]:
    from safetensors.torch import load_file

    return {k: v.flatten().tolist() for k, v in load_file(os.path.join(run_dir, "hf", "model.safetensors")).items()}


def _broken_begin_micro_batch(model, index: int, count: int) -> None:
    """The schedule with its last reduce-scatter skipped: gradient sync stays off throughout."""
    model.set_requires_gradient_sync(False)


def _counted_step(rank: int, *, broken: bool) -> dict:
    """One optimizer step of :data:`COUNTED_MICRO` micro batches as training/loop.py's
    ``forward_backward`` runs them (``begin_micro_batch`` before each, ``end_accumulation``
    after the last), each backward's collectives counted (``CommDebugMode`` around the backward
    only: its module hooks do not follow the forward's own hooks)."""
    from torch.distributed.tensor.debug import CommDebugMode
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.model import loss_sum
    from training.parallel import begin_micro_batch, build_mesh, end_accumulation, parallelize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=LAYERS)))
    parallelize(model, build_mesh("hybrid_shard", PER_NODE, on_gpu=False), strategy="hybrid_shard", on_gpu=False,
                keep_gathered=True, accumulation="local")
    units = sum(1 for m in model.modules() if hasattr(m, "_get_fsdp_state"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.to_local().detach().clone() for p in model.parameters()]
    ids = torch.randint(0, 500, (COUNTED_MICRO, SEQ_LEN), generator=torch.Generator().manual_seed(3 + rank))
    counts: dict[str, int] = {}
    per_micro = []
    for index in range(COUNTED_MICRO):
        (_broken_begin_micro_batch if broken else begin_micro_batch)(model, index, COUNTED_MICRO)
        loss = loss_sum(model, {"input_ids": ids[index:index + 1], "labels": ids[index:index + 1].clone()})
        with CommDebugMode() as comm:
            (loss / (COUNTED_MICRO * SEQ_LEN)).backward()
        micro = {str(op): n for op, n in comm.get_comm_counts().items()}
        per_micro.append(micro)
        for op, n in micro.items():
            counts[op] = counts.get(op, 0) + n
    end_accumulation(model, COUNTED_MICRO)
    if any(p.grad is not None for p in model.parameters()):
        optimizer.step()
    moved = sum(int(not torch.equal(a, p.to_local())) for a, p in zip(before, model.parameters()))
    return {"units": units, "counts": counts, "per_micro": per_micro, "params_moved": moved, "params": len(before)}


def _worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{os.path.join(out_dir, 'store')}")
    storage = os.path.join(out_dir, "storage")
    job = _job(WORLD, 1, storage, hybrid=True)
    run = os.path.join(storage, "local")
    results = {"train": _train(job, rank, WORLD, os.path.join(out_dir, f"node{rank}"), run),
               "counted": _counted_step(rank, broken=False), "broken": _counted_step(rank, broken=True)}
    dist.barrier()
    if rank == 0:
        results["parameters"] = _parameters(run)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(_worker, nprocs=WORLD)


@pytest.fixture(scope="module")
def reference():
    """One process, the whole global batch in one micro batch."""
    with tempfile.TemporaryDirectory() as out_dir:
        run = os.path.join(out_dir, "storage", "single")
        try:
            summary = _train(_job(1, GLOBAL_BATCH, os.path.join(out_dir, "storage"), hybrid=False), 0, 1, out_dir, run)
        finally:
            dist.destroy_process_group()
        return {**summary, "parameters": _parameters(run)}


def once_per_unit_problems(step: dict) -> list[str]:
    """What breaks "one reduce-scatter and one replicate all-reduce per FSDP unit per step, and
    every parameter updated" ([] when nothing does)."""
    units, counts = step["units"], step["counts"]
    scatters = sum(n for op, n in counts.items() if "reduce_scatter" in op)
    reduces = sum(n for op, n in counts.items() if "allreduce" in op.replace("_", ""))
    problems = []
    if scatters != units:
        problems.append(f"{scatters} reduce-scatters for {units} FSDP units in {COUNTED_MICRO} micro batches")
    if reduces != units:  # hybrid shard's replicate all-reduce of each unit's shard
        problems.append(f"{reduces} all-reduces for {units} FSDP units")
    if step["params_moved"] != step["params"]:
        problems.append(f"AdamW moved {step['params_moved']} of {step['params']} parameter shards")
    return problems


def test_losses_and_parameters_equal_one_process(ranks, reference):
    # Given 4 ranks on a 2 x 2 mesh, parameters kept gathered, 2 uneven micro batches each,
    # summed locally and reduce-scattered once per step,
    # then every step's loss and every trained parameter equal the single-process run's.
    for results in ranks:
        assert len(results["train"]["losses"]) == STEPS
        assert results["train"]["losses"] == pytest.approx(reference["losses"], abs=1e-5)
    trained = ranks[0]["parameters"]
    assert trained.keys() == reference["parameters"].keys()
    # fp32 sums in another order differ in the last bits (bounded as tests/training/test_shipped_shape.py
    # bounds the sharded schedule: a hundredth of lr)
    diffs = torch.cat([(torch.tensor(v) - torch.tensor(reference["parameters"][k])).abs() for k, v in trained.items()])
    print(f"\nparameters vs one process: max |diff| {diffs.max():.2e} over {diffs.numel()} values")
    assert float(diffs.max()) <= 1e-4


def test_one_reduce_scatter_per_unit_per_step(ranks):
    for results in ranks:
        step = results["counted"]
        print(f"\nrank counts over {COUNTED_MICRO} micro batches, {step['units']} units: {step['counts']}")
        assert step["units"] == LAYERS + 1
        assert once_per_unit_problems(step) == []
        assert all(not any("reduce" in op for op in micro) for micro in step["per_micro"][:-1]), step["per_micro"]


def test_the_check_fails_on_a_schedule_that_skips_the_last_reduce_scatter(ranks):
    for results in ranks:
        problems = once_per_unit_problems(results["broken"])
        print(f"\nbroken schedule: {problems}")
        assert any("reduce-scatters" in p for p in problems) and any("AdamW moved" in p for p in problems), problems
