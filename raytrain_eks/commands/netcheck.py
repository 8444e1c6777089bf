"""`raytrain-eks netcheck`: the network measured under control (jobs/netcheck.toml, submitted as
any job is: ``submit``'s path, its checks before spend, its RayJob on the GPU node group).

Prints the bus bandwidth table (NCCL as configured vs forced to sockets), writes ``netcheck.png``
beside ``netcheck.json`` in ``--out`` and exits with the verdict's code (0 accepted, 3 rejected,
1 a run failed). ``--local``: on this machine's CPUs with gloo (2 workers, 1-4 MiB), the whole
path without a GPU: the figures, the record, the verdict.
"""
from __future__ import annotations

import argparse

from raytrain_eks.commands import submit

JOB = "jobs/netcheck.toml"
LOCAL_SETS = ("parallel.use_gpu=false", "parallel.num_workers=2", "parallel.workers_per_node=2",
              "netcheck.max_bytes=4194304", "netcheck.iters=5", "evidence.require_transport=any")
"""A local netcheck: gloo on two CPU workers of one node, small messages (the figures measure
this machine's loopback, not a network; the path is what is proven)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    submit.add_arguments(parser)
    parser.set_defaults(job=JOB)
    for action in parser._actions:  # the job is fixed: JOB becomes an optional argument
        if action.dest == "job":
            action.nargs, action.help = "?", f"the netcheck job (default {JOB})"


def run(args: argparse.Namespace) -> int:
    if args.local:
        args.overrides = [*LOCAL_SETS, *args.overrides]
    return submit.run(args)
