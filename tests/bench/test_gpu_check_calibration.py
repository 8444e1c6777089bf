"""``make gpu-check``'s calibration branch, run on CPU with only the device injected (device
"cpu", a no-op synchronisation, the device name an L4 reports): the file it writes is the one
the step model reads (raytrain_eks/planning/gpu_figures.py), and its figures replace the published ones."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.subprocess  # torch.compile's inductor compiles the block's kernels in worker processes
def test_the_calibration_measured_on_a_device_is_what_the_planner_reads(tmp_path):
    from raytrain_eks.planning.gpu_figures import figures_for

    gpu_check = _gpu_check()
    shapes = [(64, 48, 32), (128, 128, 128)]  # small: CPU time, not the shapes, is the point here
    tiny_block = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    data = gpu_check.measure_calibration("cpu", "NVIDIA L4", lambda: None, shapes=shapes, repeats=2,
                                         copy_bytes=1 << 20, step={"step_s": 6.0, "mfu": 0.2},
                                         block=tiny_block, block_tokens=64, adamw_millions=1)
    assert data["gpu"] == "L4" and [(g["m"], g["n"], g["k"]) for g in data["gemm"]] == shapes
    path = tmp_path / "gpu_calibration.json"
    path.write_text(json.dumps(data))
    f = figures_for("L4", 40, path)
    assert f.gemm_rate(128, 128, 128)[0] == data["gemm"][1]["tflops"]
    assert f.memory.low == data["memory_gbytes_per_s"] > 0
    assert "memory" not in f.assumed() and "gemm" not in f.assumed() and f.measured_step["step_s"] == 6.0
    # what the plan search needs besides: a compiled block against an eager one, the host's AdamW
    assert f.compiled_block_ratio == data["compiled_block"]["ratio"] > 0
    assert data["compiled_block"]["compiled_s"] > 0 and data["compiled_block"]["eager_s"] > 0
    fused = data["host_adamw_ms_per_million"]["fused"]
    assert f.host_adamw_rate(1, fused=True) == (fused, fused) and f.host_adamw_source.startswith("measured by make gpu-check")
    from raytrain_eks.planning.plan_search import compile_note

    assert "unmeasured" not in compile_note(f) and "unmeasured" in compile_note(figures_for("L4", 40, tmp_path / "none.json"))


def test_the_calibration_times_the_shipped_micro_batchs_own_gemm_shapes():
    from raytrain_eks.planning.step_model import load_traces

    shapes = _gpu_check().calibration_shapes()
    traced = {(m, n, k) for t in load_traces() for m, n, k, _ in t["gemms"]}
    assert traced and traced <= set(shapes) and (2048, 2048, 2048) in shapes


@pytest.mark.subprocess  # nvidia-smi's stand-in is an executable
def test_the_gate_step_reports_each_gpus_reading_bound_and_findings(tmp_path, monkeypatch):
    # The device injected: the GPU's name and GEMM rate, and nvidia-smi as a stand-in executable
    # printing its CSV query answers (NVIDIA nvidia-smi ``--format=csv,noheader,nounits``).
    import torch

    from training import contract, watchdog

    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\ncase \"$1\" in --query-gpu=*) echo '0, GPU-aaaa, 1, [N/A]';; "
                    "*) echo 'GPU-aaaa, No, No';; esac\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv(contract.ENV_GATE_DEVICE, raising=False)
    monkeypatch.delenv(contract.ENV_PEAK_TFLOPS, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA L4")
    rates = iter([54.9, 12.0])
    monkeypatch.setattr(watchdog, "gemm_tflops", lambda device: next(rates))
    out = _gpu_check().health_gate(2)
    assert [(g["gemm_tflops"], g["peak"], g["bound"]) for g in out["gpus"]] == [(54.9, 121.0, 30.2), (12.0, 121.0, 30.2)]
    assert out["problems"] == ["GPU 0: 1 uncorrectable ECC errors since the driver loaded (bound 0)",
                               "GPU 1: bf16 GEMM 4096^3 at 12.0 TFLOP/s < bound 30.2 (0.25 x peak 121)"]
