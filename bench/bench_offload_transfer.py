"""``parallel.cpu_offload`` at full size: host<->GPU bytes per step COUNTED on CPU by the job's own
code, their time at the PCIe rate the step model uses, and the memory split between GPU and host.

FSDP2's CPUOffloadPolicy (torch 2.13 ``torch/distributed/fsdp/_fully_shard/``) copies, per step:

- host -> GPU, before every all-gather, each unit's fp32 parameter shards (``_fsdp_collectives.py``
  ``_get_param_all_gather_inputs`` -> ``_fsdp_param.py`` ``all_gather_inputs``: ``.to(device,
  non_blocking=True)``, cast to bf16 on the GPU);
- GPU -> host, after every reduce-scatter FSDP2 hands to ``.grad``, each gradient shard
  (``foreach_reduce``; it then calls the parameter's post-accumulate-grad hooks).

On CPU the host IS the device: nothing is copied, so the bench counts where the code would copy
(it wraps ``_get_param_all_gather_inputs`` and hooks every sharded parameter) while
``bench/bench_full_size_plan.py``'s measurement runs the job's code under fake tensors on the
fake 2 x g6.12xlarge group. Memory: FSDP2's memory tracker, its peak taken apart by where
CPUOffloadPolicy keeps each category (``bench_full_size_plan.HOST``: sharded parameters and gradients, AdamW's
state and whatever its step allocates; the rest is the GPU's). On a GPU three unit-sized copies
are not in that count (the fp32 shards copied in for two units' all-gathers, the gathered one
and the prefetched one, and one unit's reduce-scatter output before it goes to the host): the
result adds them as ``gpu_staging_bytes``. The host also holds, while a checkpoint is staged,
a pinned copy of the parameters and AdamW's state (training/checkpointing/manager.py), and the
pinned allocator rounds each parameter's and gradient's shard up to a power of two
(``pinned_rounding_bytes``).

Time: bytes / :data:`raytrain_eks.planning.measured_plan.PCIE_GBYTES_PER_S` (the point the preflight's
prediction uses) and over the L4's ``pcie`` range in :mod:`raytrain_eks.planning.gpu_figures` (the step
model's). The copies share each GPU's PCIe link with NCCL's intra-node rings; the two directions
do not compete. What only a GPU can show: how much of it overlaps compute (pinned memory and
non-blocking copies allow it) and the CPU AdamW step on the node's cores. Neither is predicted.

Run: ``.venv/bin/python bench/bench_offload_transfer.py [--models Qwen2.5-7B] [--publish]`` (the
7B full-shard plan: 49 s here; ``--publish`` writes it where the preflight reads it). Prints one
JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VARIANTS = ({"code": "after", "activation_checkpointing": True, "strategy": "full_shard", "cpu_offload": True},)


def transfer_time(result: dict) -> dict:
    """Seconds per step of the counted copies at the preflight's PCIe point and the step
    model's L4 range (the larger direction bounds it: H2D and D2H use opposite lanes)."""
    from raytrain_eks.planning.gpu_figures import published
    from raytrain_eks.planning.measured_plan import PCIE_GBYTES_PER_S

    o = result["offload"]
    worst = max(o["h2d"]["step_bytes"], o["d2h"]["step_bytes"])
    pcie = published("L4", 40.0).pcie
    return {"h2d_gb": round(o["h2d"]["step_bytes"] / 1e9, 2), "d2h_gb": round(o["d2h"]["step_bytes"] / 1e9, 2),
            "seconds_at_point": round(worst / (PCIE_GBYTES_PER_S * 1e9), 2), "pcie_gbytes_per_s": PCIE_GBYTES_PER_S,
            "seconds_range": [round(worst / (pcie.high * 1e9), 2), round(worst / (pcie.low * 1e9), 2)],
            "pcie_range": pcie.text()}


def main() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bench_full_size_plan import OffloadProbe, measure, save
    from raytrain_eks.planning.measured_plan import RESULTS, Cluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Qwen2.5-7B")
    parser.add_argument("--publish", action="store_true", help="also write the preflight's raytrain_eks/planning/measured_plan.json")
    args = parser.parse_args()
    cluster = Cluster()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cluster.world_size)
    results, figures = [], {}
    for name in args.models.split(","):
        for variant in VARIANTS:
            result = measure(name, cluster=cluster, probe=OffloadProbe(), **variant)
            results.append(result)
            o, gib = result["offload"], 1024**3
            figures[f"{name} {variant['strategy']}"] = {
                **transfer_time(result), "gpu_peak_gib": round(o["gpu_peak_bytes"] / gib, 2),
                "gpu_staging_gib": round(o["gpu_staging_bytes"] / gib, 2),
                "host_peak_gib_per_gpu": round(o["host_peak_bytes"] / gib, 2),
                "checkpoint_staging_gib_per_gpu": round(o["checkpoint_staging_bytes"] / gib, 2),
                "pinned_rounding_gib_per_gpu": round(o["pinned_rounding_bytes"] / gib, 2),
                "measure_s": result["measure_s"]}
            print(json.dumps(figures[f"{name} {variant['strategy']}"]), file=sys.stderr, flush=True)
    save(results, RESULTS, cluster, publish=args.publish)
    print(json.dumps({"name": "offload_transfer", **figures}))


if __name__ == "__main__":
    main()
