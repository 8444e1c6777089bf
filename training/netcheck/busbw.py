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
