"""Which network did NCCL really use between nodes? Evidence from its INFO log, and a gate.

Standard library only (runs in the DLC worker). The AWS sample's only proof of EFA is a grep of
the Ray logs; a silent fall-back to TCP sockets halves throughput and nothing fails. Here every
rank classifies its own NCCL log, the run record keeps the evidence, and ``require_transport``
turns a wrong transport into a failed run within the first collective.

Classes (:data:`TRANSPORTS`):

``efa``          inter-node traffic over libfabric's EFA provider (aws-ofi-nccl)
``socket``       inter-node traffic over TCP: NCCL's Socket transport, or libfabric's
                 ``sockets``/``tcp`` provider, or gloo (the CPU backend, always TCP)
``single-node``  every communicator of the rank spans one node (P2P/SHM only; no network used)
``unknown``      no decisive line (NCCL_DEBUG not INFO, log not found, no collective yet)

What counts, most decisive first (matched anywhere in a line, case-insensitive, so CloudWatch or
Ray prefixes do not matter):

1. channel lines of a connected communicator: ``... via NET/Socket/0`` -> socket;
   ``... via NET/Libfabric/0`` or ``via NET/AWS Libfabric/0`` -> efa, unless aws-ofi-nccl
   selected libfabric's ``tcp``/``sockets`` provider (then socket). Socket wins a conflict.
2. ``comm 0x.. rank R nRanks N nNodes M ...``: ``M == 1`` for every communicator -> single-node.
3. ``Using network Socket`` / ``NET/OFI Selected provider is sockets|tcp`` -> socket;
   ``Using network Libfabric|AWS Libfabric|EFA`` / ``Selected provider is efa`` -> efa.
   The bare ``NET/Socket : Using [0]eth0:...`` init line is NOT evidence: older NCCLs initialise
   every network at start-up and print it on EFA hosts too.

In the worker loop: :func:`prepare_nccl_logging` (creates the folder, sets NCCL_DEBUG*) before
NCCL's first collective (torch creates communicators lazily), then, after the process group
exists, ONE call on every rank: :func:`collect_evidence` runs a collective, classifies this
rank's file, gathers every rank's class, and :class:`TransportGate` refuses a wrong transport.
The loop turns a refusal into a recorded, terminal end of the run (a retry cannot change it).

``NCCL_DEBUG_FILE`` takes ``%h`` (host) and ``%p`` (pid), so each process writes its own file and
the lines no longer reach stderr (the DLC's ``NCCL_DEBUG=INFO`` would otherwise flood the Ray
logs). On CPU (gloo) there are no NCCL lines: use :func:`non_nccl_evidence`.

Where NCCL writes its INFO log: one folder and file name every rank uses, and the environment
that points NCCL there. NCCL opens ``NCCL_DEBUG_FILE`` at its first collective; if the folder does
not exist it silently logs to stdout instead, and the rank has no evidence of its transport. So
the folder is created first (:func:`prepare_nccl_logging`), and a missing file is explained
(:func:`missing_log_cause`).
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from training.config import JobConfig

LOG_NAME = "nccl.%h.%p.log"
NCCL_LOG_DIR = "/tmp/raytrain-nccl"
"""Node-local folder for NCCL's INFO log. NCCL does not create it: when NCCL_DEBUG_FILE cannot be
opened it silently logs to stdout, so :func:`prepare_nccl_logging` creates it first."""


def nccl_debug_env(log_dir: str, environ: dict | None = None) -> dict[str, str]:
    """Environment that makes NCCL log the transport into ``log_dir/nccl.<host>.<pid>.log``.

    Keeps a user's own NCCL_DEBUG/NCCL_DEBUG_SUBSYS when set (WARN would hide the evidence, so
    it is raised to INFO). ``log_dir`` must be node-local and writable (e.g. :data:`NCCL_LOG_DIR`).
    """
    environ = os.environ if environ is None else environ
    level = environ.get("NCCL_DEBUG", "").upper()
    return {
        "NCCL_DEBUG": level if level in ("INFO", "TRACE") else "INFO",
        "NCCL_DEBUG_SUBSYS": environ.get("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        "NCCL_DEBUG_FILE": os.path.join(log_dir, LOG_NAME),
    }


def prepare_nccl_logging(log_dir: str, environ: dict | None = None) -> dict[str, str]:
    """Create ``log_dir`` and point NCCL's INFO log into it; call before NCCL's first collective.

    Updates ``environ`` (default ``os.environ``) and returns the variables set. The folder must
    exist before NCCL opens the file, or NCCL writes to stdout and the rank has no evidence.
    """
    environ = os.environ if environ is None else environ
    os.makedirs(log_dir, exist_ok=True)
    env = nccl_debug_env(log_dir, environ)
    environ.update(env)
    return env


def prepare_worker(on_gpu: bool, environ: dict | None = None) -> str | None:
    """A worker's first act, before ANY collective of the process: on GPU, point NCCL's log into
    :data:`NCCL_LOG_DIR`; on any backend, create the folder ``NCCL_DEBUG_FILE`` names (the
    driver sets it from the worker's start, :func:`nccl_debug_env`). Returns that folder (None
    when NCCL_DEBUG_FILE is unset).

    NCCL opens its debug file once, in its lazy initialisation at the process's first collective
    (NVIDIA/nccl, src/debug.cc ``ncclDebugInit``: ``fopen`` of NCCL_DEBUG_FILE, stdout when that
    fails); the process group's creation is not one (torch creates communicators lazily). A
    collective before this call would leave the rank without its log for the whole process."""
    environ = os.environ if environ is None else environ
    if on_gpu:
        prepare_nccl_logging(NCCL_LOG_DIR, environ)
    target = environ.get("NCCL_DEBUG_FILE", "")
    folder = os.path.dirname(target)
    if folder:
        os.makedirs(folder, exist_ok=True)
    return folder or None


def missing_log_cause(log_dir: str, environ: dict | None = None) -> str:
    """Why this process has no NCCL debug file in ``log_dir``: the likely cause, in one line."""
    environ = os.environ if environ is None else environ
    level = environ.get("NCCL_DEBUG", "").upper()
    target = environ.get("NCCL_DEBUG_FILE", "")
    if level not in ("INFO", "TRACE"):
        hint = f"NCCL_DEBUG is {level or 'unset'}: set NCCL_DEBUG=INFO so the transport can be proven"
    elif not os.path.isdir(log_dir):
        hint = f"folder {log_dir} does not exist, so NCCL logged to stdout instead of {target}"
    elif not os.access(log_dir, os.W_OK):
        hint = f"folder {log_dir} is not writable, so NCCL logged to stdout instead of {target}"
    elif target and os.path.dirname(target) != log_dir.rstrip("/"):
        hint = f"NCCL_DEBUG_FILE={target} points outside {log_dir}"
    else:
        hint = (f"NCCL_DEBUG={level} and NCCL_DEBUG_FILE={target or '(unset)'} but NCCL wrote no file for pid "
                f"{os.getpid()}: was NCCL initialised before these variables were set?")
    return hint


def own_nccl_log(log_dir: str, pid: int | None = None) -> str | None:
    """This process's NCCL debug file in ``log_dir`` (NCCL expands %h to the short host name)."""
    matches = sorted(glob.glob(os.path.join(log_dir, f"nccl.*.{pid or os.getpid()}.log")))
    return matches[-1] if matches else None


