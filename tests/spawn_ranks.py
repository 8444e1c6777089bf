"""Run a test worker on N plain processes (gloo ranks) and collect what each rank wrote.

A worker is ``worker(rank, out_dir, *args)`` and writes its results to ``out_dir/rank<r>.json``;
:func:`spawn_ranks` returns those results in rank order."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Callable

import torch.multiprocessing as mp


def spawn_ranks(worker: Callable[..., None], *args, nprocs: int = 2) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(out_dir, *args), nprocs=nprocs, join=True)
        results = []
        for rank in range(nprocs):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
                results.append(json.load(handle))
        return results
