"""The NCCL log folder exists before ANY collective of a worker (2 gloo ranks, the real entry).

NCCL's rule (NVIDIA/nccl, src/debug.cc ``ncclDebugInit``, called once from ``ncclDebugLogV``
at the first log line of the process, i.e. the lazy init at its first collective): expand
``%h``/``%p`` in NCCL_DEBUG_FILE, ``fopen(path, "w")``, and when that fails keep ``stdout``
for the rest of the process. :class:`NcclDebugInit` ports that rule: the first collective of a
rank opens the file exactly so. Every collective entry point of ``torch.distributed`` is wrapped
to record whether the folder existed at its call; the worker is Ray Train's own entry
(``train_loop_per_worker``) with the Ray context swapped for a plain process group.
"""
from __future__ import annotations

import json
import os
import socket

import pytest

from spawn_ranks import spawn_ranks
from tiny_qwen import tiny_qwen2_config

pytestmark = pytest.mark.slow  # trains 2 steps on 2 ranks

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast",
               "broadcast_object_list", "barrier", "reduce_scatter", "reduce_scatter_tensor", "gather_object",
               "scatter_object_list", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter",
               "monitored_barrier")


class NcclDebugInit:
    """NCCL's debug-file decision, taken once at the process's first collective."""

    def __init__(self) -> None:
        self.target: str | None = None   # None: not decided yet; "stdout" or the file's path

    def first_collective(self) -> None:
        if self.target is not None:
            return
        pattern = os.environ.get("NCCL_DEBUG_FILE", "")
        path = pattern.replace("%h", socket.gethostname().split(".")[0]).replace("%p", str(os.getpid()))
        try:
            open(path, "w").close()  # fopen(debugFn, "w")
            self.target = path
        except OSError:
            self.target = "stdout"


def _instrument(calls: list, nccl: NcclDebugInit, folder: str) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        for module in (dist, c10d):
            original = getattr(module, name, None)
            if original is None or getattr(original, "_instrumented", False):
                continue

            def wrapper(*args, _original=original, _name=name, **kwargs):
                calls.append({"collective": _name, "folder_existed": os.path.isdir(folder)})
                nccl.first_collective()
                return _original(*args, **kwargs)

            wrapper._instrumented = True
            setattr(module, name, wrapper)


def _worker(rank: int, out_dir: str, base: str) -> None:
    import torch.distributed as dist

    from training import loop
    from training.config import job_config_from_dict

    folder = os.path.join(base, f"nccl-logs-rank{rank}")  # does not exist yet; one per rank (node-local)
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_FILE=os.path.join(folder, "nccl.%h.%p.log"))
    local_dir = os.path.join(base, "local")
    os.makedirs(local_dir, exist_ok=True)
    calls: list = []
    nccl = NcclDebugInit()
    _instrument(calls, nccl, folder)
    # Ray's context, swapped for a plain gloo group (creating a group runs no collective).
    loop.ray_context = lambda run_dir="": loop.local_context(local_dir, rank=rank, world_size=2)
    job = job_config_from_dict({
        "name": "nccl-order-test", "model": {"config": tiny_qwen2_config()}, "data": {"kind": "synthetic"},
        "train": {"seq_len": 16, "micro_batch_size": 1, "global_batch_size": 2, "max_steps": 2,
                  "lr": 1e-3, "warmup_steps": 1},
        "parallel": {"strategy": "full_shard", "num_workers": 2, "workers_per_node": 2},
        "eval": {"max_batches": 1},
    }, "test")
    try:
        loop.train_loop_per_worker({"job": job.to_dict(), "source": "test", "run_dir": ""})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"calls": calls, "nccl_log": nccl.target}, handle)


def test_no_collective_runs_before_the_nccl_log_folder_exists(tmp_path):
    # Given NCCL_DEBUG_FILE in a folder nobody created yet (as the driver sets it on GPU), when
    # the worker entry runs a short job on 2 ranks, then every collective of either rank finds
    # the folder, and the first one (where NCCL opens its file) opens the file, not stdout.
    ranks = spawn_ranks(_worker, str(tmp_path))
    for rank, result in enumerate(ranks):
        calls = result["calls"]
        assert calls, f"rank {rank} ran no collective (the instrumentation missed them)"
        early = [c["collective"] for c in calls if not c["folder_existed"]]
        assert not early, (f"rank {rank}: {early[0]} ran before the NCCL log folder existed "
                           f"({len(early)} of {len(calls)} collectives): NCCL logs to {result['nccl_log']} "
                           "for the whole process")
        assert result["nccl_log"] != "stdout" and os.path.exists(result["nccl_log"])