TRANSPORTS = ("efa", "socket", "single-node", "unknown")

_CHANNEL_NET = re.compile(r"\bvia NET/([A-Za-z ]+?)/\d", re.IGNORECASE)
_CHANNEL_LOCAL = re.compile(r"\bvia (P2P|SHM|NVLS|CollNet)/", re.IGNORECASE)
_COMM = re.compile(r"\bcomm 0x[0-9a-f]+ rank (\d+) nRanks (\d+) nNodes (\d+)", re.IGNORECASE)
_USING_NETWORK = re.compile(r"\bUsing network ([A-Za-z ]+?)\s*$", re.IGNORECASE)
_PROVIDER = re.compile(r"NET/OFI Selected provider is (\w+)", re.IGNORECASE)
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl ([\w.\-]+)", re.IGNORECASE)
_NCCL_VERSION = re.compile(r"\bNCCL version ([\w.+\-]+)")
_HOST = re.compile(r"^(?:.*?\s)?([A-Za-z0-9][\w.\-]*):\d+:\d+ \[\d+\] NCCL INFO")

_EFA_NETS = ("libfabric", "aws libfabric", "efa", "ofi")
_SOCKET_NETS = ("socket",)
_SOCKET_PROVIDERS = ("sockets", "tcp", "udp")


