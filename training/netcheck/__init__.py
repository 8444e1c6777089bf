"""``kind = "netcheck"``: the network measured under control, as a run with a verdict.

The same RayJob path as training (``python -m training --config jobs/netcheck.toml``): the driver
(this module) fits one TorchTrainer per transport mode (NCCL as configured, then forced to
sockets), every worker (:mod:`training.netcheck.worker`) times all-reduce,
all-gather and reduce-scatter by message size within a node and across nodes, and the driver
writes ``netcheck.json`` (figures, transport evidence per rank, verdict: :func:`judge`).

torch.distributed collectives, not nccl-tests' ``all_reduce_perf``: they run on the process group
Ray Train already built (no MPI launcher across pods, which the RayJob path does not have), the
very path training's collectives take, and the same code runs with gloo on CPU.

Each mode is its own fit because NCCL reads its transport settings when a process creates its
first communicator: forcing sockets needs fresh worker processes with :data:`SOCKET_ENV`.

The record read back (standard library only, so the CLI reads a netcheck.json with it): its
verdict, pure rules over it, and its table (:func:`table`: bus bandwidth by size, one column per
mode).

- ``link``: across nodes, the NCCL run's all-reduce bus bandwidth through one node's link is at
  least ``netcheck.min_link_fraction`` of that nominal link (``netcheck.link_gbps``): the inter
  scope times one group per local rank at once, all through the same link, so the node carries
  the groups' busbw summed (:func:`node_busbw`);
- ``efa_faster``: when the NCCL run went over EFA, it beats the run forced to sockets;
- ``transport``: the NCCL run's transport is ``evidence.require_transport`` (when not ``any``);
- ``socket_run``: the run forced to sockets was on NCCL's own Socket transport on every rank,
  with aws-ofi-nccl never loaded (:func:`forced_socket_problem`; else the comparison compares nothing).
A rule that has nothing to judge (one node, no link figure, no socket run) is listed as skipped.
Verdicts and exit codes are training's (:mod:`training.verdict`).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from training import contract
from training.config import JobConfig
from training.netcheck.worker import link_gbs
from training.verdict import ACCEPTED, EXIT_CODES, REJECTED

SOCKET_ENV = {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp", "NCCL_NET_PLUGIN": "none"}
"""NCCL forced to its own TCP transport (the TCP run of an EFA comparison, as AWS's Ray Train
sample sets it). NCCL 2.29.7: ``NCCL_NET_PLUGIN=none`` opens no external plugin, so aws-ofi-nccl
is never loaded (src/plugin/net.cc:245-249), and ``NCCL_NET=Socket`` lets only the net named
``Socket`` initialise (src/init.cc:1857, src/plugin/net.cc:305-307); these replace the pods'
``NCCL_NET_PLUGIN=ofi`` (a runtime env's env_vars win), and /etc/nccl.conf never overrides the
environment (src/os/linux.cc:57, ``setenv(.., 0)``). ``FI_PROVIDER=tcp`` only matters if a plugin
loaded anyway; the verdict then fails the run (:func:`forced_socket_problem`: NCCL's log must
say ``Using network Socket`` on every rank, no NET/OFI line)."""

NCCL_MODE, SOCKET_MODE = "nccl", "socket"
MODES = (NCCL_MODE, SOCKET_MODE)
"""The runs of one netcheck: NCCL as the pods configure it, then forced to its socket transport."""


def peak_busbw(rows: list[dict[str, Any]], scope: str, collective: str = "all_reduce") -> float | None:
    """The highest bus bandwidth (GB/s) of ``collective`` in ``scope``; None when not measured."""
    values = [r["busbw_gbs"] for r in rows if r["scope"] == scope and r["collective"] == collective]
    return max(values) if values else None


def node_busbw(rows: list[dict[str, Any]], scope: str = "inter", collective: str = "all_reduce") -> float | None:
    """The highest bus bandwidth (GB/s) one node's link carried: a row's busbw times the groups
    timed at once (each has one rank on every node); None when not measured."""
    values = [r["busbw_gbs"] * r.get("groups", 1) for r in rows if r["scope"] == scope and r["collective"] == collective]
    return max(values) if values else None


def forced_socket_problem(evidence: dict[str, Any]) -> str | None:
    """Why the run forced to sockets (:data:`SOCKET_ENV`) does not prove
    NCCL's own Socket transport, or None. Judged per rank: the run's class is its worst rank's
    (socket beats efa), and aws-ofi-nccl on libfabric's tcp provider is classified socket too,
    but it is not NCCL's socket transport, and with ``NCCL_NET_PLUGIN=none`` NCCL 2.29.7 never
    opens the plugin (src/plugin/net.cc:245-249), so any NET/OFI line means the setting did not take."""
    ranks = evidence.get("ranks") or []
    if not ranks:
        return f"no rank's evidence (run class {evidence.get('transport', 'unknown')!r})"
    for rank in ranks:
        who = f"rank {rank.get('rank')}" + (f" ({rank['host']})" if rank.get("host") else "")
        if rank.get("ofi_nccl_version") or rank.get("provider"):
            return (f"{who} loaded aws-ofi-nccl {rank.get('ofi_nccl_version') or ''}".rstrip()
                    + f" (provider {rank.get('provider') or 'none selected'}): NCCL_NET_PLUGIN=none did not take")
        if rank.get("transport") != "socket" or (rank.get("network") or "socket").lower() not in ("socket", "gloo"):
            return f"{who} on {rank.get('transport')!r} (network {rank.get('network') or 'not logged'!r}), not NCCL's Socket"
    return None


def _check(name: str, ok: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


def judge(modes: dict[str, dict[str, Any]], *, link_gbps: float, min_link_fraction: float,
          require_transport: str) -> dict[str, Any]:
    """``modes[mode] = {"rows": [...], "evidence": {...}}`` → ``{"verdict", "checks",
    "figures"}``; ``ok`` None = skipped."""
    nccl = modes.get(NCCL_MODE) or {}
    socket = modes.get(SOCKET_MODE)
    inter = peak_busbw(nccl.get("rows", []), "inter")
    used = (nccl.get("evidence") or {}).get("transport", "unknown")
    figures: dict[str, Any] = {"inter_busbw_gbs": inter, "intra_busbw_gbs": peak_busbw(nccl.get("rows", []), "intra"),
                               "link_gbs": link_gbs(link_gbps) if link_gbps else None, "transport": used}
    checks = []
    if inter is None or not link_gbps:
        checks.append(_check("link", None, "no inter-node figure" if inter is None else "link_gbps unknown (0)"))
    else:
        figures["inter_node_busbw_gbs"] = node = node_busbw(nccl.get("rows", []))
        figures["link_ratio"] = ratio = node / link_gbs(link_gbps)
        checks.append(_check("link", ratio >= min_link_fraction,
                             f"inter-node all-reduce busbw {node:.2f} GB/s through each node's link = {ratio:.0%} of "
                             f"the {link_gbps:g} Gbit/s link (at least {min_link_fraction:.0%} required)"))
    socket_inter = peak_busbw(socket.get("rows", []), "inter") if socket else None
    if used != "efa" or inter is None or socket_inter is None:
        checks.append(_check("efa_faster", None, f"NCCL run on {used!r}" if used != "efa"
                             else "no inter-node figure of both runs"))
    else:
        figures["efa_over_socket"] = inter / socket_inter if socket_inter else None
        checks.append(_check("efa_faster", inter > socket_inter,
                             f"EFA {inter:.2f} GB/s vs sockets {socket_inter:.2f} GB/s inter-node all-reduce busbw"))
    if require_transport != "any":
        checks.append(_check("transport", used == require_transport,
                             f"NCCL run's transport {used!r} (required {require_transport!r})"))
    if socket is not None and inter is not None and used == "efa":
        problem = forced_socket_problem(socket.get("evidence") or {})
        checks.append(_check("socket_run", problem is None, f"the forced run: {problem}" if problem
                             else "the forced run was on NCCL's Socket transport on every rank"))
    verdict = REJECTED if any(c["ok"] is False for c in checks) else ACCEPTED
    return {"verdict": verdict, "exit_code": EXIT_CODES[verdict], "checks": checks, "figures": figures}


def headline(judged: dict[str, Any]) -> str:
    """One line: the verdict and its failed checks (or the figure that passed)."""
    failed = [c["detail"] for c in judged["checks"] if c["ok"] is False]
    return f"{judged['verdict'].upper()}" + (": " + "; ".join(failed) if failed else "")


def table(record: dict[str, Any]) -> str:
    """One line per (scope, collective, size): busbw in GB/s of each mode, and their ratio."""
    modes = list(record["modes"])
    cells: dict[tuple[str, str, int], dict[str, float]] = {}
    for mode, result in record["modes"].items():
        for row in result["rows"]:
            cells.setdefault((row["scope"], row["collective"], row["bytes"]), {})[mode] = row["busbw_gbs"]
    head = f"{'scope':<6} {'collective':<15} {'bytes':>11} " + " ".join(f"{m + ' GB/s':>12}" for m in modes)
    lines = [head + ("  ratio" if len(modes) == 2 else "")]
    for (scope, collective, size), by_mode in cells.items():
        values = [by_mode.get(m) for m in modes]
        text = " ".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
        ratio = f"  {values[0] / values[1]:.2f}" if len(values) == 2 and values[0] and values[1] else ""
        lines.append(f"{scope:<6} {collective:<15} {size:>11} {text}{ratio}")
    transports = ", ".join(f"{m}: {r['evidence'].get('transport')}" for m, r in record["modes"].items())
    lines.append(f"transport: {transports}")
    return "\n".join(lines)

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
    from training.transport import TransportError

    out = measure(job)
    print(table(out), flush=True)
    print("netcheck: " + headline(out["verdict"]), flush=True)
    if out["verdict"]["verdict"] != ACCEPTED:
        raise TransportError(f"netcheck {headline(out['verdict'])} ({out['uri']})")
    return {key: out["verdict"][key] for key in ("verdict", "figures")} | {"uri": out["uri"]}
