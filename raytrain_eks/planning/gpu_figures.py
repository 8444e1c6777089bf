"""The rates the step-time model (:mod:`raytrain_eks.planning.step_model`) works with, each with its
source: published figures, assumptions named as such, and the measurements of ``make gpu-check``
(``bench/gpu_check.py`` writes :data:`CALIBRATION` on a machine with a GPU) that replace them.

Every rate is a range ``(low, high)``; a measured rate is one value (``low == high``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from environment.instances import GPU_PEAK_BF16_TFLOPS

CALIBRATION = Path(__file__).resolve().parent / "gpu_calibration.json"
"""Written by ``make gpu-check`` on a GPU machine; read by the preflight when present."""

L4_GEMM_TFLOPS: dict[int, float] = {1024: 54.4, 2048: 70.9, 4096: 54.9, 8192: 59.4}
"""Square bf16 GEMM rate on one L4 by size (torch 2.9, cu128): zzc0721/torch-performance-test-data
issue 120 (45-59 % of the 121 TFLOP/s dense peak)."""
L4_GEMM_SOURCE = "published: L4 bf16 square GEMM, zzc0721/torch-performance-test-data issue 120"
L4_MEMORY_GBYTES_PER_S = 300.0
"""NVIDIA L4 datasheet: 300 GB/s GDDR6."""
HOST_ADAMW_MS_PER_MILLION = {"fused": (3.35, 7.01), "foreach": (24.54, 33.65)}
"""One host thread's ``torch.optim.AdamW.step`` per million fp32 parameters (min-max of 5 steps
of 16 M parameters), torch 2.13 on this project's 2-core development machine under load:
``bench/bench_host_adamw.py``. Offload plans step AdamW on the host (parallel.cpu_offload)."""
HOST_ADAMW_SOURCE = "measured: bench/bench_host_adamw.py, 1 thread of the development machine (not the GPU host)"


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate as a range, where it comes from, and whether it is an assumption."""

    low: float
    high: float
    unit: str
    source: str
    assumed: bool = False

    def text(self) -> str:
        value = f"{self.low:g}" if self.low == self.high else f"{self.low:g}-{self.high:g}"
        return f"{value} {self.unit} ({'ASSUMED: ' if self.assumed else ''}{self.source})"