class TransportError(RuntimeError):
    """The run saw a transport other than the one its job config requires (one-line message)."""


@dataclass(kw_only=True, slots=True)
class RankTransport:
    """One process's (rank's) classification and the lines that decided it."""

    transport: str = "unknown"
    reason: str = "no NCCL INFO lines"
    host: str = ""
    rank: int | None = None
    num_nodes: int | None = None
    """Largest ``nNodes`` of this rank's communicators."""
    network: str = ""
    """NCCL's network as logged (``Libfabric``, ``Socket``, ``IB``) or the backend (``gloo``)."""
    provider: str = ""
    """libfabric provider chosen by aws-ofi-nccl (``efa``, ``tcp``, ...)."""
    nccl_version: str = ""
    ofi_nccl_version: str = ""
    evidence: list[str] = field(default_factory=list)
    """Up to a few verbatim log lines that decided the class."""
    hint: str = ""
    """What to check when the class is ``unknown`` (set where the cause is known)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RankTransport":
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})


def classify_lines(lines: Iterable[str]) -> RankTransport:
    """Classify one rank's NCCL INFO output (see the module docstring for the rules)."""
    out = RankTransport()
    net_channels: dict[str, str] = {}   # "efa"/"socket" -> first line
    local_channel = ""
    nodes: list[int] = []
    announced: dict[str, str] = {}       # from "Using network" / provider lines
    saw_info = False
    for raw in lines:
        line = raw.rstrip("\n")
        if "NCCL" not in line and "via " not in line:
            continue
        saw_info = saw_info or "NCCL INFO" in line
        if not out.host and (m := _HOST.search(line)):
            out.host = m.group(1)
        if m := _NCCL_VERSION.search(line):
            out.nccl_version = out.nccl_version or m.group(1)
        if m := _OFI_VERSION.search(line):
            out.ofi_nccl_version = m.group(1)
        if m := _CHANNEL_NET.search(line):
            kind = _net_kind(m.group(1))
            if kind:
                net_channels.setdefault(kind, line.strip())
            continue
        if _CHANNEL_LOCAL.search(line):
            local_channel = local_channel or line.strip()
            continue
        if m := _COMM.search(line):
            nodes.append(int(m.group(3)))
            if out.rank is None:
                out.rank = int(m.group(1))
            continue
        if m := _USING_NETWORK.search(line):
            out.network = m.group(1).strip()
            kind = _net_kind(out.network)
            if kind:
                announced.setdefault(kind, line.strip())
            continue
        if m := _PROVIDER.search(line):
            out.provider = m.group(1).lower()
            kind = "efa" if out.provider == "efa" else "socket" if out.provider in _SOCKET_PROVIDERS else ""
            if kind:
                announced.setdefault(kind, line.strip())
    out.num_nodes = max(nodes) if nodes else None
    if "socket" in net_channels:
        return _decide(out, "socket", "an inter-node channel uses NET/Socket", net_channels["socket"])
    if "efa" in net_channels and out.provider in _SOCKET_PROVIDERS:
        return _decide(out, "socket", f"NET/Libfabric channels run on the {out.provider!r} provider, not efa",
                       announced.get("socket", net_channels["efa"]))
    if "efa" in net_channels:
        return _decide(out, "efa", "inter-node channels use NET/Libfabric (EFA)", net_channels["efa"])
    if nodes and out.num_nodes == 1:
        why = "every communicator has nNodes 1" + (" (P2P/SHM channels)" if local_channel else "")
        return _decide(out, "single-node", why, local_channel)
    if "socket" in announced:
        return _decide(out, "socket", "NCCL announced the Socket network / a TCP provider", announced["socket"])
    if "efa" in announced:
        return _decide(out, "efa", "NCCL announced libfabric with the EFA provider", announced["efa"])
    if local_channel:
        return _decide(out, "single-node", "only P2P/SHM channels, no network channel", local_channel)
    if out.network:
        out.reason = f"network {out.network!r} is neither EFA nor Socket"
    elif not saw_info:
        out.hint = "the log holds no NCCL INFO line: NCCL_DEBUG was not INFO when NCCL started; set NCCL_DEBUG=INFO"
    return out


