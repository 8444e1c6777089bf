"""Two levers of the plan search (raytrain_eks/planning/plan_search.py): activation checkpointing
of every k-th block, and per-block torch.compile, which the search weighs only where a
calibration (``make gpu-check``'s gpu_calibration.json, written here by the test) measured a
compiled block against an eager one on the job's GPU type."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from environment import load_environment
from raytrain_eks.planning import measured_plan, plan_search, step_model
from raytrain_eks.planning.gpu_figures import figures_for
from raytrain_eks.planning.memory_estimate import estimate_for_job
from training.flops import ModelShapes

ROOT = Path(__file__).resolve().parents[3]
FLAGSHIP = "jobs/finetune-qwen2.5-1.5b.toml"


def _job(overrides: tuple[str, ...] = ()):
    from charts.jobs import plan_job

    env = load_environment(ROOT / "environment.toml")
    with contextlib.chdir(ROOT):
        job = plan_job(env, ROOT / FLAGSHIP, ROOT, list(overrides)).config
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **measured_plan.MODEL_CONFIGS["Qwen2.5-1.5B"]})
    return job, env.gpu_group(job.parallel.node_group), shapes


def _gemm_flops(trace: dict) -> float:
    return sum(2 * m * n * k * count for m, n, k, count in trace["gemms"])


@pytest.mark.parametrize("every", [2, 3, 4])
def test_every_kth_block_is_priced_with_the_recompute_of_its_blocks_only(every):
    """The trace of every k-th block checkpointed adds (L // k) / L of the full recompute (the
    difference between the traces with and without checkpointing) to the trace without."""
    traces = step_model.load_traces()
    key = dict(model="Qwen2.5-1.5B", kind="chat", seq_len=2048, micro_batch_size=2, lora=None)
    off = step_model.find_trace(traces, **key)
    on = step_model.find_trace(traces, **key, activation_checkpointing=True)
    kth = step_model.find_trace(traces, **key, activation_checkpointing=True, checkpoint_every=every)
    share = (28 // every) / 28
    for measure in (_gemm_flops, lambda t: t["attention_flops"], lambda t: t["elementwise_bytes"]):
        assert measure(kth) == pytest.approx(measure(off) + share * (measure(on) - measure(off)), rel=1e-9)
        assert measure(off) < measure(kth) < measure(on)
    assert kth["model_flops"] == on["model_flops"] and kth["checkpoint_every"] == every


def test_the_recompute_share_is_what_the_real_code_executes():
    """Oracle: bench/bench_full_size_plan.py counted the FLOPs the job's own code executes per
    micro batch (torch's FlopCounterMode, recompute included) for every measured k; they equal the
    plan without checkpointing plus (L // k) / L of the full recompute, the share the step model
    adds (step_model.partial_checkpointing)."""
    rows = [r for r in measured_plan.load() if r["code"] == "after" and r.get("checkpoint_every", 1) > 1]
    assert {r["checkpoint_every"] for r in rows} >= {2, 3, 4}
    for row in rows:
        same = [r for r in measured_plan.load() if r["code"] == "after" and (r["model"], r["micro_batch_size"], r.get("lora"))
                == (row["model"], row["micro_batch_size"], row.get("lora")) and r.get("checkpoint_every", 1) == 1]
        off = next(r for r in same if not r["activation_checkpointing"])["executed_flops_per_micro_batch"]
        on = next(r for r in same if r["activation_checkpointing"])["executed_flops_per_micro_batch"]
        layers = measured_plan.MODEL_CONFIGS[row["model"]]["num_hidden_layers"]
        share = (layers // row["checkpoint_every"]) / layers
        assert row["executed_flops_per_micro_batch"] == pytest.approx(off + share * (on - off), rel=1e-6)


def test_the_search_weighs_k_and_prices_it_between_none_and_every_block():
    job, group, shapes = _job()
    found = plan_search.search(job, shapes, group)
    base = found.chosen.candidate  # checkpointing every block (the shipped pick)
    by_every = {}
    for option in found.options:
        c = option.candidate
        if (c.strategy, c.accumulation, c.keep_params_gathered, c.grad_reduce_dtype, c.micro_batch_size, c.cpu_offload) == (
                base.strategy, base.accumulation, base.keep_params_gathered, base.grad_reduce_dtype,
                base.micro_batch_size, base.cpu_offload):
            by_every[c.checkpoint_every if c.activation_checkpointing else 0] = option
    assert set(by_every) == {0, *plan_search.CHECKPOINT_EVERY}
    # less recompute: faster at both ends; more saved activations: more memory (analytic model)
    order = [by_every[k] for k in (1, 2, 4, 0)]
    slow = [o.prediction["step_s"][1] for o in order]
    assert slow == sorted(slow, reverse=True)
    required = [estimate_for_job(o.job, shapes).required for o in order]
    assert required == sorted(required)
    assert "checkpointing every 2 blocks" in by_every[2].candidate.label()
    # the plan turns into the job's settings
    assert by_every[2].job.parallel.checkpoint_every == 2 and by_every[2].job.parallel.activation_checkpointing


def _calibration(tmp_path: Path, ratio: float | None) -> Path:
    """A gpu_calibration.json as bench/gpu_check.py writes it on an L4 (the published square GEMM
    rates as if measured, the datasheet bandwidth), with or without its compiled-block ratio."""
    data = {"gpu": "L4", "measured_at": "test", "memory_gbytes_per_s": 240.0,
            "gemm": [{"m": s, "n": s, "k": s, "tflops": r} for s, r in ((1024, 54.4), (2048, 70.9), (4096, 54.9),
                                                                          (8192, 59.4))]}
    if ratio is not None:
        data["compiled_block_ratio"] = ratio
    path = tmp_path / "gpu_calibration.json"
    path.write_text(json.dumps(data))
    return path


def test_without_a_measured_compiled_block_compile_is_not_searched_and_the_preflight_says_so(tmp_path):
    job, group, shapes = _job()
    figures = figures_for("L4", group.instance.network_gbps, _calibration(tmp_path, None))
    found = plan_search.search(job, shapes, group, figures=figures)
    assert not any(o.candidate.compile for o in found.options)
    note = found.compile_note
    assert "unmeasured" in note and "make gpu-check" in note and "not searched" in note
    kernels = sum(found.chosen.prediction["terms"][t][1] for t in plan_search.COMPILE_TERMS)
    assert f"{kernels:.2f}" in note  # what it would act on, in the pick's own terms
    assert note in "\n".join(plan_search.render(found, job))


@pytest.mark.parametrize("ratio,picked", [(0.7, True), (1.3, False)])
def test_a_measured_compiled_block_makes_compile_a_plan_the_search_can_pick(tmp_path, ratio, picked):
    job, group, shapes = _job()
    figures = figures_for("L4", group.instance.network_gbps, _calibration(tmp_path, ratio))
    found = plan_search.search(job, shapes, group, figures=figures)
    pairs = {}
    for option in found.options:
        pairs.setdefault(_eager(option.candidate), {})[option.candidate.compile] = option
    both = [p for p in pairs.values() if len(p) == 2 and p[False].prediction]
    assert both
    for p in both:
        compiled, eager = p[True], p[False]
        # the same memory (the eager plan's measurement), a step scaled by the measured ratio
        assert compiled.required_bytes == eager.required_bytes
        if eager.memory_source == "measured":
            assert compiled.memory_source == plan_search.COMPILED_MEMORY
        assert (compiled.slow_s < eager.slow_s) == (ratio < 1)
        assert (compiled.prediction["step_s"][0] < eager.prediction["step_s"][0]) == (ratio < 1)
    assert found.chosen.candidate.compile is picked
    assert "searched" in found.compile_note and f"{ratio:.2f}" in found.compile_note
    if picked:
        assert plan_search.overrides(job, found.chosen.job) == ["parallel.compile=true"]


def _eager(candidate):
    import dataclasses

    return dataclasses.replace(candidate, compile=False)
