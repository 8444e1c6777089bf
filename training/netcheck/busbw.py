"""Bus bandwidth: nccl-tests' definition, so our figures read like ``all_reduce_perf``'s.

NVIDIA/nccl-tests v2.19.6 (the DLC's), doc/PERFORMANCE.md: ``algbw = S / t`` with S the message
size (for all-gather the gathered output, for reduce-scatter the input: the larger buffer);
``busbw = algbw * 2(n-1)/n`` for AllReduce, ``algbw * (n-1)/n`` for AllGather and ReduceScatter,
n the ranks in the communicator. busbw is what each rank's link carried, comparable with the
hardware's peak whatever n is. Standard library only.
"""
from __future__ import annotations

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


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: message size over the time of one collective."""
    return size_bytes / seconds / GB if seconds > 0 else 0.0


def busbw_gbs(collective: str, size_bytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s (nccl-tests doc/PERFORMANCE.md)."""
    return algbw_gbs(size_bytes, seconds) * BUS_FACTOR[collective](ranks)


def link_gbs(link_gbps: float) -> float:
    """A nominal link in Gbit/s as GB/s (the unit of busbw)."""
    return link_gbps / 8