def _net_kind(name: str) -> str:
    name = name.strip().lower()
    if name in _SOCKET_NETS:
        return "socket"
    if name in _EFA_NETS:
        return "efa"
    return ""


def _decide(out: RankTransport, transport: str, reason: str, line: str) -> RankTransport:
    out.transport, out.reason = transport, reason
    if line:
        out.evidence.append(line[-300:])
    return out


def classify_file(path: str | None) -> RankTransport:
    """Classify one NCCL debug file; ``unknown`` (with the reason) if it is missing."""
    if not path or not os.path.exists(path):
        return RankTransport(reason=f"NCCL debug file not found: {path or '(none)'}")
    with open(path, encoding="utf-8", errors="replace") as handle:
        return classify_lines(handle)


def missing_log_evidence(log_dir: str, environ: dict | None = None) -> RankTransport:
    """``unknown`` for a rank whose NCCL debug file is absent, with the likely cause."""
    return RankTransport(reason=f"no NCCL debug file for this process in {log_dir}",
                         hint=missing_log_cause(log_dir, environ))


def non_nccl_evidence(backend: str, num_nodes: int, host: str = "", rank: int | None = None) -> RankTransport:
    """Evidence for a backend that logs nothing (gloo on CPU): it is TCP whenever it crosses nodes."""
    if num_nodes <= 1:
        return RankTransport(transport="single-node", reason=f"{backend} backend on one node",
                             host=host, rank=rank, num_nodes=num_nodes, network=backend)
    return RankTransport(transport="socket", reason=f"{backend} backend across {num_nodes} nodes is TCP",
                         host=host, rank=rank, num_nodes=num_nodes, network=backend)


def aggregate(ranks: list[RankTransport]) -> dict:
    """The run's transport evidence: one class for the run plus every rank's classification.

    The run's class is the single class all ranks agree on; when ranks disagree the worst wins
    (socket > unknown > single-node > efa), because one slow link paces every collective.
    """
    worst_first = ("socket", "unknown", "single-node", "efa")
    seen = {r.transport for r in ranks}
    overall = next((t for t in worst_first if t in seen), "unknown")
    return {
        "transport": overall,
        "consistent": len(seen) == 1,
        "counts": {t: sum(r.transport == t for r in ranks) for t in TRANSPORTS if t in seen},
        "ranks": [r.to_dict() for r in sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0))],
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class TransportGate:
    """Fails a run whose transport is not the required one (``evidence.require_transport``)."""

    require: str = "any"
    """``any`` (never fails), ``efa``, ``socket`` or ``single-node``."""

    def __post_init__(self) -> None:
        if self.require not in ("any",) + TRANSPORTS[:-1]:
            raise ValueError(f"evidence.require_transport: {self.require!r} is not allowed "
                             f"(allowed: any, {', '.join(TRANSPORTS[:-1])})")

    def violations(self, evidence: dict) -> list[dict]:
        if self.require == "any":
            return []
        return [r for r in evidence.get("ranks", []) if r.get("transport") != self.require] or (
            [] if evidence.get("ranks") else [{"transport": "unknown", "reason": "no rank reported evidence"}])

    def check(self, evidence: dict) -> None:
        """Raise :class:`TransportError` naming the first offending rank and its deciding line."""
        bad = self.violations(evidence)
        if not bad:
            return
        first = bad[0]
        where = f"rank {first.get('rank')} on {first.get('host') or '?'}" if first.get("rank") is not None else "a rank"
        line = f"; line: {first['evidence'][0]!r}" if first.get("evidence") else ""
        hint = (f" ({first['hint']})" if first.get("hint")
                else " (NCCL logged no transport line: was there a collective?)" if first.get("transport") == "unknown"
                else " (check the EFA device plugin, vpc.amazonaws.com/efa limits, FI_PROVIDER=efa)"
                if self.require == "efa" else "")
        raise TransportError(
            f"evidence.require_transport = {self.require!r} but {len(bad)} of "
            f"{len(evidence.get('ranks', [])) or 1} ranks saw {first.get('transport')!r}: "
            f"{where}: {first.get('reason')}{line}{hint}")

    def problem(self, evidence: dict) -> str | None:
        """The one-line refusal :meth:`check` would raise, or None."""
        try:
            self.check(evidence)
        except TransportError as err:
            return str(err)
        return None


