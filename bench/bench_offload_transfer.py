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
CPUOffloadPolicy keeps each category (:data:`HOST`: sharded parameters and gradients, AdamW's
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

HOST = ("Sharded Param", "Sharded Grad", "OptState")
"""FSDPMemTracker's categories CPUOffloadPolicy keeps in host memory (the step's own allocations
are ``OptState`` to the tracker: it marks everything the optimizer step makes)."""
STAGED = ("Sharded Param", "OptState")
"""What a checkpoint copies into pinned host memory (the model and optimizer state)."""
VARIANTS = ({"code": "after", "activation_checkpointing": True, "strategy": "full_shard", "cpu_offload": True},)


class OffloadProbe:
    """Counts the copies per micro batch and splits the memory peak (see the module docstring)."""

    def __init__(self):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        probe = self
        self.model = None
        """Set by the measurement once the model is sharded."""
        self.micro = 0
        self.h2d: dict[int, int] = {}
        self.d2h: dict[int, int] = {}
        self.largest_unit = 0
        self.peaks = {"gpu": (0, {}), "host": (0, {})}

        class Tracker(FSDPMemTracker):
            """DTensor's sharding propagation builds its ops' arguments at their GLOBAL shape
            under the ambient fake mode (torch 2.13 ``distributed/tensor/_sharding_prop.py``
            ``_propagate_tensor_meta_non_cached``); in a real run that is a private fake mode
            and no memory, under this bench's fake mode the tracker would count it (a foreach
            AdamW step over every shard at full size): peaks are not taken while it runs."""

            propagating = 0

            def __enter__(self):
                from torch.distributed.tensor._sharding_prop import ShardingPropagator

                self._propagator = ShardingPropagator
                self._original = original = ShardingPropagator._propagate_tensor_meta_non_cached
                tracker = self

                def propagate(*args, **kwargs):
                    tracker.propagating += 1
                    try:
                        return original(*args, **kwargs)
                    finally:
                        tracker.propagating -= 1

                ShardingPropagator._propagate_tensor_meta_non_cached = propagate
                return super().__enter__()

            def __exit__(self, *exc):
                self._propagator._propagate_tensor_meta_non_cached = self._original
                return super().__exit__(*exc)

            def _update_peak_stats(self, peak_state) -> None:
                if self.propagating:
                    return
                super()._update_peak_stats(peak_state)
                for snap in self._curr_mem_snap.values():
                    host = sum(snap.get(key, 0) for key in HOST)
                    probe._peak("host", host, snap)
                    probe._peak("gpu", snap["Total"] - host, snap)

        self.tracker_class = Tracker

    def _peak(self, where: str, value: int, snap: dict) -> None:
        if value > self.peaks[where][0]:
            keys = HOST if where == "host" else [k for k in snap if k not in HOST and k != "Total"]
            self.peaks[where] = (value, {key: int(snap.get(key, 0)) for key in keys})

    def __enter__(self):
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        self._module, self._original = _fsdp_collectives, _fsdp_collectives._get_param_all_gather_inputs

        def counted(fsdp_params):
            unit = sum(p._sharded_param_data.numel() * p._sharded_param_data.element_size()
                       for p in fsdp_params if p.offload_to_cpu)
            self.h2d[self.micro] = self.h2d.get(self.micro, 0) + unit
            self.largest_unit = max(self.largest_unit, unit)
            return self._original(fsdp_params)

        _fsdp_collectives._get_param_all_gather_inputs = counted
        # model.parameters() are FSDP2's sharded parameters, the tensors foreach_reduce hands .grad to
        self._hooks = [param.register_post_accumulate_grad_hook(self._gradient)
                       for param in self.model.parameters() if param.requires_grad]
        return self

    def _gradient(self, param) -> None:
        local = param.grad._local_tensor if hasattr(param.grad, "_local_tensor") else param.grad
        self.d2h[self.micro] = self.d2h.get(self.micro, 0) + local.numel() * local.element_size()

    def __exit__(self, *exc):
        self._module._get_param_all_gather_inputs = self._original
        for hook in self._hooks:
            hook.remove()
        return False

    def figures(self, tracker, accum: int) -> dict:
        """The result's offload fields: per micro batch (first, middle, last) and per step of
        ``accum`` micro batches, the peaks, and what a checkpoint stages on the host."""
        from bench_full_size_plan import MEASURED_ACCUM

        def step(counts: dict[int, int]) -> dict:
            first, last = counts.get(0, 0), counts.get(MEASURED_ACCUM - 1, 0)
            middle = sum(counts.get(i, 0) for i in range(1, MEASURED_ACCUM - 1)) / max(1, MEASURED_ACCUM - 2)
            return {"first_bytes": first, "middle_bytes": middle, "last_bytes": last,
                    "step_bytes": int(first + max(0, accum - 2) * middle + last)}

        now = next(iter(tracker.get_tracker_snapshot("current").values()), {})
        return {"offload": {
            "h2d": step(self.h2d), "d2h": step(self.d2h),
            "gpu_peak_bytes": self.peaks["gpu"][0], "gpu_peak_breakdown": self.peaks["gpu"][1],
            "gpu_staging_bytes": 3 * self.largest_unit, "largest_unit_h2d_bytes": self.largest_unit,
            "host_peak_bytes": self.peaks["host"][0], "host_peak_breakdown": self.peaks["host"][1],
            "checkpoint_staging_bytes": int(sum(now.get(key, 0) for key in STAGED)),
            "pinned_rounding_bytes": self.pinned_rounding(),
        }}

    def pinned_rounding(self) -> int:
        """What pinning adds on the host over the tracked bytes: one pinned allocation per
        parameter (its padded shard) and per gradient shard, each rounded up to a power of two
        (raytrain_eks/planning/memory_estimate.py ``pinned_host_bytes``)."""
        from torch.distributed.fsdp import FSDPModule

        from raytrain_eks.planning.memory_estimate import pinned_rounding

        shards = []
        for module in self.model.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            for p in (group.fsdp_params if group else []):
                if p.offload_to_cpu:
                    size = p._sharded_param_data.element_size()
                    shards.append(p._sharded_param_data.numel() * size)
                    if p.sharded_param.requires_grad:
                        shards.append(p.sharded_size.numel() * size)
        return pinned_rounding(shards)


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

    from bench_full_size_plan import measure, save
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
