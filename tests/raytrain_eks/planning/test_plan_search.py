"""The plan search (raytrain_eks/planning/plan_search.py) on the shipped jobs as the charts size them
on environment.toml (2 x g6.12xlarge), with the published measurements and traces.

Oracles: the collectives counted from FSDP2's rule must equal what bench/bench_full_size_plan.py
recorded from the real code for every measured plan; the pick must be the fastest at the slow
end among the plans whose MEASURED memory fits, never an estimate; pinned settings stay."""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from environment import load_environment
from raytrain_eks.planning import measured_plan, plan_search
from raytrain_eks.planning.memory_estimate import lora_adapter_params, usable_bytes
from training.config import JobConfigError, apply_overrides, job_config_from_dict, read_job_file
from training.flops import ModelShapes, lora_training_flops_per_token, training_flops_per_token

ROOT = Path(__file__).resolve().parents[3]
FLAGSHIP = "jobs/finetune-qwen2.5-1.5b.toml"


def _shapes(model: str) -> ModelShapes:
    return ModelShapes.from_hf_config({"model_type": "qwen2", **measured_plan.MODEL_CONFIGS[model]})


def _job(path: str, overrides: tuple[str, ...] = ()):
    from charts.jobs import plan_job

    env = load_environment(ROOT / "environment.toml")
    with contextlib.chdir(ROOT):
        job = plan_job(env, ROOT / path, ROOT, list(overrides)).config
    return job, env.gpu_group(job.parallel.node_group), _shapes(measured_plan.published_model(job.model.path))


def _measured_jobs():
    for row in measured_plan.load():
        if row["code"] != "after":
            continue
        parallel = {"strategy": row["strategy"], "num_workers": 8, "workers_per_node": 4, "use_gpu": True,
                    "keep_params_gathered": row["keep_gathered"], "grad_reduce_dtype": row["reduce_dtype"],
                    "activation_checkpointing": row["activation_checkpointing"],
                    "checkpoint_every": row.get("checkpoint_every", 1),
                    "cpu_offload": row.get("cpu_offload", False), "accumulation": row.get("accumulation", "sharded")}
        raw = {"name": "measured", "model": {"config": measured_plan.MODEL_CONFIGS[row["model"]]}, "parallel": parallel,
               "train": {"seq_len": 2048, "micro_batch_size": row["micro_batch_size"], "global_batch_size": 64}}
        if row.get("lora"):
            raw["model"]["transforms"] = [{"name": "lora", "options": {"rank": row["lora"]["rank"],
                                                                       "dropout": row["lora"]["dropout"]}}]
        try:
            yield row, job_config_from_dict(raw, "measured")
        except JobConfigError:
            continue  # a plan measured before the config refused it (bf16 reduce, hybrid, accumulation)


def test_the_counted_collectives_are_the_measured_ones():
    """Every measured plan: each collective's bytes in the first, middle and last micro batch as
    FSDP2's rule counts them equal the real code's under fake tensors (LoRA within 1 %: FSDP2
    pads each adapter shard to the shard group, the count does not)."""
    checked = 0
    for row, job in _measured_jobs():
        shapes = _shapes(row["model"])
        trainable = lora_adapter_params(shapes, {"rank": row["lora"]["rank"]}) if row.get("lora") else None
        counted = {(c["kind"], c["group_size"]): c for c in plan_search.collectives(shapes, job, trainable)}
        assert set(counted) == {(c["kind"], c["group_size"]) for c in row["collectives"]}, row["model"]
        for entry in row["collectives"]:
            mine = counted[(entry["kind"], entry["group_size"])]
            for which in ("first_bytes", "middle_bytes", "last_bytes"):
                assert mine[which] == pytest.approx(entry[which], rel=0.01, abs=1), (row["model"], entry["kind"], which)
        checked += 1
    assert checked >= 8


def test_local_accumulation_reduce_scatters_once_per_step_and_holds_the_fp32_gradient():
    job, _, shapes = _job(FLAGSHIP)
    job = dataclasses.replace(job, parallel=dataclasses.replace(job.parallel, grad_reduce_dtype="float32"))
    local = dataclasses.replace(job, parallel=dataclasses.replace(job.parallel, accumulation="local"))
    sharded = {c["kind"]: c for c in plan_search.collectives(shapes, job, None)}["reduce_scatter"]
    once = {c["kind"]: c for c in plan_search.collectives(shapes, local, None)}["reduce_scatter"]
    assert once["first_bytes"] == once["middle_bytes"] == 0 and once["last_bytes"] == sharded["last_bytes"]
    assert once["bytes"] * job.grad_accum_steps == sharded["bytes"]
    from raytrain_eks.planning.memory_estimate import estimate_for_job

    extra = estimate_for_job(local, shapes).accumulation - estimate_for_job(job, shapes).accumulation
    assert extra == 4 * shapes.num_params()  # every unit's unsharded fp32 gradient sum


def test_the_pick_is_the_fastest_measured_plan_that_fits_at_the_slow_end():
    job, group, shapes = _job(FLAGSHIP)
    found = plan_search.search(job, shapes, group)
    chosen, usable = found.chosen, usable_bytes(group.instance.gpu_memory_gib)
    assert chosen is not None and chosen.memory_source == "measured" and chosen.required_bytes <= usable
    eligible = [o for o in found.options if o.fits and o.memory_source == "measured" and o.prediction]
    assert chosen.slow_s == min(o.slow_s for o in eligible)
    assert [o.slow_s for o in found.top(3)] == sorted(o.slow_s for o in found.top(3))
    assert chosen.bound in ("GEMM", "memory-bound kernels", "exposed PCIe", "exposed EFA", "host work")
    # the file's plan is priced too, and an unmeasured faster plan is shown, never picked
    assert found.written is not None
    assert all(o.memory_source == "estimated" and o.slow_s < chosen.slow_s for o in found.unmeasured_faster)