def _first_nccl_collective() -> None:
    """The first collective creates the communicator and connects its channels; only then are
    the ``via NET/...`` lines written."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1, device=torch.device("cuda", torch.cuda.current_device())))
    torch.cuda.synchronize()


def uses_nccl(backend: str) -> bool:
    """Whether a process group's backend string puts GPU tensors on NCCL: ``nccl``, or a
    ``device:backend`` list naming ``cuda:nccl`` (``parallel.cpu_offload``'s ``cpu:gloo,cuda:nccl``;
    torch 2.13 ``dist.get_backend()`` returns the string as given). Ray 2.58's own test is
    ``train/torch/config.py`` ``_is_backend_nccl``."""
    return backend == "nccl" or "cuda:nccl" in backend.split(",")


def collect_evidence(*, require: str, log_dir: str | None, num_nodes: int, enforce: bool = True,
                     backend: str | None = None, connect: Callable[[], None] = _first_nccl_collective) -> dict:
    """Every rank: force NCCL's connections with one all-reduce, classify this rank's log, gather
    all ranks' classifications, apply the gate. Returns the aggregate (the same on every rank).

    Needs an initialised ``torch.distributed`` default process group; ``log_dir`` is where
    :func:`prepare_nccl_logging` pointed ``NCCL_DEBUG_FILE`` (None: no file, the class is
    unknown). ``enforce=False`` leaves the gate to the caller (:meth:`TransportGate.problem`).
    ``backend``/``connect`` replace the process group's backend and the CUDA collective (tests).
    """
    import socket

    import torch.distributed as dist

    backend = backend or str(dist.get_backend())
    if uses_nccl(backend):
        connect()
        if not log_dir:
            mine = RankTransport(reason="no NCCL debug file configured")
        else:
            found = own_nccl_log(log_dir)
            mine = classify_file(found) if found else missing_log_evidence(log_dir)
    else:
        mine = non_nccl_evidence(backend, num_nodes)
    mine.rank, mine.host = dist.get_rank(), socket.gethostname()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine.to_dict())
    evidence = aggregate([RankTransport.from_dict(d) for d in gathered])
    if enforce:
        TransportGate(require=require).check(evidence)
    return evidence


def hosts_from_evidence(evidence: dict) -> dict[str, str]:
    """``{"0": host, "1": host, ...}`` for the run record."""
    return {str(r["rank"]): r.get("host", "") for r in evidence.get("ranks", []) if r.get("rank") is not None}


def transport_evidence(job: JobConfig, on_gpu: bool) -> tuple[dict, str | None]:
    """The run's transport evidence and, when the gate refuses it, the one-line reason."""
    evidence = collect_evidence(require=job.evidence.require_transport, log_dir=NCCL_LOG_DIR if on_gpu else None,
                                num_nodes=job.num_nodes, enforce=False)
    return evidence, TransportGate(require=job.evidence.require_transport).problem(evidence)
