"""Each worker of a netcheck fit: time the collectives by size and scope, prove the transport.

Scopes: ``intra`` (the ranks of one node: PCIe/NVLink), ``inter`` (one rank per node, all
local ranks at once: what hybrid sharding's replicate dimension does), ``world``. A scope with
one rank per group is skipped. A size's time is the mean over ``iters`` collectives, averaged
over the group's ranks: what ``all_reduce_perf`` reports by default (NVIDIA/nccl-tests v2.19.6
src/common.cu: ``average = 1``, ``Allreduce(args, &deltaSec, average)`` sums the ranks' times and
divides by their number). The buffers are sized as nccl-tests sizes them (:func:`moved_bytes`).

Bus bandwidth: nccl-tests' definition, so our figures read like ``all_reduce_perf``'s.
NVIDIA/nccl-tests v2.19.6 (the DLC's), doc/PERFORMANCE.md: ``algbw = S / t`` with S the message
size (for all-gather the gathered output, for reduce-scatter the input: the larger buffer);
``busbw = algbw * 2(n-1)/n`` for AllReduce, ``algbw * (n-1)/n`` for AllGather and ReduceScatter,
n the ranks in the communicator. busbw is what each rank's link carried, comparable with the
hardware's peak whatever n is. Standard library only at import (torch and Ray when timing).
"""
from __future__ import annotations

import time
from typing import Any, Callable

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
"""nccl-tests doc/PERFORMANCE.md's factor from algbw to busbw per collective."""
GB = 1e9
"""nccl-tests reports GB/s with GB = 1e9 bytes."""


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """``min_bytes``, doubling, up to ``max_bytes`` (nccl-tests ``-b MIN -e MAX -f 2``)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


ELEMENT_BYTES = 4
"""The timed buffers are float32 (nccl-tests' default ``-d float``)."""


def moved_bytes(collective: str, size_bytes: int, ranks: int) -> int:
    """The bytes a collective of nominal ``size_bytes`` really moves, as nccl-tests v2.19.6
    sizes its buffers (``*GetCollByteCount``): all-reduce ``count`` elements (``size / 4``);
    all-gather and reduce-scatter ``base`` elements per rank, ``count / n`` rounded down to a
    16-byte multiple (``(count/nranks) & ~(16/eltSize - 1)``), ``base * n`` in all, which their
    algbw counts (``count * typesize * nranks``). At least one 16-byte block per rank."""
    count = size_bytes // ELEMENT_BYTES
    if collective == "all_reduce":
        return max(count, 1) * ELEMENT_BYTES
    block = 16 // ELEMENT_BYTES
    base = max((count // ranks) & ~(block - 1), block)
    return base * ranks * ELEMENT_BYTES


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: message size over the time of one collective."""
    return size_bytes / seconds / GB if seconds > 0 else 0.0


def busbw_gbs(collective: str, size_bytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s (nccl-tests doc/PERFORMANCE.md)."""
    return algbw_gbs(size_bytes, seconds) * BUS_FACTOR[collective](ranks)


def link_gbs(link_gbps: float) -> float:
    """A nominal link in Gbit/s as GB/s (the unit of busbw)."""
    return link_gbps / 8


SCOPES = ("intra", "inter", "world")


def scope_groups(places: list[tuple[int, int]]) -> dict[str, list[list[int]]]:
    """``places[rank] = (node_rank, local_rank)`` → each scope's rank lists (every rank in one
    group per scope). Standard library: the grouping is tested without a process group."""
    by_node: dict[int, list[int]] = {}
    by_local: dict[int, list[int]] = {}
    for rank, (node, local) in enumerate(places):
        by_node.setdefault(node, []).append(rank)
        by_local.setdefault(local, []).append(rank)
    scopes = {"intra": sorted(by_node.values()), "inter": sorted(by_local.values()),
              "world": [list(range(len(places)))] if len(by_node) > 1 else []}  # one node: world = intra
    return {scope: groups for scope, groups in scopes.items() if groups}


def ranks_mean(seconds: float, group: Any, n: int, device: Any) -> float:
    """The group's ranks' mean of ``seconds`` (nccl-tests' default ``-a 1``: AVG)."""
    import torch
    import torch.distributed as dist

    total = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return float(total.item()) / n


def _time_one(collective: str, size: int, group: Any, n: int, device: Any, iters: int, warmup: int,
              sync: Callable[[], None]) -> float:
    import torch
    import torch.distributed as dist

    count = moved_bytes(collective, size, n) // ELEMENT_BYTES  # float32 elements (divisible by n)
    big = torch.ones(count, dtype=torch.float32, device=device)
    part = torch.empty(count // n, dtype=torch.float32, device=device)
    run = {"all_reduce": lambda: dist.all_reduce(big, group=group),
           "all_gather": lambda: dist.all_gather_into_tensor(big, part, group=group),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, big, group=group)}[collective]
    for _ in range(warmup):
        run()
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    return ranks_mean((time.perf_counter() - start) / iters, group, n, device)


def measure(cfg: Any, places: list[tuple[int, int]], rank: int, device: Any,
            sync: Callable[[], None]) -> list[dict[str, Any]]:
    """Every (scope, collective, size) this rank's groups time: rows with ``seconds``,
    ``algbw_gbs``, ``busbw_gbs``, ``ranks``. ``cfg``: the job's :class:`NetcheckConfig`."""
    import torch.distributed as dist

    rows: list[dict[str, Any]] = []
    for scope, groups in scope_groups(places).items():
        # new_group is collective over the whole world: every rank creates every group, in order.
        handles = [(members, dist.new_group(members)) for members in groups]
        mine = next((m, g) for m, g in handles if rank in m)
        n = len(mine[0])
        if n < 2:
            continue  # one rank per group: no link to measure (one GPU per node, or one node)
        for collective in COLLECTIVES:
            for size in sizes(cfg.min_bytes, cfg.max_bytes):
                seconds = _time_one(collective, size, mine[1], n, device, cfg.iters, cfg.warmup_iters, sync)
                moved = moved_bytes(collective, size, n)
                rows.append({"scope": scope, "collective": collective, "bytes": size, "moved_bytes": moved,
                             "ranks": n, "groups": len(groups), "seconds": seconds,
                             "busbw_gbs": busbw_gbs(collective, moved, seconds, n)})
    return rows


def netcheck_loop_per_worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's worker function: measure, gather the transport evidence, return rank 0's
    figures and evidence (other ranks: None)."""
    import os

    import ray.train
    import torch
    import torch.distributed as dist

    from training.config import job_config_from_dict
    from training.transport import NCCL_LOG_DIR, prepare_worker
    from training.transport import collect_evidence

    job = job_config_from_dict(config["job"], config["source"])
    on_gpu = job.parallel.use_gpu
    prepare_worker(on_gpu)  # before the first collective: NCCL opens its log file there
    os.chdir(config["cwd"])
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    evidence = collect_evidence(require="any", log_dir=NCCL_LOG_DIR if on_gpu else None,
                                num_nodes=job.num_nodes, enforce=False)
    places: list = [None] * dist.get_world_size()
    dist.all_gather_object(places, (ctx.get_node_rank(), ctx.get_local_rank()))
    rows = measure(job.netcheck, [tuple(p) for p in places], rank, device, sync)
    return {"rows": rows, "evidence": evidence, "places": places} if rank == 0 else None
