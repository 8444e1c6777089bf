"""bench/bench_offload_transfer.py's counts, checked against what the same measurement's own
collective counter saw (two independent hooks into FSDP2, torch 2.13): under
``parallel.cpu_offload`` every all-gather is preceded by the host->GPU copy of the unit's fp32
shards (``_fsdp_param.py`` ``all_gather_inputs``), so per micro batch the copied bytes are the
all-gathers' bf16 output bytes x 2 / group size; every reduce-scatter FSDP2 hands to ``.grad`` is
followed by the GPU->host copy of the fp32 gradient shard (``_fsdp_collectives.py``
``foreach_reduce``), so with full shard the copied bytes are the reduce-scatter inputs' bytes /
group size. Run in a subprocess: the fake process group is process-wide."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import bench_full_size_plan as plan
from bench_full_size_plan import OffloadProbe
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS, Cluster

MODEL_CONFIGS["tiny"] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
                             tie_word_embeddings=False)  # the bench's batch holds ids up to 150000
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
result = plan.measure("tiny", code="after", activation_checkpointing=True, strategy="full_shard", cluster=Cluster(),
                      cpu_offload=True, probe=OffloadProbe())
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def measured() -> dict:
    code = SCRIPT.format(root=str(ROOT), bench=str(ROOT / "bench"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_host_to_gpu_bytes_are_the_gathered_units_fp32_shards(measured):
    gathers = [c for c in measured["collectives"] if c["kind"] == "all_gather"]
    for micro in ("first", "middle", "last"):
        expected = sum(c[f"{micro}_bytes"] for c in gathers) * 2 / 8  # bf16 gathered -> fp32 shard per rank
        assert measured["offload"]["h2d"][f"{micro}_bytes"] == pytest.approx(expected), micro


def test_gpu_to_host_bytes_are_the_reduced_gradient_shards(measured):
    scatters = [c for c in measured["collectives"] if c["kind"] == "reduce_scatter"]
    for micro in ("first", "middle", "last"):
        expected = sum(c[f"{micro}_bytes"] for c in scatters) / 8  # fp32 reduce input -> this rank's shard
        # the counted copy is the unpadded shard: at most one padding row per parameter less
        assert 0.99 * expected <= measured["offload"]["d2h"][f"{micro}_bytes"] <= expected, micro


def test_the_memory_splits_into_gpu_and_host_and_the_prediction_uses_the_named_pcie_rate(measured):
    from raytrain_eks.planning.measured_plan import PCIE_GBYTES_PER_S, offload_copy_bytes

    o = measured["offload"]
    assert set(o["host_peak_breakdown"]) == {"Sharded Param", "Sharded Grad", "OptState"}
    assert not {"Sharded Param", "Sharded Grad", "OptState"} & set(o["gpu_peak_breakdown"])
    assert o["gpu_peak_bytes"] < measured["peak_bytes"] and o["host_peak_bytes"] < measured["peak_bytes"]
    accum = measured["prediction"]["grad_accum_steps"]
    assert measured["prediction"]["offload_copy_s"] == pytest.approx(
        offload_copy_bytes(measured, accum) / (PCIE_GBYTES_PER_S * 1e9), abs=1e-3)


def test_the_pinned_rounding_is_the_hand_count_of_the_weight_shards_plus_the_small_tensors(measured):
    """The bench's ``pinned_rounding_bytes`` (every offloaded shard FSDP2 made, one pinned block
    each, rounded up to a power of two) against the hand model's (the weight matrices only:
    raytrain_eks/planning/memory_estimate.py); the norms' and biases' shards add a few KiB."""
    from raytrain_eks.planning.memory_estimate import _offloaded_shards, pinned_rounding
    from training.flops import ModelShapes

    tiny = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False)
    hand = pinned_rounding(_offloaded_shards(ModelShapes.from_hf_config(tiny), 8, 4, full=True))
    assert hand > 0 and 0 <= measured["offload"]["pinned_rounding_bytes"] - hand < 64 * 1024
