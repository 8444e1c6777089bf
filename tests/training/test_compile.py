"""``parallel.compile = true``: torch.compile per decoder block (inductor), composed with FSDP2,
activation checkpointing and the packed-document attention, gives the eager loss and gradients
(a tiny Qwen2 on one gloo rank, CPU)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config

pytestmark = pytest.mark.slow  # inductor compiles every block once


def _run(compile: bool) -> tuple[list[float], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.model import loss_sum, use_packed_attention
    from training.parallel import build_mesh, parallelize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()))
    use_packed_attention(model)
    parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False,
                activation_checkpointing=True, compile=compile)
    ids = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids.clone(),
             "position_ids": torch.cat([torch.arange(20), torch.arange(12)]).expand(2, -1)}
    losses = []
    for _ in range(2):
        loss = loss_sum(model, batch)
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.full_tensor().clone() for p in model.parameters()]


def _worker(rank: int, out_dir: str) -> None:
    import json

    dist.init_process_group("gloo", rank=rank, world_size=1, init_method=f"file://{os.path.join(out_dir, 'store')}")
    eager, compiled = _run(False), _run(True)
    worst = max((a - b).abs().max().item() for a, b in zip(eager[1], compiled[1]))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"eager": eager[0], "compiled": compiled[0], "max_grad_diff": worst}, handle)
    dist.destroy_process_group()


def test_compiled_blocks_give_the_eager_loss_and_gradients():
    (result,) = spawn_ranks(_worker, nprocs=1)
    assert result["compiled"] == pytest.approx(result["eager"], abs=1e-4)
    assert result["max_grad_diff"] < 1e-4