@dataclass(frozen=True, slots=True)
class Figures:
    """Every rate of one GPU type the step-time model needs."""

    gpu: str
    peak_tflops: float
    gemm_tflops: dict[tuple[int, int, int], float]
    """GEMM shape ``(m, n, k)`` -> bf16 TFLOP/s (keyed by shape: transposed shapes of one volume,
    a projection's forward and its two gradients, run at different rates)."""
    gemm: Rate
    """The table's spread and source (its low/high are the table's extremes)."""
    memory: Rate
    """Bytes moved per second by element-wise kernels, GB/s."""
    kernel_floor_us: Rate
    """The shortest a kernel runs, µs (small element-wise kernels are launch-bound)."""
    pcie: Rate
    """Ring bandwidth per GPU inside a node, GB/s."""
    efa: Rate
    """Bandwidth of a node's network link for NCCL, GB/s."""
    measured_step: dict | None = None
    """One step of the shipped per-GPU shape as ``make gpu-check`` measured it (None before, or
    when its profile run failed)."""
    calibrated: bool = False
    """``make gpu-check``'s measurements replaced the published GEMM and memory rates (with or
    without a measured step)."""
    host_adamw: dict = None
    """Kernel -> (low, high) ms per million parameters on ONE host thread
    (:data:`HOST_ADAMW_MS_PER_MILLION`, or ``make gpu-check``'s on the GPU host)."""
    host_adamw_source: str = HOST_ADAMW_SOURCE
    compiled_block_ratio: float | None = None
    """A compiled decoder block's time over the eager one's, measured by ``make gpu-check`` on
    this GPU type; None: unmeasured (the plan search then never picks ``parallel.compile``)."""

    def host_adamw_rate(self, threads: int, fused: bool = True) -> tuple[float, float]:
        """(fast, slow) ms per million parameters of AdamW on ``threads`` host threads: the fast
        end divides one thread's best by the threads (the fused CPU kernel splits the tensors
        over OpenMP threads), the slow end is one thread's worst (no scaling: ASSUMED until a GPU
        host measures its pod's thread count)."""
        low, high = (self.host_adamw or HOST_ADAMW_MS_PER_MILLION)["fused" if fused else "foreach"]
        return low / max(1, threads), high

    def gemm_rate(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(low, high) TFLOP/s of an ``(m, k) @ (k, n)`` GEMM: a measured shape's own rate;
        otherwise the spread of the table entries of the two cube-root sizes that bracket its own
        (every entry of a size: shapes of one volume differ), clamped at the table's ends; below
        the smallest size the rate falls in proportion to the size (an assumption: such GEMMs
        cannot fill the GPU)."""
        volume = m * n * k  # sizes compared by volume: exact integers
        by_volume: dict[int, list[float]] = {}
        for (a, b, c), rate in self.gemm_tflops.items():
            by_volume.setdefault(a * b * c, []).append(rate)
        volumes = sorted(by_volume)
        scale = min(1.0, (volume / volumes[0]) ** (1 / 3))
        if (m, n, k) in self.gemm_tflops:
            return self.gemm_tflops[(m, n, k)] * scale, self.gemm_tflops[(m, n, k)] * scale
        below = [v for v in volumes if v <= volume] or volumes[:1]
        above = [v for v in volumes if v >= volume] or volumes[-1:]
        rates = by_volume[below[-1]] + by_volume[above[0]]
        return min(rates) * scale, max(rates) * scale

    def assumed(self) -> list[str]:
        """Names of the rates that are assumptions, not published or measured figures."""
        return [name for name in ("gemm", "memory", "kernel_floor_us", "pcie", "efa") if getattr(self, name).assumed]

    def sources(self) -> dict[str, str]:
        return {name: getattr(self, name).text() for name in ("gemm", "memory", "kernel_floor_us", "pcie", "efa")}


def published(gpu: str, network_gbps: float) -> Figures:
    """The figures before any measurement on this GPU type. For a GPU other than the L4 the L4's
    GEMM efficiency (its rate over its peak) is applied to that GPU's peak: an assumption."""
    peak = GPU_PEAK_BF16_TFLOPS.get(gpu, 0.0)
    l4 = GPU_PEAK_BF16_TFLOPS["L4"]
    table = {(s, s, s): r * peak / l4 for s, r in L4_GEMM_TFLOPS.items()}
    gemm = Rate(min(table.values()), max(table.values()), "TFLOP/s",
                L4_GEMM_SOURCE + "; applied to other shapes by their cube-root size (assumed)" if gpu == "L4"
                else f"the L4's GEMM efficiency on the {gpu}'s peak", assumed=True)
    memory = (Rate(0.8 * L4_MEMORY_GBYTES_PER_S, L4_MEMORY_GBYTES_PER_S, "GB/s",
                   "L4 datasheet 300 GB/s; the low end assumes 80 % of it is reached", assumed=True)
              if gpu == "L4" else Rate(0.0, 0.0, "GB/s", f"no published figure for {gpu} here", assumed=True))
    return Figures(
        gpu=gpu, peak_tflops=peak, gemm_tflops=table, gemm=gemm, memory=memory,
        kernel_floor_us=Rate(2.0, 5.0, "us", "a CUDA kernel's launch-to-end floor", assumed=True),
        pcie=Rate(8.0, 12.0, "GB/s", "NCCL ring over PCIe Gen4 through host memory (no NVLink, no P2P)", assumed=True),
        efa=Rate(3.0, network_gbps / 8, "GB/s", f"{network_gbps:g} Gbit/s line rate; the low end from nccl-tests on "
                 "g6e, not g6 (aws/aws-ofi-nccl issue 547)", assumed=True))


class CalibrationError(ValueError):  # the CLI prints it as one line (raytrain_eks/cli.py)
    """A calibration file that cannot be used (one-line message naming file and field)."""


def _positive(path: Path, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CalibrationError(f"{path}: {field} = {value!r}: must be a number > 0")
    return float(value)


def calibrated(figures: Figures, path: Path | None = None) -> Figures:
    """``figures`` with what ``make gpu-check`` measured on this GPU type in place of the
    published and assumed rates (``path`` None: :data:`CALIBRATION`); unchanged when no
    calibration exists or it is of another GPU."""
    path = CALIBRATION if path is None else path
    if not path.is_file():
        return figures
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CalibrationError(f"{path}: not JSON ({err.msg} at line {err.lineno}); rerun `make gpu-check`") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), str):
        raise CalibrationError(f"{path}: gpu = {data.get('gpu') if isinstance(data, dict) else data!r}: "
                               f"must name the GPU model (one of {', '.join(GPU_PEAK_BF16_TFLOPS)})")
    if data["gpu"] != figures.gpu:
        return figures
    where = f"measured by make gpu-check on {data['gpu']} ({data.get('measured_at', 'undated')})"
    gemms = data.get("gemm")
    if not isinstance(gemms, list) or not gemms:
        raise CalibrationError(f"{path}: gemm = {gemms!r}: must be a non-empty list of {{m, n, k, tflops}}")
    table = {}
    for i, row in enumerate(gemms):
        if not isinstance(row, dict):
            raise CalibrationError(f"{path}: gemm[{i}] = {row!r}: must be {{m, n, k, tflops}}")
        m, n, k = (int(_positive(path, f"gemm[{i}].{key}", row.get(key))) for key in "mnk")
        table[(m, n, k)] = _positive(path, f"gemm[{i}].tflops", row.get("tflops"))
    memory = _positive(path, "memory_gbytes_per_s", data.get("memory_gbytes_per_s"))
    step = data.get("step")
    if step is not None and not (isinstance(step, dict) and isinstance(step.get("step_s"), (int, float))):
        raise CalibrationError(f"{path}: step = {step!r}: must be an object with step_s (seconds)")
    extra = {}
    host = data.get("host_adamw_ms_per_million")
    if host is not None:
        if not isinstance(host, dict) or not host:
            raise CalibrationError(f"{path}: host_adamw_ms_per_million = {host!r}: must be {{kernel: ms}} "
                                   "(fused, foreach) for one host thread")
        rates = {k: _positive(path, f"host_adamw_ms_per_million.{k}", v) for k, v in host.items()}
        extra.update(host_adamw={**HOST_ADAMW_MS_PER_MILLION, **{k: (v, v) for k, v in rates.items()}},
                     host_adamw_source=where)
    ratio = data.get("compiled_block_ratio")
    if ratio is not None:
        extra["compiled_block_ratio"] = _positive(path, "compiled_block_ratio", ratio)
    return replace(figures, gemm_tflops=table,
                   gemm=Rate(min(table.values()), max(table.values()), "TFLOP/s", where),
                   memory=Rate(memory, memory, "GB/s", where), measured_step=step, calibrated=True, **extra)


def figures_for(gpu: str, network_gbps: float, path: Path | None = None) -> Figures:
    """The rates for ``gpu``: published, with this GPU type's calibration applied when present."""
    return calibrated(published(gpu, network_gbps), path)
