"""``parallel.checkpoint_every = k``: activation checkpointing of every k-th decoder block
(training/parallel.py ``checkpoint_activations``) gives the loss and gradients of the same model
without checkpointing, and recomputes exactly blocks k, 2k, ... in backward (a tiny Qwen2 of 4
blocks, FSDP2 full shard over 2 gloo ranks, CPU, packed documents, two accumulated micro
batches)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config

LAYERS = 4
PLANS = ((False, 1), (True, 1), (True, 2), (True, 3))
"""(activation_checkpointing, checkpoint_every): the reference first."""


def _run(checkpointing: bool, every: int) -> dict:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.model import decoder_layers, loss_sum, use_packed_attention
    from training.parallel import begin_micro_batch, build_mesh, end_accumulation, parallelize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=LAYERS)))
    use_packed_attention(model)
    calls = [0] * LAYERS
    for index, layer in enumerate(decoder_layers(model)):
        layer.register_forward_pre_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False,
                activation_checkpointing=checkpointing, checkpoint_every=every)
    model.train()
    losses = []
    for index in range(2):
        ids = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(10 * dist.get_rank() + index))
        batch = {"input_ids": ids, "labels": ids.clone(),
                 "position_ids": torch.cat([torch.arange(20), torch.arange(12)]).expand(2, -1)}
        begin_micro_batch(model, index, 2)
        loss = loss_sum(model, batch)
        loss.backward()
        losses.append(loss.item())
    end_accumulation(model, 2)
    return {"losses": losses, "grads": [p.grad.full_tensor().clone() for p in model.parameters()],
            "forward_calls": calls}


def _worker(rank: int, out_dir: str) -> None:
    import json

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{os.path.join(out_dir, 'store')}")
    runs = [_run(*plan) for plan in PLANS]
    reference = runs[0]
    out = []
    for (checkpointing, every), run in zip(PLANS, runs):
        worst = max((a - b).abs().max().item() for a, b in zip(reference["grads"], run["grads"]))
        out.append({"checkpointing": checkpointing, "every": every, "losses": run["losses"], "max_grad_diff": worst,
                    "forward_calls": run["forward_calls"]})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(out, handle)
    dist.destroy_process_group()


def test_every_kth_block_checkpointed_gives_the_losses_and_gradients_of_none():
    for rank_result in spawn_ranks(_worker, nprocs=2):
        reference, *checkpointed = rank_result
        assert reference["forward_calls"] == [2] * LAYERS  # two micro batches, no recompute
        for plan in checkpointed:
            assert plan["losses"] == pytest.approx(reference["losses"], abs=1e-5), plan
            assert plan["max_grad_diff"] < 1e-5, plan
            # blocks k, 2k, ... (counted from 1) run their forward again in each backward
            recomputed = [i + 1 for i, n in enumerate(plan["forward_calls"]) if n == 4]
            assert recomputed == list(range(plan["every"], LAYERS + 1, plan["every"])), plan
            assert all(n in (2, 4) for n in plan["forward_calls"]), plan


def test_checkpoint_every_is_a_positive_k_that_counts_only_with_checkpointing():
    from spec_schema import FieldError
    from training.config_sections import ParallelConfig

    assert ParallelConfig(activation_checkpointing=True, checkpoint_every=2).checkpointed_every == 2
    # checkpointing off (e.g. --set over a file that writes k): one plan, whatever k says
    assert ParallelConfig(checkpoint_every=4).checkpointed_every == 1
    with pytest.raises(FieldError, match="checkpoint_every: 0"):
        ParallelConfig(activation_checkpointing=True, checkpoint_every=0)


@pytest.mark.parametrize("every", [0, 1, 2, 3, 4, 7])
def test_the_every_k_activation_term_bounds_the_measured_peak(every):
    """The preflight's activation term (raytrain_eks/planning/memory_estimate.py: the inputs of
    the ``L // k`` checkpointed blocks, the others' full activations, one recomputed block; plus
    the logits term) against torch 2.13's own MemTracker (``torch/distributed/_tools/mem_tracker.py``)
    over one forward + backward of a 6-block tiny Qwen2 checkpointed by the job's own
    :func:`training.parallel.checkpoint_activations` (fp32 on CPU: compute bytes 4). Every k,
    the remainder blocks (6 % 4, 6 % 7) and k > L included: the measured activations and
    temporaries at the peak never exceed the term (0: checkpointing off)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM, Qwen2Config

    from raytrain_eks.planning.memory_estimate import estimate_memory
    from training.flops import ModelShapes
    from training.model import loss_sum, use_packed_attention
    from training.parallel import checkpoint_activations

    layers, tokens = 6, 512
    config = tiny_qwen2_config(num_hidden_layers=layers, hidden_size=128, intermediate_size=384,
                               max_position_embeddings=tokens)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**config))
    use_packed_attention(model)
    if every:
        checkpoint_activations(model, every=every)
    model.train()
    ids = torch.randint(0, 500, (1, tokens), generator=torch.Generator().manual_seed(1))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss_sum(model, {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(tokens)[None]}).backward()
    [(_, peak)] = tracker.get_tracker_snapshot("peak").items()
    measured = sum(v for k, v in peak.items() if getattr(k, "value", k) in ("Activation", "Temp"))
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **Qwen2Config(**config).to_dict()})
    planned = estimate_memory(shapes, strategy="no_shard", world_size=1, workers_per_node=1, seq_len=tokens,
                              micro_batch_size=1, activation_checkpointing=bool(every), compute_bytes=4,
                              checkpoint_every=max(every, 1))
    assert measured <= planned.activations + planned.logits, (every, measured, planned.activations, planned.logits)
