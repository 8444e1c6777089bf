"""The health gate: at every attempt's start, before its model build, each worker proves its node's
GPUs (a timed bf16 GEMM against the GPU's peak, nvidia-smi's ECC and row-remap state). A node that
fails is reported to the run's board (training/watchdog.py: a ``health_gate`` incident in
run.json), drained out of the next attempt, and the worker raises :class:`GateFailed` so Ray Train
restarts the group without it (docs/recovery.md).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from training import contract

log = logging.getLogger(__name__)


GEMM_SIZE = 4096
"""The burn-in's square bf16 GEMM: the size the published L4 rate is measured at (54.9 TFLOP/s,
45 % of the L4's 121 peak: zzc0721/torch-performance-test-data issue 120, the figure the
preflight's step model uses), large enough to reach the GPU's steady rate, small enough (3 x 32
MiB) to fit beside any model."""
GEMM_WARMUP = 5
GEMM_ITERS = 50
"""Timed GEMMs: 50 x 137 GFLOP = 6.9 TFLOP, about 0.13 s on a healthy L4 at 54.9 TFLOP/s."""
GEMM_MIN_PEAK_FRACTION = 0.25
"""The gate's bound: the GEMM must reach a quarter of the GPU's peak (the manifest's
:data:`contract.ENV_PEAK_TFLOPS`). A healthy L4 reaches 45 % of it at this size (above), so the
bound fails a GPU at about half its calibrated rate or slower (clocks held down by a power or
thermal cap, a GPU that throttles after an XID, a degraded card), and never a healthy one on
noise (the same GEMM's spread across sizes on one L4 is 54-71 TFLOP/s)."""
NVIDIA_SMI_GPUS = ("index", "uuid", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
"""``nvidia-smi --query-gpu`` fields (``nvidia-smi --help-query-gpu``): uncorrectable ECC errors
since the driver loaded, and a page retirement waiting for a reset (pre-Ampere GPUs; ``[N/A]``
on an L4, which remaps rows instead)."""
NVIDIA_SMI_REMAPPED = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure")
"""``nvidia-smi --query-remapped-rows`` fields (Ampere and later, the L4 included): a row remap
waiting for a GPU reset, and a remap that failed (no spare rows left: the GPU needs replacing)."""
NVIDIA_SMI_TIMEOUT_S = 20.0
"""nvidia-smi answers in well under a second; one that hangs is itself the finding (a GPU that fell
off the bus makes it hang or fail)."""


DRAIN_DEADLINE_MS = 1000
"""The drain's deadline: Ray Train's controller treats a drain of a node holding its workers as a
preemption and, while no other error explains the failure, keeps the group until the deadline
(ray 2.58 ``controller.py`` ``_is_preemption_deadline_exceeded``: 120 s for a drain without one).
Nothing is to be saved on a node that failed its gate before the attempt's first step, so the
group is restarted at once."""


class GateFailed(RuntimeError):
    """This worker's node failed the health gate; it was named in run.json and kept out."""


def gemm_tflops(device: Any) -> float:
    """GPU only: the measured rate of :data:`GEMM_ITERS` square bf16 GEMMs on ``device``."""
    import torch

    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16)
    for _ in range(GEMM_WARMUP):
        torch.matmul(a, b)
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(GEMM_ITERS):
        torch.matmul(a, b)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    del a, b
    return 2 * GEMM_SIZE ** 3 * GEMM_ITERS / seconds / 1e12


def nvidia_smi(query: str, fields: tuple[str, ...]) -> str:
    """GPU only: nvidia-smi's CSV answer (no header, no units); raises when it fails or hangs."""
    import subprocess

    done = subprocess.run(["nvidia-smi", f"--{query}={','.join(fields)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:200]
        raise RuntimeError(f"nvidia-smi --{query} exited {done.returncode}: {said}")
    return done.stdout


def device_readings(on_gpu: bool, device: Any) -> dict[str, Any] | None:
    """The gate's two device calls: the timed GEMM and nvidia-smi's two queries. None on a CPU
    worker (no GPU to prove), unless :data:`contract.ENV_GATE_DEVICE` names a file of readings
    for this node (tests: everything after the reading runs as on a GPU). A device call that
    fails is itself a reading (``error``): a GPU that fell off the bus fails nvidia-smi."""
    import json

    injected = os.environ.get(contract.ENV_GATE_DEVICE, "")
    if injected:
        with open(injected, encoding="utf-8") as handle:
            return {"gemm_tflops": None, "gpus": "", "remapped_rows": "", **json.load(handle), "injected": injected}
    if not on_gpu:
        return None
    out: dict[str, Any] = {"gemm_tflops": None, "gpus": "", "remapped_rows": ""}
    try:
        out["gpus"] = nvidia_smi("query-gpu", NVIDIA_SMI_GPUS)
        out["remapped_rows"] = nvidia_smi("query-remapped-rows", NVIDIA_SMI_REMAPPED)
    except FileNotFoundError:
        # No nvidia-smi in the container (the NVIDIA container toolkit mounts it only with the
        # driver capability ``utility``): the image's property, not the node's. Were it a
        # finding, every node would be drained in turn.
        out["unchecked"] = "nvidia-smi not found: ECC and row remapping not checked"
        log.warning("health gate: %s", out["unchecked"])
    except Exception as err:  # noqa: BLE001 - nvidia-smi failing or hanging on this node is the reading
        out["error"] = f"{type(err).__name__}: {str(err)[:200]}"
    try:
        out["gemm_tflops"] = gemm_tflops(device)
    except Exception as err:  # noqa: BLE001 - a GPU that cannot run a GEMM is the reading
        out["error"] = "; ".join(filter(None, [out.get("error"), f"{type(err).__name__}: {str(err)[:200]}"]))
    return out


def _csv_rows(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows = []
    for line in (text or "").strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values)))
    return rows


def judge_gate(readings: dict[str, Any] | None, peak_tflops: float | None) -> list[str]:
    """What failed, one phrase each with its figure and bound ([] = the node passed). A reading
    nvidia-smi does not support (``[N/A]``, ``[Not Supported]``) is no finding; no peak known
    (CPU, an unknown GPU) leaves the GEMM unjudged."""
    if readings is None:
        return []
    failed = []
    if readings.get("error"):
        failed.append(f"device check failed: {readings['error']}")
    rate = readings.get("gemm_tflops")
    if rate is not None and peak_tflops:
        bound = GEMM_MIN_PEAK_FRACTION * peak_tflops
        if rate < bound:
            failed.append(f"bf16 GEMM {GEMM_SIZE}^3 at {rate:.1f} TFLOP/s < bound {bound:.1f} "
                          f"({GEMM_MIN_PEAK_FRACTION:g} x peak {peak_tflops:g})")
    for gpu in _csv_rows(readings.get("gpus", ""), NVIDIA_SMI_GPUS):
        errors = gpu["ecc.errors.uncorrected.volatile.total"]
        if errors.isdigit() and int(errors) > 0:
            failed.append(f"GPU {gpu['index']}: {errors} uncorrectable ECC errors since the driver loaded (bound 0)")
        if gpu["retired_pages.pending"].lower() == "yes":
            failed.append(f"GPU {gpu['index']}: a retired page waits for a GPU reset")
    for gpu in _csv_rows(readings.get("remapped_rows", ""), NVIDIA_SMI_REMAPPED):
        if gpu["remapped_rows.failure"].lower() == "yes":
            failed.append(f"GPU {gpu['gpu_uuid']}: a row remap failed (no spare rows: replace the GPU)")
        elif gpu["remapped_rows.pending"].lower() == "yes":
            failed.append(f"GPU {gpu['gpu_uuid']}: a row remap waits for a GPU reset")
    return failed


def keep_node_out(reason: str) -> str:
    """Drain this worker's own Ray node through the GCS (the DrainNode call ``ray drain-node`` and
    autoscaler v2 make, ray 2.58 ``scripts/scripts.py`` ``drain_node``): Ray schedules nothing new
    on a draining node and its raylet exits once idle (``_private/ray_constants.py``), so the next
    attempt's workers are placed elsewhere; KubeRay's autoscaler v2 turns a draining node into one
    to stop (``autoscaler/v2/instance_manager/reconciler.py``: ``DRAINING`` -> ``RAY_STOPPING``)
    and starts a replacement for the pending workers. Reason
    PREEMPTION: the reason for a busy node (IDLE_TERMINATION is the autoscaler's for idle ones);
    its deadline is :data:`DRAIN_DEADLINE_MS` away.
    Needs nothing beyond the Ray cluster's own access (no Kubernetes permission). Returns how it
    went, for the record."""
    try:
        import ray
        from ray.core.generated import autoscaler_pb2

        if not ray.is_initialized():
            return "not kept out: not in a Ray cluster"
        ctx = ray.get_runtime_context()
        gcs = ray._raylet.GcsClient(address=ctx.gcs_address)
        accepted, why = gcs.drain_node(ctx.get_node_id(),
                                       autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                       f"raytrain-eks health gate: {reason}"[:500],
                                       int(time.time() * 1000 + DRAIN_DEADLINE_MS))
    except Exception as err:  # noqa: BLE001 - the record says it could not; Ray may place it there again
        return f"not kept out: drain failed ({type(err).__name__}: {str(err)[:160]})"
    return "kept out of the next attempt (Ray node drained)" if accepted else f"not kept out: drain refused ({why})"


def check(progress: Any, *, on_gpu: bool, device: Any, device_name: str = "") -> float:
    """Every worker, at every attempt's start (before its model build): read the GPU, judge it;
    ``progress`` is the rank's :class:`training.watchdog.Progress` (its line to the run's board);
    on a failure report it to the run's board (run.json's incident), drain this node and raise
    :class:`GateFailed` (Ray Train restarts the group, without this node). Returns the seconds
    the gate took."""
    from training.metrics import peak_tflops_from_env

    began = time.monotonic()
    readings = device_readings(on_gpu, device)
    failed = judge_gate(readings, peak_tflops_from_env(os.environ, device_name))
    seconds = time.monotonic() - began
    if not failed:
        if readings is not None:
            log.info("health gate passed in %.1f s: GEMM %s TFLOP/s", seconds, readings.get("gemm_tflops"))
        return seconds
    node = os.environ.get(contract.ENV_NODE_NAME) or socket.gethostname()
    what = "; ".join(failed)
    kept = keep_node_out(what)
    progress.gate_failed({"node": node, "failed": failed, "kept_out": kept, "seconds": round(seconds, 2)})
    raise GateFailed(f"health gate: node {node} failed: {what}; {kept}")
