"""`make gpu-check`: the GPU path as the job really runs it, on the GPUs of this machine (< 8 min).

1. bf16 MFU at Qwen2.5-1.5B shapes (bench/bench_gpu_mfu.py, the job's parallelize()).
1b. The shipped per-GPU profile through the real entry point: Qwen2.5-1.5B (random init from
   its published config), packed chat data (the demo corpus, the real tokenizer), seq_len, micro
   batch, accumulation 2 and the parallel settings of jobs/finetune-qwen2.5-1.5b.toml, over
   this machine's GPUs (hybrid shard on one node is full shard inside it; below 4 GPUs the
   weights are bf16 so 1.5B fits); reports tokens/s, MFU and peak memory from run.json.
2. The real entry point (``python -m training``) with ``parallel.use_gpu = true`` and NCCL on 1
   GPU, and on 2 when there are 2: a small Qwen2, synthetic data, checkpoints to a local
   storage folder, the workers' export. Asserts NCCL's log file exists for every rank and the
   transport is classified (``single-node`` on one machine; the job requires it, so a missing
   log fails the run).
3. A resume of that run (more steps, same run name): it must continue from the last checkpoint.

3b. The health gate's device calls on every GPU (:func:`health_gate`, training/watchdog.py): the
   timed GEMM against its bound, nvidia-smi's ECC and row-remap answers as the gate reads them,
   the findings (a healthy machine: none) and the seconds the gate takes, printed, never asserted
   as a time.
4. The calibration (:func:`measure_calibration`): bf16 GEMM rate at the shipped micro batch's
   shapes, memory bandwidth and the step above, written to raytrain_eks/planning/gpu_calibration.json,
   which the preflight's step model (raytrain_eks/planning/step_model.py) reads in place of the published
   and assumed rates.

Without a GPU it prints ``{"name": "gpu_check", "skipped": ...}`` and exits 0. Prints ONE JSON
line; exit 1 when a check failed. Run: ``.venv/bin/python bench/gpu_check.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from training import contract  # noqa: E402  (standard library only: no torch needed)
from training.transport import NCCL_LOG_DIR  # noqa: E402

JOB = """\
name = "gpu-check"
[model]
config = {{ hidden_size = 1024, intermediate_size = 2816, num_hidden_layers = 8, num_attention_heads = 16, num_key_value_heads = 4, vocab_size = 151936, max_position_embeddings = 2048, dtype = "bfloat16" }}
[data]
kind = "synthetic"
[train]
seq_len = 1024
micro_batch_size = 1
global_batch_size = {global_batch}
max_steps = {steps}
warmup_steps = 2
log_every_n_steps = 5
report_every_n_steps = 5
[parallel]
strategy = "full_shard"
num_workers = {gpus}
workers_per_node = {gpus}
use_gpu = true
cpus_per_worker = 1
[checkpoint]
storage_path = "{storage}"
every_n_steps = 10
export_hf = true
[eval]
max_batches = 2
[evidence]
require_transport = "single-node"
"""


SHIPPED_JOB = ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml"


def _profile_job(gpus: int, storage: Path) -> str:
    """The shipped job's per-GPU profile as a job file for this machine (see the module docstring)."""
    import tomllib

    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS

    shipped = tomllib.loads(SHIPPED_JOB.read_text())
    train, parallel = shipped["train"], shipped["parallel"]
    config = ", ".join(f"{k} = {json.dumps(v)}" for k, v in MODEL_CONFIGS["Qwen2.5-1.5B"].items())
    keep = {k: v for k, v in parallel.items() if k in ("activation_checkpointing", "keep_params_gathered",
                                                        "grad_reduce_dtype", "compile", "accumulation")}
    lines = [
        'name = "gpu-check-profile"',
        "[model]", f"config = {{ {config} }}", 'tokenizer = "training/assets/qwen2.5-tokenizer"',
        f'dtype = "{"auto" if gpus >= 4 else "bfloat16"}"',
        "[data]", 'kind = "chat"', 'path = "training/assets/demo_corpus/chat"',
        "[train]", f"seq_len = {train['seq_len']}", f"micro_batch_size = {train.get('micro_batch_size', 1)}",
        f"global_batch_size = {2 * gpus * train.get('micro_batch_size', 1)}", "max_steps = 12", "warmup_steps = 2",
        "log_every_n_steps = 4", "report_every_n_steps = 4",
        "[parallel]", 'strategy = "full_shard"', f"num_workers = {gpus}", f"workers_per_node = {gpus}",
        "use_gpu = true", *(f"{k} = {json.dumps(v)}" for k, v in keep.items()),
        "[checkpoint]", f'storage_path = "{storage / "runs-profile"}"', "every_n_steps = 1000",
        "[eval]", "max_batches = 1",
        "[evidence]", 'require_transport = "single-node"',
    ]
    return "\n".join(lines) + "\n"


