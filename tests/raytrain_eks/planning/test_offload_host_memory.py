"""The host memory ``parallel.cpu_offload`` needs, against torch 2.13's own rules: FSDP2's
CPUOffloadPolicy pins each parameter's padded shard and each gradient shard as its own
allocation, and the CUDA pinned allocator rounds each allocation up to a power of two."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raytrain_eks.planning.memory_estimate import _offloaded_shards, estimate_memory, pinned_host_bytes, pinned_rounding
from training.flops import ModelShapes

TORCH_INCLUDE = Path(torch.__file__).parent / "include"


def _power_of_2_ceil(value: int) -> int:
    """LLVM's ``PowerOf2Ceil`` (c10/util/llvmMathExtras.h, shipped in torch 2.13's include/):
    ``0`` for 0, else the smallest power of two >= value."""
    if value == 0:
        return 0
    return 1 << (value - 1).bit_length()


def test_a_pinned_block_is_rounded_up_to_a_power_of_two_as_torchs_host_allocator_does():
    """Oracle: torch 2.13 ATen/core/CachingHostAllocator.h:300-309 (``allocate``: ``roundSize`` =
    ``c10::llvm::PowerOf2Ceil(size)`` while ``size <= pinned_max_round_threshold()``, whose default
    is ``SIZE_MAX``, c10/core/AllocatorConfig.h:361): read from the installed headers, so a torch
    that stops rounding fails here."""
    header = (TORCH_INCLUDE / "ATen" / "core" / "CachingHostAllocator.h").read_text()
    assert "return c10::llvm::PowerOf2Ceil(size);" in header
    config = (TORCH_INCLUDE / "c10" / "core" / "AllocatorConfig.h").read_text()
    assert "size_t pinned_max_round_threshold_{std::numeric_limits<size_t>::max()};" in config
    for nbytes in (1, 2, 3, 5, 4096, 4097, 33_947_648, 2**26, 2**26 + 1, 272_498_688):
        assert pinned_host_bytes(nbytes) == _power_of_2_ceil(nbytes)
    assert pinned_rounding([3, 4, 5]) == 1 + 0 + 3


TINY = dict(model_type="qwen2", vocab_size=250, hidden_size=64, intermediate_size=100, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
SHARDS = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers import AutoModelForCausalLM, Qwen2Config

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
model = AutoModelForCausalLM.from_config(Qwen2Config(**json.loads(sys.argv[1])), dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, offload_policy=CPUOffloadPolicy(pin_memory=False))
fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=False))
made = []
for module in model.modules():
    if isinstance(module, FSDPModule):
        for p in module._get_fsdp_state()._fsdp_param_group.fsdp_params:
            assert p.offload_to_cpu and p._sharded_param_data.device.type == "cpu"
            if p.sharded_param.ndim == 2:
                made += [p._sharded_param_data.numel() * 4, p.sharded_size.numel() * 4]
print(json.dumps(made))
"""
"""FSDP2 on a fake 8-rank group, in its own process (the fake process group is process-wide)."""


@pytest.mark.subprocess
def test_the_pinned_shards_counted_are_the_ones_fsdp2_makes_under_cpu_offload():
    """Oracle: FSDP2's own sharding (torch 2.13 ``_fsdp_param.py``:300-315: dim 0 chunked over the
    group, every shard padded to chunk 0's size, the padded shard moved to the host) of a tiny
    Qwen2 with GQA on a fake 8-rank group, CPUOffloadPolicy: the weight matrices' shards on
    rank 0 are what the estimate rounds (norms and biases left out: a few KiB)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SHARDS, json.dumps(TINY)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    made = json.loads(out.stdout.strip().splitlines()[-1])
    counted = _offloaded_shards(ModelShapes.from_hf_config(TINY), 8, 4, full=True)
    assert sorted(made) == sorted(counted)


def test_the_hand_estimate_of_qwen2_5_7b_on_8_gpus_holds_the_rounding():
    """Qwen2.5-7B's fp32 shards on 8 GPUs: 7.1 GiB of parameter and gradient shards take 13.5 GiB
    pinned (an MLP shard of 32.4 MiB takes 64 MiB): +6.4 GiB of host memory per GPU."""
    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS

    seven_b = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS["Qwen2.5-7B"]})
    kw = dict(strategy="full_shard", world_size=8, workers_per_node=4, seq_len=2048, micro_batch_size=1,
              activation_checkpointing=True, grad_accum_steps=8)
    on = estimate_memory(seven_b, cpu_offload=True, **kw)
    n = seven_b.num_params()
    extra = on.host - (4 + 4 + 8 + 4 + 4 + 8) * n / 8
    assert extra == pytest.approx(pinned_rounding(_offloaded_shards(seven_b, 8, 4, full=True)), abs=8)
    assert 6.3 < extra / 1024**3 < 6.5
