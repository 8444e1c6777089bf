"""``kind = "netcheck"``: the network measured under control, as a run with a verdict.

The same RayJob path as training (``python -m training --config jobs/netcheck.toml``): the driver
(:mod:`training.netcheck.driver`) fits one TorchTrainer per transport mode (NCCL as configured,
then forced to sockets), every worker (:mod:`training.netcheck.worker`) times all-reduce,
all-gather and reduce-scatter by message size within a node and across nodes, and the driver
writes ``netcheck.json`` (figures, transport evidence per rank, verdict: :mod:`.judge`).

torch.distributed collectives, not nccl-tests' ``all_reduce_perf``: they run on the process group
Ray Train already built (no MPI launcher across pods, which the RayJob path does not have), the
very path training's collectives take, and the same code runs with gloo on CPU.
"""