def _profile(gpus: int, storage: Path) -> dict:
    job = storage / "gpu-check-profile.toml"
    job.write_text(_profile_job(gpus, storage))
    code, log, seconds = _run([sys.executable, "-m", "training", "--config", str(job)], 300,
                              dict(os.environ, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.5"))
    run = storage / "runs-profile" / "gpu-check-profile"
    record = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    throughput = record.get("throughput") or {}
    out = {"gpus": gpus, "exit": code, "seconds": round(seconds, 1), **{k: throughput.get(k) for k in (
        contract.TOKENS_PER_S, contract.MFU, "compute_mfu", contract.PEAK_MEMORY_GIB)}}
    out["problems"] = [] if code == 0 else [f"profile exit {code}: " + log.strip().splitlines()[-1][-300:]]
    return out


def calibration_shapes() -> list[tuple[int, int, int]]:
    """The GEMM shapes to time: the published trace's (the shipped micro batch's own GEMMs,
    raytrain_eks/planning/step_trace.json) and the squares of the published L4 table."""
    from raytrain_eks.planning.gpu_figures import L4_GEMM_TFLOPS
    from raytrain_eks.planning.step_model import load_traces

    shapes = {(m, n, k) for trace in load_traces() for m, n, k, _ in trace["gemms"]}
    return sorted(shapes | {(s, s, s) for s in L4_GEMM_TFLOPS})


BLOCK = {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2}
"""The decoder block timed compiled against eager: Qwen2.5-1.5B's (raytrain_eks/planning/measured_plan.py)."""


def measure_block(device: str, sync, *, block: dict = BLOCK, tokens: int = 2048, repeats: int = 10) -> dict:
    """Forward + backward of ONE Qwen2 decoder block in bf16, eager and ``torch.compile``d as the
    job compiles its blocks (training/parallel.py ``layer.compile()``): seconds each and their
    ratio, what the plan search needs to price ``parallel.compile``."""
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    config = Qwen2Config(**block, num_hidden_layers=1)
    dtype = torch.bfloat16
    layer = Qwen2DecoderLayer(config, 0).to(device=device, dtype=dtype)
    rotary = Qwen2RotaryEmbedding(config).to(device)
    hidden = torch.randn(1, tokens, config.hidden_size, device=device, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens, device=device)[None]
    embeddings = rotary(hidden, positions)

    def run(module):
        out = module(hidden, position_embeddings=embeddings, position_ids=positions)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()

    def timed(module) -> float:
        run(module)  # warm-up (and, compiled, the compile)
        sync()
        began = time.perf_counter()
        for _ in range(repeats):
            run(module)
        sync()
        return (time.perf_counter() - began) / repeats

    eager = timed(layer)
    layer.compile()
    compiled = timed(layer)
    return {"eager_s": eager, "compiled_s": compiled, "ratio": float(f"{compiled / eager:.4g}"), "tokens": tokens, **block}


def measure_host_adamw(millions: int = 16, repeats: int = 5) -> dict:
    """One host thread's AdamW step per million fp32 parameters, fused and foreach
    (bench/bench_host_adamw.py): the host work of an offload plan on the GPU host's own CPUs."""
    import statistics

    import torch

    from bench_host_adamw import adamw_ms_per_million

    threads = torch.get_num_threads()
    try:
        out = {kernel: float(f"{statistics.median(adamw_ms_per_million(kernel, 1, millions, repeats)):.4g}")
               for kernel in ("fused", "foreach")}
    finally:
        torch.set_num_threads(threads)
    return out


def measure_calibration(device: str, device_name: str, sync, *, shapes: list[tuple[int, int, int]],
                        repeats: int = 10, copy_bytes: int = 1 << 30, step: dict | None = None,
                        block: dict = BLOCK, block_tokens: int = 2048, adamw_millions: int = 16) -> dict:
    """What raytrain_eks/planning/gpu_calibration.json holds: bf16 GEMM TFLOP/s by shape, the bytes per
    second of a device-to-device copy (read + written), the shipped per-GPU step as the
    profile run measured it, a compiled decoder block's time over the eager one's
    (:func:`measure_block`) and the host's AdamW rate (:func:`measure_host_adamw`). ``sync``
    waits for the device (``torch.cuda.synchronize``); a warm-up call of each kernel precedes
    the timed ones."""
    import datetime

    import torch

    from environment.instances import gpu_model_of

    def timed(fn) -> float:
        fn()
        sync()
        began = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        return (time.perf_counter() - began) / repeats

    gemms = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        b = torch.randn(k, n, dtype=torch.bfloat16, device=device)
        seconds = timed(lambda: torch.mm(a, b))
        gemms.append({"m": m, "n": n, "k": k, "tflops": float(f"{2 * m * n * k / seconds / 1e12:.4g}")})
    source = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy_s = timed(lambda: target.copy_(source))
    compiled = measure_block(device, sync, block=block, tokens=block_tokens, repeats=max(2, repeats // 2))
    return {"gpu": gpu_model_of(device_name), "device": device_name, "torch": torch.__version__,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gemm": gemms, "memory_gbytes_per_s": float(f"{2 * copy_bytes / copy_s / 1e9:.4g}"), "step": step,
            "compiled_block": compiled, "compiled_block_ratio": compiled["ratio"],
            "host_adamw_ms_per_million": measure_host_adamw(adamw_millions, max(2, repeats // 2))}


def health_gate(gpus: int) -> dict:
    """The gate's own reading and judgement on each GPU, with its seconds (training/watchdog.py)."""
    import torch

    from training import watchdog
    from training.metrics import peak_tflops_from_env

    out: dict = {"gpus": [], "problems": []}
    for index in range(gpus):
        began = time.perf_counter()
        readings = watchdog.device_readings(True, torch.device("cuda", index))
        name = torch.cuda.get_device_name(index)
        peak = peak_tflops_from_env(os.environ, name) or _table_peak(name)
        found = watchdog.judge_gate(readings, peak)
        out["gpus"].append({"index": index, "gemm_tflops": round(readings.get("gemm_tflops") or 0.0, 1), "peak": peak,
                            "bound": round(watchdog.GEMM_MIN_PEAK_FRACTION * peak, 1) if peak else None,
                            "nvidia_smi": readings.get("gpus", "").strip(), "found": found,
                            "seconds": round(time.perf_counter() - began, 2)})
        # nvidia-smi's findings name their GPU and come back from every GPU's reading: once each
        for finding in (f"GPU {index}: {f}" if f.startswith("bf16 GEMM") else f for f in found):
            if finding not in out["problems"]:
                out["problems"].append(finding)
    return out


def _table_peak(name: str) -> float | None:
    """The GPU's peak from the environment package's table (no manifest on this machine)."""
    from environment.instances import peak_bf16_tflops

    return peak_bf16_tflops(name)


def _last_json(text: str) -> dict:
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _run(cmd: list[str], timeout: int, env: dict | None = None) -> tuple[int, str, float]:
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - began


def _train(gpus: int, steps: int, storage: Path, timeout: int) -> tuple[int, str, float]:
    job = storage / f"gpu-check-{gpus}.toml"
    job.write_text(JOB.format(gpus=gpus, global_batch=4 * gpus, steps=steps, storage=storage / f"runs-{gpus}"))
    env = dict(os.environ, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.5")
    return _run([sys.executable, "-m", "training", "--config", str(job)], timeout, env)


def _entry_point(gpus: int, storage: Path) -> dict:
    """Train 20 steps, then resume to 25 steps; the checks on run.json, the NCCL logs, the export."""
    out: dict = {"gpus": gpus}
    before = set(Path(NCCL_LOG_DIR).glob("nccl.*.log")) if Path(NCCL_LOG_DIR).is_dir() else set()
    code, log, seconds = _train(gpus, 20, storage, timeout=120)
    out.update(train_exit=code, train_s=round(seconds, 1))
    run = storage / f"runs-{gpus}" / "gpu-check"
    record = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    transport = record.get("transport") or {}
    new_logs = set(Path(NCCL_LOG_DIR).glob("nccl.*.log")) - before if Path(NCCL_LOG_DIR).is_dir() else set()
    throughput = record.get("throughput") or {}
    out.update(transport=transport.get("transport"), nccl_logs=len(new_logs),
               tokens_per_s=throughput.get(contract.TOKENS_PER_S), mfu=throughput.get(contract.MFU),
               compute_mfu=throughput.get(contract.COMPUTE_MFU), wall_mfu=throughput.get(contract.WALL_MFU),
               checkpoint_stall_s=[c.get("stall_s") for c in record.get("checkpoints") or []])
    safetensors = run / "hf" / "model.safetensors"
    if safetensors.is_file():
        from safetensors import safe_open

        with safe_open(str(safetensors), "pt") as tensors:
            out["export_dtypes"] = sorted({str(tensors.get_tensor(k).dtype) for k in list(tensors.keys())[:4]})
    code2, log2, seconds2 = _train(gpus, 25, storage, timeout=90)
    resumed = "resuming gpu-check from step 20" in log2
    out.update(resume_exit=code2, resume_s=round(seconds2, 1), resumed_from_step_20=resumed)
    problems = []
    if code or code2:
        problems.append(f"exit codes {code}/{code2}: " + (log if code else log2).strip().splitlines()[-1][-300:])
    if out["transport"] in (None, "unknown") or out["nccl_logs"] < gpus:
        problems.append(f"transport {out['transport']!r} with {out['nccl_logs']} NCCL log files for {gpus} ranks")
    if out.get("export_dtypes") != ["torch.bfloat16"]:
        problems.append(f"export dtypes {out.get('export_dtypes')}")
    if not resumed:
        problems.append("the second run did not resume from step 20")
    out["problems"] = problems
    return out


def main() -> int:
    began = time.perf_counter()
    try:
        import torch
    except ImportError:
        print(json.dumps({"name": "gpu_check", "skipped": "torch is not installed"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"name": "gpu_check", "skipped": "no GPU (torch.cuda.is_available() is false)"}))
        return 0
    gpus = torch.cuda.device_count()
    result: dict = {"name": "gpu_check", "device": torch.cuda.get_device_name(), "gpus": gpus}
    code, log, seconds = _run([sys.executable, "bench/bench_gpu_mfu.py", "--seq", "2048", "--steps", "6"], 120)
    result["mfu_1_5b"] = {k: v for k, v in _last_json(log).items() if k in (
        contract.MFU, "tflops", contract.TOKENS_PER_S, "step_s", contract.PEAK_MEMORY_GIB, "peak_reserved_gib")}
    result["mfu_1_5b"]["seconds"] = round(seconds, 1)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        result["profile"] = _profile(gpus, Path(scratch))
        result["runs"] = [_entry_point(n, Path(scratch)) for n in sorted({1, min(2, gpus)})]
    result["health_gate"] = health_gate(gpus)
    problems = [p for run in [result["profile"], *result["runs"], result["health_gate"]] for p in run["problems"]] + (
        [] if code == 0 else ["MFU benchmark failed"])
    # the measurements the preflight's step model uses in place of published and assumed rates
    from raytrain_eks.planning.gpu_figures import CALIBRATION

    profile = result["profile"]
    step = {"per_gpu_shape": "jobs/finetune-qwen2.5-1.5b.toml on this machine's GPUs", **{
        k: profile.get(k) for k in (contract.TOKENS_PER_S, contract.MFU, contract.PEAK_MEMORY_GIB)}, "step_s": result["mfu_1_5b"].get("step_s")}
    calibration = measure_calibration("cuda", torch.cuda.get_device_name(), torch.cuda.synchronize,
                                      shapes=calibration_shapes(), step=step if step["step_s"] else None)
    CALIBRATION.write_text(json.dumps(calibration, indent=1) + "\n")
    result["calibration"] = {"written": str(CALIBRATION), "memory_gbytes_per_s": calibration["memory_gbytes_per_s"]}
    result.update(ok=not problems, wall_s=round(time.perf_counter() - began, 1))
    print(json.dumps(result))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
