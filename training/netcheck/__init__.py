"""``kind = "netcheck"``: the network measured under control, as a run with a verdict.

The same RayJob path as training (``python -m training --config jobs/netcheck.toml``): the driver
(this module) fits one TorchTrainer per transport mode (NCCL as configured, then forced to
sockets), every worker (:mod:`training.netcheck.worker`) times all-reduce,
all-gather and reduce-scatter by message size within a node and across nodes, and the driver
writes ``netcheck.json`` (figures, transport evidence per rank, verdict: :mod:`.judge`).

torch.distributed collectives, not nccl-tests' ``all_reduce_perf``: they run on the process group
Ray Train already built (no MPI launcher across pods, which the RayJob path does not have), the
very path training's collectives take, and the same code runs with gloo on CPU.

Each mode is its own fit because NCCL reads its transport settings when a process creates its
first communicator: forcing sockets needs fresh worker processes with :data:`SOCKET_ENV`.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from training import contract
from training.config import JobConfig
from training.verdict import ACCEPTED
from training.netcheck.judge import MODES, NCCL_MODE, SOCKET_MODE, headline, judge

SOCKET_ENV = {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp", "NCCL_NET_PLUGIN": "none"}
"""NCCL forced to its own TCP transport (the TCP run of an EFA comparison, as AWS's Ray Train
sample sets it). NCCL 2.29.7: ``NCCL_NET_PLUGIN=none`` opens no external plugin, so aws-ofi-nccl
is never loaded (src/plugin/net.cc:245-249), and ``NCCL_NET=Socket`` lets only the net named
``Socket`` initialise (src/init.cc:1857, src/plugin/net.cc:305-307); these replace the pods'
``NCCL_NET_PLUGIN=ofi`` (a runtime env's env_vars win), and /etc/nccl.conf never overrides the
environment (src/os/linux.cc:57, ``setenv(.., 0)``). ``FI_PROVIDER=tcp`` only matters if a plugin
loaded anyway; the verdict then fails the run (training/netcheck/judge.py
``forced_socket_problem``: NCCL's log must say ``Using network Socket`` on every rank, no NET/OFI line)."""


def mode_env(mode: str) -> dict[str, str]:
    """The workers' extra environment for ``mode`` (:data:`MODES`)."""
    return dict(SOCKET_ENV) if mode == SOCKET_MODE else {}


def fit_mode(job: JobConfig, mode: str) -> dict[str, Any]:
    """One fit of :func:`training.netcheck.worker.netcheck_loop_per_worker`; rank 0's result."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.metrics import ray_train_logging_config, without_preemption_watcher
    from training.launch import COLLECTIVE_TIMEOUT_S, storage_location, worker_env
    from training.netcheck.worker import netcheck_loop_per_worker
    from training.parallel import backend_for

    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    without_preemption_watcher()  # as the training driver does (training/metrics.py says why)
    p = job.parallel
    resources = {"CPU": p.cpus_per_worker, **({"GPU": 1} if p.use_gpu else {})}
    storage_path, storage_fs = storage_location(job)
    trainer = TorchTrainer(
        netcheck_loop_per_worker,
        train_loop_config={"job": job.to_dict(), "source": job.source, "cwd": os.getcwd()},
        torch_config=TorchConfig(backend=backend_for(p.use_gpu), timeout_s=COLLECTIVE_TIMEOUT_S),
        scaling_config=ScalingConfig(num_workers=p.num_workers, use_gpu=p.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(name=f"{job.run_name}-{mode}", storage_path=storage_path, storage_filesystem=storage_fs,
                             failure_config=FailureConfig(max_failures=0),
                             worker_runtime_env={"env_vars": {**worker_env(job), **mode_env(mode)}},
                             logging_config=ray_train_logging_config()))
    result = trainer.fit()
    if getattr(result, "error", None):
        raise result.error
    return result.return_value


def record(job: JobConfig, modes: dict[str, dict[str, Any]], started: float) -> dict[str, Any]:
    """``netcheck.json``: the settings, each mode's figures and evidence, the verdict."""
    n = job.netcheck
    judged = judge(modes, link_gbps=n.link_gbps, min_link_fraction=n.min_link_fraction,
                   require_transport=job.evidence.require_transport)
    return {"kind": "netcheck", "job_config": job.to_dict(), "start_time": started, "end_time": time.time(),
            "cluster": {"nodes": job.num_nodes, "world_size": job.parallel.num_workers,
                        "workers_per_node": job.parallel.workers_per_node, "use_gpu": job.parallel.use_gpu},
            "modes": modes, "verdict": judged}


def measure(job: JobConfig) -> dict[str, Any]:
    """Fit every mode, write ``<run dir>/netcheck.json``; returns the record. A failed fit raises."""
    from training.launch import connect_ray, run_dir
    from training.storage.files import write_json

    connect_ray()
    started = time.time()
    modes = {mode: fit_mode(job, mode) for mode in (MODES if job.netcheck.compare_socket else (NCCL_MODE,))}
    out = record(job, modes, started)
    out["uri"] = f"{run_dir(job).rstrip('/')}/{contract.NETCHECK_NAME}"
    write_json(out["uri"], out)
    return out


def run(job: JobConfig) -> int:
    """``kind = "netcheck"``: measure, print the table and the verdict; returns the verdict's
    exit code (1 when a fit failed)."""
    from training.netcheck.judge import table

    try:
        out = measure(job)
    except Exception as err:  # noqa: BLE001 - one line, the details are in the workers' logs
        first = (str(err).strip().splitlines() or [""])[0]
        print(f"netcheck failed: {type(err).__name__}: {first}", file=sys.stderr, flush=True)
        return 1
    print(table(out), flush=True)
    print(f"netcheck record: {out['uri']}", flush=True)
    print("verdict: " + headline(out["verdict"]), flush=True)
    return out["verdict"]["exit_code"]


def before_training(job: JobConfig) -> dict[str, Any]:
    """``netcheck.run_first``: measure; the summary run.json keeps (``verdict``, ``figures``,
    ``uri``). Raises :class:`training.transport.TransportError` (the run's failure stage
    ``transport``) when the netcheck rejects the network."""
    from training.netcheck.judge import table
    from training.transport import TransportError

    out = measure(job)
    print(table(out), flush=True)
    print("netcheck: " + headline(out["verdict"]), flush=True)
    if out["verdict"]["verdict"] != ACCEPTED:
        raise TransportError(f"netcheck {headline(out['verdict'])} ({out['uri']})")
    return {key: out["verdict"][key] for key in ("verdict", "figures")} | {"uri": out["uri"]}
