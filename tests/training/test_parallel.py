"""FSDP2 on gloo, 2 processes: the same losses as one process with the same global batch.

One ``torch.multiprocessing`` spawn of 2 ranks runs the real loop (training.loop.train) for
full_shard, no_shard and hybrid_shard (2 nodes x 1), checks the hybrid meshes (2x1 and 1x2),
and the test compares each run's per-step losses with a single-process run of the same loop.
Random token ids come from a tiny deterministic source defined here (tests only).
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
from training.parallel import mesh_plan

SEQ_LEN = 32
GLOBAL_BATCH = 4
STEPS = 4


class GlobalBatches:
    """Step s's global batch is fixed by seed (the same every step, so it is learnt); rank r trains on its contiguous slice of it,
    cut into micro batches. A single process with the same global batch sees the same rows."""

    def __init__(self, *, vocab: int, rank: int, world: int, micro: int, seed: int = 7):
        self.vocab, self.rank, self.world, self.micro, self.seed = vocab, rank, world, micro, seed
        self.position = 0  # micro batches handed out
        self.train = self

    def _rows(self, index: int, rows: int, seed_offset: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + seed_offset + index)
        return torch.randint(0, self.vocab - 1, (rows, SEQ_LEN), generator=gen)

    def next_batch(self) -> dict[str, torch.Tensor]:
        per_rank = GLOBAL_BATCH // self.world
        per_step = per_rank // self.micro
        k = self.position % per_step
        self.position += 1
        rows = self._rows(0, GLOBAL_BATCH, 0)[self.rank * per_rank:(self.rank + 1) * per_rank]
        ids = rows[k * self.micro:(k + 1) * self.micro]
        labels = ids.clone()
        labels[:, :3] = -100  # some positions without loss: the global token count must matter
        return {"input_ids": ids, "labels": labels}

    def eval_batches(self, max_batches: int | None = None) -> list[dict[str, torch.Tensor]]:
        rows = self._rows(0, 4, 999)[self.rank * (4 // self.world):(self.rank + 1) * (4 // self.world)]
        return [{"input_ids": rows, "labels": rows.clone()}]

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def _job(strategy: str, world: int, micro: int, workers_per_node: int = 1):
    return job_config_from_dict({
        "name": "parallel-test",
        "model": {"config": tiny_qwen2_config()},
        "train": {"seq_len": SEQ_LEN, "micro_batch_size": micro, "global_batch_size": GLOBAL_BATCH,
                  "max_steps": STEPS, "lr": 1e-2, "warmup_steps": 1, "report_every_n_steps": 100},
        "parallel": {"strategy": strategy, "num_workers": world, "workers_per_node": workers_per_node},
        "eval": {"max_batches": 1},
    }, "test")


def _run(job, rank: int, world: int, local_dir: str):
    from training.loop import local_context, train

    ctx = local_context(local_dir, rank=rank, world_size=world)
    data = GlobalBatches(vocab=tiny_qwen2_config()["vocab_size"], rank=rank, world=world,
                         micro=job.train.micro_batch_size)
    return train(job, ctx, data=data)


def _two_rank_worker(rank: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method=f"file://{os.path.join(out_dir, 'store')}")
    from training.parallel import build_mesh

    results = {"meshes": {}}
    # The hybrid meshes: 2 nodes x 1 worker and 1 node x 2 workers.
    for per_node in (1, 2):
        mesh = build_mesh("hybrid_shard", per_node, on_gpu=False)
        results["meshes"][str(per_node)] = {
            "shape": list(mesh.shape), "names": list(mesh.mesh_dim_names),
            "shard_group": sorted(dist.get_process_group_ranks(mesh.get_group("shard"))),
            "replicate_group": sorted(dist.get_process_group_ranks(mesh.get_group("replicate")))}
    # micro 1 x accumulation 2 per rank (global 4): exercises gradient accumulation too.
    for strategy in ("full_shard", "no_shard", "hybrid_shard"):
        summary = _run(_job(strategy, 2, micro=1), rank, 2, out_dir)
        results[strategy] = {"losses": summary["losses"], "eval_before": summary["eval_loss_before"],
                             "eval_after": summary["eval_loss_after"]}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results():
    return spawn_ranks(_two_rank_worker)


@pytest.fixture(scope="module")
def single_process_losses():
    """The reference: one process, the whole global batch in one micro batch."""
    with tempfile.TemporaryDirectory() as out_dir:
        try:
            summary = _run(_job("full_shard", 1, micro=GLOBAL_BATCH), 0, 1, out_dir)
        finally:
            dist.destroy_process_group()
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["full_shard", "no_shard", "hybrid_shard"])
def test_two_ranks_match_one_process(strategy, two_rank_results, single_process_losses):
    # Given the same global batch, when 2 ranks train with `strategy`, then every step's loss
    # (and the held-out loss before and after) equals the single-process run's.
    reference = single_process_losses["losses"]
    for rank_results in two_rank_results:
        losses = rank_results[strategy]["losses"]
        assert len(losses) == STEPS
        assert losses == pytest.approx(reference, abs=1e-4)
        assert rank_results[strategy]["eval_before"] == pytest.approx(single_process_losses["eval_loss_before"], abs=1e-4)
        assert rank_results[strategy]["eval_after"] == pytest.approx(single_process_losses["eval_loss_after"], abs=1e-4)
    assert reference[-1] < reference[0]  # it trains at all (one global batch, repeated)


@pytest.mark.slow
def test_hybrid_meshes_replicate_across_nodes_and_shard_inside(two_rank_results):
    for rank, results in enumerate(two_rank_results):
        two_nodes = results["meshes"]["1"]  # 2 nodes x 1 worker
        assert two_nodes["shape"] == [2, 1] and two_nodes["names"] == ["replicate", "shard"]
        assert two_nodes["shard_group"] == [rank] and two_nodes["replicate_group"] == [0, 1]
        one_node = results["meshes"]["2"]  # 1 node x 2 workers
        assert one_node["shape"] == [1, 2]
        assert one_node["shard_group"] == [0, 1] and one_node["replicate_group"] == [rank]


def test_mesh_plans():
    assert mesh_plan("full_shard", 8, 4).shape == (8,)
    assert mesh_plan("hybrid_shard", 8, 4).shape == (2, 4)
    assert mesh_plan("no_shard", 8, 4).shape == (8, 1)
    with pytest.raises(ValueError, match="not a multiple"):
        mesh_plan("hybrid_shard", 6, 4)
    with pytest.raises(ValueError, match="unknown strategy"):
        mesh_plan("zero3", 2, 1)