def test_an_estimate_never_decides_a_plan():
    job, group, shapes = _job(FLAGSHIP)
    found = plan_search.search(job, shapes, group, results=[])
    assert found.chosen is None and found.options and all(o.memory_source == "estimated" for o in found.options)


def test_pinned_settings_stay_as_written():
    job, group, shapes = _job(FLAGSHIP, ("parallel.pinned=[\"strategy\", \"micro_batch_size\"]",
                                         "parallel.strategy=\"full_shard\""))
    found = plan_search.search(job, shapes, group)
    assert found.options and {(o.candidate.strategy, o.candidate.micro_batch_size) for o in found.options} == {
        ("full_shard", job.train.micro_batch_size)}


def test_auto_runs_the_pick_through_overrides():
    """``parallel.plan = "auto"``: the overrides submit hands the job turn the file's plan into
    the pick (here the file asks for hybrid shard; the pick is the measured full-shard plan)."""
    asked = ["parallel.strategy=\"hybrid_shard\"", "parallel.grad_reduce_dtype=\"float32\""]
    job, group, shapes = _job(FLAGSHIP, tuple(asked))
    found = plan_search.search(job, shapes, group)
    sets = plan_search.overrides(job, found.chosen.job)
    assert 'parallel.strategy="full_shard"' in sets
    with contextlib.chdir(ROOT):
        raw = apply_overrides(read_job_file(FLAGSHIP, asked), sets, FLAGSHIP)
    applied = job_config_from_dict(raw, FLAGSHIP)
    assert plan_search.current(applied) == found.chosen.candidate


@pytest.mark.parametrize("field,value,allowed", [("plan", "fastest", "as_written, auto"),
                                                  ("accumulation", "global", "sharded, local"),
                                                  ("pinned", ["sharding"], "strategy, accumulation")])
def test_a_bad_plan_setting_is_one_line(field, value, allowed):
    with pytest.raises(JobConfigError) as err:
        job_config_from_dict({"name": "x", "model": {"config": measured_plan.MODEL_CONFIGS["Qwen2.5-0.5B"]},
                              "parallel": {field: value}}, "jobs/x.toml")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"jobs/x.toml: parallel.{field}: ") and allowed in message


def test_local_accumulation_with_a_bf16_reduction_is_refused():
    from charts import ChartError

    with pytest.raises(ChartError, match="parallel.grad_reduce_dtype: 'bfloat16' with parallel.accumulation = 'local'"):
        _job(FLAGSHIP, ("parallel.strategy=\"full_shard\"", "parallel.accumulation=\"local\"",
                        "parallel.grad_reduce_dtype=\"bfloat16\"", "parallel.keep_params_gathered=false"))


def test_the_14b_lora_step_is_limited_by_pcie_and_its_mfu_counts_the_flops_lora_executes():
    job, group, shapes = _job("jobs/family/lora-qwen2.5-14b.toml")
    found = plan_search.search(job, shapes, group)
    assert found.written.bound == "exposed PCIe"
    adapters = lora_adapter_params(shapes, {"rank": 16})
    full, lora = training_flops_per_token(shapes, 2048), lora_training_flops_per_token(shapes, 2048, adapters)
    assert 0.6 < lora / full < 0.7  # ~4N + 3A of 6N + 3A
    from raytrain_eks.planning.step_model import find_trace, load_traces, trace_key

    trace = find_trace(load_traces(), **trace_key(job, "Qwen2.5-14B"))
    assert trace["lora"] is not None and trace["model_flops"] == lora * 2048  # the MFU's numerator


def test_offload_plans_get_their_pods_cpus_and_the_host_adamw_term():
    job, group, shapes = _job("jobs/family/finetune-qwen2.5-7b-offload.toml")
    found = plan_search.search(job, shapes, group)
    written = found.written
    assert written.job.parallel.cpus_per_worker == group.pod_cpu // job.parallel.workers_per_node > 1
    fast, slow = written.prediction["terms"]["host_optimizer_s"]
    assert 0 < fast < slow



def _submitted(asked: list[str], searched_job) -> tuple:
    """What submit runs for a ``plan = "auto"`` job with the user's ``--set`` ``asked``: the
    search's overrides of ``searched_job``, then the user's (raytrain_eks/runs/submit.py: they win)."""
    _, group, shapes = _job(FLAGSHIP, tuple(asked))
    found = plan_search.search(searched_job, shapes, group)
    sets = plan_search.overrides(searched_job, found.chosen.job)
    final, _, _ = _job(FLAGSHIP, (*sets, *asked))
    return found, sets, final


def test_a_plan_setting_the_user_sets_is_pinned_in_the_search():
    """submit puts the user's ``--set`` after the search's overrides: a plan setting the user
    sets must be one the search kept, else the job run mixes the user's setting with a pick made
    without it (one the search never weighed, which the config may even refuse)."""
    from raytrain_eks.runs import submit

    asked = ["parallel.strategy=\"hybrid_shard\"", "parallel.grad_reduce_dtype=\"float32\""]
    job, _, _ = _job(FLAGSHIP, tuple(asked))
    found, sets, final = _submitted(asked, submit._pin_user_plan_settings(job, asked))
    assert found.chosen.candidate.strategy == "hybrid_shard"
    assert plan_search.current(final) == found.chosen.candidate, sets
