"""Run a test worker on N plain processes (gloo ranks) and collect what each rank wrote.

A worker is ``worker(rank, out_dir, *args)`` and writes its results to ``out_dir/rank<r>.json``;
:func:`spawn_ranks` returns those results in rank order."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Callable

import torch.multiprocessing as mp


def _run_then_exit(rank: int, worker: Callable[..., None], out_dir: str, *args) -> None:
    """The worker, then an exit that skips interpreter finalization. A rank's results are on
    disk once it returns; what finalization does after that is not under test, and on a loaded
    machine it can abort: gloo's C++ worker threads may still hold tensors whose release needs
    the GIL of an interpreter that is being torn down (SIGABRT, "terminate called without an
    active exception"; pytorch/pytorch#179291 describes the mechanism). A worker that raises
    still fails the spawn with its traceback.

    One intra-op thread per rank, as Ray gives a worker of one CPU or less (ray 2.58
    ``ray/_private/utils.py`` ``set_omp_num_threads_if_unset``): torch's default is one per core
    in EVERY rank, and N ranks x 2 OpenMP threads on 2 cores wait on each other's spinning
    threads (one process of a tiny model, 2 threads against 1, on the loaded machine: 4-7 s
    against 0.35 s a step)."""
    import torch

    torch.set_num_threads(1)
    worker(rank, out_dir, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(worker: Callable[..., None], *args, nprocs: int = 2) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_run_then_exit, args=(worker, out_dir, *args), nprocs=nprocs, join=True)
        results = []
        for rank in range(nprocs):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
                results.append(json.load(handle))
        return results
