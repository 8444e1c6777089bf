"""Run a test worker on N plain processes (gloo ranks) and collect what each rank wrote.

A worker is ``worker(rank, out_dir, *args)`` and writes its results to ``out_dir/rank<r>.json``;
:func:`spawn_ranks` returns those results in rank order.

The ranks are forked from a fork server (``multiprocessing``'s ``forkserver`` start method), one
per test process, that imported torch, transformers' Qwen2 and the training loop once
(:data:`PRELOAD`): a rank started with ``spawn`` imported them afresh, 4-5 of its 5 CPU-seconds
(21 ranks of eight test modules: 109 CPU-s). Each rank is still a process of its own, forked from
a server that only imported: no rank sees what another did. The server keeps the environment it
was started with, so each rank takes the test's current ``os.environ`` (and forgets the temporary
folder the server's imports cached, ``tempfile.tempdir``) before its worker runs: what ``spawn``
gave it. Python 3.11's fork server does not apply the parent's ``sys.path``
(``multiprocessing/forkserver.py`` ``main`` takes it and leaves it unused) and skips a preload that
fails to import: the server finds ``training`` through this checkout's editable install."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Callable

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.distributed.fsdp",
           "transformers.models.qwen2.modeling_qwen2", "training.loop"]
"""What every rank imports before its worker's own module: the fork server imports it once.
Importing only, no tensor work: torch's OpenMP pool is made at its first parallel op, so a fork of
the server has none to inherit (an OpenMP pool made before ``fork`` hangs the child). numpy's
OpenBLAS starts its threads at import, and registers a fork handler that remakes them in the
child, as torch's fork-started DataLoader workers rely on."""


def _run_then_exit(rank: int, environ: dict[str, str], worker: Callable[..., None], out_dir: str, *args) -> None:
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

    import tempfile

    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None  # read TMPDIR again, from the test's environment
    torch.set_num_threads(1)
    worker(rank, out_dir, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(worker: Callable[..., None], *args, nprocs: int = 2) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.set_forkserver_preload(PRELOAD)  # read when this process first starts its server
        mp.start_processes(_run_then_exit, args=(dict(os.environ), worker, out_dir, *args), nprocs=nprocs, join=True,
                           start_method="forkserver")
        results = []
        for rank in range(nprocs):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
                results.append(json.load(handle))
        return results
