"""Gradient accumulation under FSDP2: one all-gather per FSDP unit per optimizer step.

Two gloo ranks run the loop's own ``forward_backward`` (training/step.py) on a tiny Qwen2 and
count the collectives FSDP2 issues (it calls ``torch.distributed.all_gather_single`` and
``reduce_scatter_single``; counted by wrapping them). The global batch is the same at
accumulation 1 (one micro batch of 4 rows) and 4 (four of 1 row), so only the schedule differs.
"""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config

SEQ_LEN, ROWS, STEPS = 16, 4, 2


class _Counter:
    def __init__(self, names: tuple[str, ...]):
        self.counts = dict.fromkeys(names, 0)
        self.originals = {name: getattr(dist, name) for name in names}

    def __enter__(self):
        for name, original in self.originals.items():
            def counted(*args, _name=name, _original=original, **kwargs):
                self.counts[_name] += 1
                return _original(*args, **kwargs)
            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(dist, name, original)


def _batches(rank: int, accum: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 500, (ROWS, SEQ_LEN), generator=torch.Generator().manual_seed(11 + rank))
    rows = ROWS // accum
    return [{"input_ids": ids[i * rows:(i + 1) * rows], "labels": ids[i * rows:(i + 1) * rows].clone()}
            for i in range(accum)]


def _measure(rank: int, accum: int) -> dict:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.parallel import build_mesh, parallelize
    from training.step import forward_backward

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=3)))
    parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with _Counter(("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single")) as counter:
        for _ in range(STEPS):
            sums = forward_backward(model, _batches(rank, accum), device=torch.device("cpu"), world_size=2)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(sums[0] / sums[1]))
    gathers = counter.counts["all_gather_single"] + counter.counts["all_gather_into_tensor"]
    return {"all_gathers_per_step": gathers / STEPS,
            "reduce_scatters_per_step": counter.counts["reduce_scatter_single"] / STEPS, "losses": losses}


def _worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{os.path.join(out_dir, 'store')}")
    results = {str(accum): _measure(rank, accum) for accum in (1, 4)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def counts():
    return spawn_ranks(_worker)


@pytest.mark.slow
def test_accumulation_gathers_each_unit_once_per_optimizer_step(counts):
    for rank in counts:
        one, four = rank["1"], rank["4"]
        assert one["all_gathers_per_step"] > 0
        # at most 1.25 x the gathers of a step without accumulation (not one set per micro batch)
        assert four["all_gathers_per_step"] <= 1.25 * one["all_gathers_per_step"], (one, four)
        # and the gradients are still reduce-scattered exactly once per step
        assert four["reduce_scatters_per_step"] == one["reduce_scatters_per_step"]
        # the same global batch gives the same losses, whatever the schedule
        assert four["losses"] == pytest.approx(one["losses"], abs=1e-5)
