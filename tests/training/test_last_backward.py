"""The ``is_last_backward`` lever of training/parallel.py on 2 gloo ranks: with the parameters
kept gathered, only the step's last backward waits for the retained reduce-scatters; the
collectives (counted by torch's ``CommDebugMode``) and the gradients are the same as without it.

Oracle (pytorch v2.13.0, torch/distributed/fsdp/_fully_shard/_fsdp_state.py:421-431
``_root_post_backward_final_callback``): when ``_state_ctx.is_last_backward`` is True the final
callback makes the compute stream wait on every retained reduce-scatter and clears
``_comm_ctx.reduce_scatter_states``; when False they stay (their input buffers alive) until the
next module's reduce-scatter or the last backward reclaims them (_fsdp_param_group.py:648-659).
So after a non-last micro batch the states list is non-empty exactly when the lever is on.
The retained buffer's memory is the bytes the retained states hold; ``FSDPMemTracker``'s live
bytes are printed beside it, not asserted: on gloo a finished collective's input is released by
its work object on gloo's own thread, so the tracker's count after a backward depends on thread
timing (seen differing by exactly one root buffer between runs on a loaded machine).
"""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config

ACCUM, SEQ_LEN = 3, 16

pytestmark = pytest.mark.slow  # 2 spawned ranks


def _step(rank: int, *, keep_gathered: bool, lever: bool) -> dict:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.tensor.debug import CommDebugMode
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.model import loss_sum
    from training.parallel import begin_micro_batch, build_mesh, end_accumulation, parallelize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=3)))
    parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False,
                keep_gathered=keep_gathered)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 500, (ACCUM, SEQ_LEN), generator=torch.Generator().manual_seed(5 + rank))
    state = model._get_fsdp_state()
    out = {"collectives": [], "retained_after": []}
    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        for index in range(ACCUM):
            tracker.reset_mod_stats()  # per-module stats are per forward; the peak is kept
            begin_micro_batch(model, index, ACCUM)
            if not lever:  # the code before the lever: every backward is "last"
                model.set_is_last_backward(True)
            with CommDebugMode() as comm:
                loss_sum(model, {"input_ids": ids[index:index + 1], "labels": ids[index:index + 1].clone()}).backward()
            out["collectives"].append({str(op): n for op, n in comm.get_comm_counts().items()})
            out["retained_after"].append(len(state._comm_ctx.reduce_scatter_states))
            # the bytes the retained states keep alive: the state list holds each input tensor
            # (ReduceScatterState.reduce_scatter_input, _fsdp_param_group.py:135-137, appended at 717)
            out.setdefault("retained_bytes_after", []).append(sum(
                s.reduce_scatter_input.numel() * s.reduce_scatter_input.element_size()
                for s in state._comm_ctx.reduce_scatter_states))
            out.setdefault("current_after", []).append(
                int(tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]))
        end_accumulation(model, ACCUM)
    out["peak_bytes"] = int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    out["root_numel"] = sum(fsdp_param._orig_size.numel() for fsdp_param in state._fsdp_param_group.fsdp_params)
    out["grads"] = [float(v) for p in model.parameters() for v in p.grad.to_local().flatten()]
    out["is_last_backward_after"] = state._state_ctx.is_last_backward
    return out


def _worker(rank: int, out_dir: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{os.path.join(out_dir, 'store')}")
    results = {f"{'kept' if kept else 'regathered'}-{'lever' if lever else 'before'}": _step(rank, keep_gathered=kept,
                                                                                          lever=lever)
               for kept in (True, False) for lever in (True, False)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(_worker)


def test_kept_gathered_non_last_backwards_leave_the_reduce_scatters_running(ranks):
    for rank in ranks:
        assert rank["kept-before"]["retained_after"] == [0] * ACCUM
        assert rank["kept-lever"]["retained_after"][:-1] != [0] * (ACCUM - 1)  # still in flight
        assert rank["kept-lever"]["retained_after"][-1] == 0                   # the last backward waits
        assert rank["kept-lever"]["is_last_backward_after"] is True            # restored for evaluation


def test_the_lever_changes_no_collective_and_no_gradient(ranks):
    print(f"\ncollectives per micro batch (CommDebugMode), kept gathered: before {ranks[0]['kept-before']['collectives']}"
          f", with the lever {ranks[0]['kept-lever']['collectives']}")
    for rank in ranks:
        for plan in ("kept", "regathered"):
            lever, before = rank[f"{plan}-lever"], rank[f"{plan}-before"]
            assert lever["collectives"] == before["collectives"], plan
            assert lever["grads"] == before["grads"], plan


def test_regathering_plans_keep_waiting_at_every_backward(ranks):
    # without kept parameters backward's prefetch by the forward order would unshard the
    # previous micro batch's units: the lever stays off there
    for rank in ranks:
        assert rank["regathered-lever"]["retained_after"] == [0] * ACCUM


def test_the_retained_buffer_costs_memory(ranks):
    # with the lever the root's reduce-scatter input (its unsharded fp32 gradient, 4 bytes per
    # root parameter) stays alive until the next micro batch's first post-backward waits for it
    # (_fsdp_param_group.py:647-658); the last backward waits for it and holds nothing
    kept = ranks[0]
    before, lever = kept["kept-before"]["current_after"], kept["kept-lever"]["current_after"]
    print(f"\nlive tracked bytes after each backward (FSDPMemTracker): before {before}, with the lever {lever}; "
          f"peak {kept['kept-before']['peak_bytes']} vs {kept['kept-lever']['peak_bytes']}")
    retained = 4 * kept["kept-lever"]["root_numel"]
    assert kept["kept-lever"]["retained_bytes_after"] == [retained] * (ACCUM - 1) + [0]
    assert kept["kept-before"]["retained_bytes_after"] == [0] * ACCUM
