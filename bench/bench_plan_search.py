"""The plan search (raytrain_eks/planning/plan_search.py) on every shipped GPU job: the chosen plan
and its predicted range against the plan the shipped file writes and the plan the job had before
the search (``BEFORE``), and the three best alternatives, each with what bounds it. For the
flagship (:data:`GOAL`): whether the pick reaches the MFU goal at both ends of its range, and if
not, which term of the step model stops it and by how much (:func:`goal_gap`).

Each job is sized by the charts' own function on environment.toml's GPU group (2 x g6.12xlarge,
8 L4); its shapes are the published config.json of its model (raytrain_eks/planning/measured_plan.py
MODEL_CONFIGS). Memory comes from bench/bench_full_size_plan.py's measurements
(raytrain_eks/planning/measured_plan.json) where they exist; ``--measure N`` measures up to N of the
fastest unmeasured candidates per job (fake tensors, a few minutes each on an idle 2-core machine)
and ``--publish`` adds them to measured_plan.json. Nothing here ran on a GPU: the rates are the
published and assumed ones of raytrain_eks/planning/gpu_figures.py.

Run: ``.venv/bin/python bench/bench_plan_search.py [--measure 2 --publish] [--jobs a.toml,b.toml]``
(``make gpu-check``'s gpu_calibration.json, where present, replaces the published rates and makes
compiled blocks a plan).
Prints a table per job, then ONE JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHIPPED_GPU_JOBS = ("jobs/finetune-qwen2.5-1.5b.toml", "jobs/family/finetune-qwen2.5-0.5b.toml",
                    "jobs/family/finetune-qwen2.5-3b.toml", "jobs/family/finetune-qwen2.5-7b-offload.toml",
                    "jobs/family/lora-qwen2.5-7b.toml", "jobs/family/lora-qwen2.5-14b.toml")
BEFORE = {
    "jobs/finetune-qwen2.5-1.5b.toml": {"strategy": "hybrid_shard", "keep_params_gathered": True},
    "jobs/family/finetune-qwen2.5-0.5b.toml": {"strategy": "hybrid_shard", "keep_params_gathered": True},
    "jobs/family/finetune-qwen2.5-3b.toml": {"strategy": "hybrid_shard", "activation_checkpointing": True},
    "jobs/family/finetune-qwen2.5-7b-offload.toml": {"strategy": "full_shard", "activation_checkpointing": True,
                                                     "cpu_offload": True},
    "jobs/family/lora-qwen2.5-7b.toml": {"strategy": "hybrid_shard", "activation_checkpointing": True},
    "jobs/family/lora-qwen2.5-14b.toml": {"strategy": "hybrid_shard", "activation_checkpointing": True},
}
"""Each shipped job's plan as written before the search (commit f3e5feb), micro batch 1, sharded
accumulation, fp32 reduce, the rest at the config's defaults."""
GOAL = {"jobs/finetune-qwen2.5-1.5b.toml": (0.25, 0.35)}
"""Predicted MFU the job's pick should reach (slow end, fast end): issue 52's goal for the flagship."""
TERM_NAMES = {"gemm_s": "GEMMs", "attention_s": "attention", "elementwise_s": "element-wise kernels (memory-bound)",
              "fsdp_copies_s": "FSDP2's copies (memory-bound)", "optimizer_s": "AdamW on the GPU (memory-bound)",
              "forward_gathers_s": "exposed all-gathers", "backward_reduce_scatters_s": "exposed reduce-scatters",
              "step_all_reduce_s": "exposed all-reduce (EFA)", "offload_copies_s": "offload copies (PCIe)",
              "host_optimizer_s": "host AdamW"}


def goal_gap(option, goal: tuple[float, float]) -> dict:
    """Where ``option``'s predicted MFU stands against ``goal`` (slow end, fast end). At each end:
    the step the goal allows (the same model FLOPs: step x MFU / goal), the gap to it, the terms
    largest first, and what stops it: the GEMMs + attention alone (the L4's matrix rate, published
    or measured) when they already exceed the allowed step, else the largest other term, with the
    MFU ceiling were everything else free."""
    out = {}
    for end, index, mfu_index, name in (("slow", 1, 0, "slow end"), ("fast", 0, 1, "fast end")):
        step, mfu = option.prediction["step_s"][index], option.prediction["mfu"][mfu_index]
        target = goal[0] if end == "slow" else goal[1]
        allowed = step * mfu / target
        terms = sorted(((v[index], k) for k, v in option.prediction["terms"].items() if v[index] > 0), reverse=True)
        matrix = sum(option.prediction["terms"][k][index] for k in ("gemm_s", "attention_s"))
        ceiling = step * mfu / matrix if matrix else float("inf")
        if mfu >= target:
            stop = "reached"
        elif matrix >= allowed:
            stop = (f"GEMMs + attention alone take {matrix:.2f} s > the {allowed:.2f} s the goal allows: at the "
                    f"{end} end's GEMM rates the MFU cannot pass {ceiling:.2f} even with every other term at zero")
        else:
            value, key = next((v, k) for v, k in terms if k not in ("gemm_s", "attention_s"))
            over = step - allowed
            stop = (f"{TERM_NAMES.get(key, key)} stop it: the goal needs {over:.2f} s off the step, "
                    f"{over / value:.0%} of that term's {value:.2f} s (GEMMs + attention alone, {matrix:.2f} s, "
                    f"would allow MFU {ceiling:.2f})")
        out[end] = {"mfu": mfu, "goal": target, "step_s": step, "allowed_step_s": round(allowed, 3),
                    "over_s": round(max(0.0, step - allowed), 3), "gemm_attention_s": round(matrix, 3),
                    "mfu_ceiling_gemm_only": round(ceiling, 3), "stopped_by": stop,
                    "terms": [(TERM_NAMES.get(k, k), round(v, 3)) for v, k in terms]}
    return out


def job_and_group(path: str):
    """The job as the charts size it on environment.toml, its GPU group and its model's shapes."""
    from charts.jobs import plan_job
    from environment import load_environment
    from raytrain_eks.planning.measured_plan import MODEL_CONFIGS, published_model
    from training.flops import ModelShapes

    env = load_environment(ROOT / "environment.toml")
    with contextlib.chdir(ROOT):
        job = plan_job(env, ROOT / path, ROOT).config
    name = published_model(job.model.path)
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS[name]})
    return job, env.gpu_group(job.parallel.node_group), shapes


def before_job(job, path: str):
    from raytrain_eks.planning.plan_search import Candidate, apply

    b = BEFORE[path]
    candidate = Candidate(strategy=b["strategy"], accumulation="sharded",
                          activation_checkpointing=b.get("activation_checkpointing", False),
                          keep_params_gathered=b.get("keep_params_gathered", False), grad_reduce_dtype="float32",
                          cpu_offload=b.get("cpu_offload", False), micro_batch_size=1)
    return candidate, apply(dataclasses.replace(job, parallel=dataclasses.replace(job.parallel, pinned=())), candidate)


def measurer(cluster):
    """bench/bench_full_size_plan.py's ``measure`` of a planned job (the fake process group is
    set up once, in :func:`main`)."""
    from bench_full_size_plan import SEQ_LEN, measure
    from raytrain_eks.planning.measured_plan import job_plan, published_model

    def run(job):
        plan = job_plan(job)
        if plan is None or plan["seq_len"] != SEQ_LEN:
            return None
        variant = {k: plan[k] for k in ("strategy", "activation_checkpointing", "reduce_dtype", "keep_gathered",
                                        "cpu_offload", "lora", "micro_batch_size", "accumulation", "checkpoint_every")}
        if variant["cpu_offload"]:
            from bench_offload_transfer import OffloadProbe

            variant["probe"] = OffloadProbe()
        row = measure(published_model(job.model.path), code="after", cluster=cluster, **variant)
        print(json.dumps({k: row.get(k) for k in ("model", "strategy", "accumulation", "activation_checkpointing",
                                              "micro_batch_size", "peak_bytes", "measure_s")}), file=sys.stderr, flush=True)
        return row
    return run


def main() -> None:
    from raytrain_eks.planning import measured_plan, plan_search

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(SHIPPED_GPU_JOBS))
    parser.add_argument("--measure", type=int, default=0, help="measure up to N unmeasured candidates per job")
    parser.add_argument("--publish", action="store_true", help="add the measured rows to measured_plan.json")
    args = parser.parse_args()
    results, measured, summary = measured_plan.load(), [], {}
    docs_rows = ["| job | model | plan (the search's pick) | GiB per L4 (measured, with overhead) | host GiB per node "
                 "| predicted step s (slow-fast) | MFU (slow-fast) | limited by (slow end) |", "|" + "---|" * 8]
    if args.measure:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=measured_plan.Cluster().world_size)
    for path in args.jobs.split(","):
        job, group, shapes = job_and_group(path)
        measure = None
        if args.measure:
            inner = measurer(measured_plan.Cluster(group.instance_type, job.num_nodes))

            def measure(planned, _inner=inner):
                row = _inner(planned)
                if row is not None:
                    measured.append(row)
                return row
        found = plan_search.search(job, shapes, group, results=results + measured, measure=measure,
                                   max_measure=args.measure)
        before, before_planned = before_job(job, path)
        was = next((o for o in found.options if o.candidate == before), None)
        print(f"\n## {path} ({job.num_nodes} x {group.instance_type}, {job.grad_accum_steps} micro batches at the "
              f"written micro batch)\n")
        print("| | plan | step s (slow-fast) | MFU (slow-fast) | bound | GiB per GPU | memory |")
        print("|---|---|---|---|---|---|---|")

        def line(mark, o):
            if o is None:
                return f"| {mark} | (not priced: pruned or refused) | | | | | |"
            (lo, hi), (m_lo, m_hi) = (o.prediction["step_s"], o.prediction["mfu"]) if o.prediction else ((0, 0), (0, 0))
            rng = f"{hi:.2f}-{lo:.2f}" if o.prediction else o.missing
            return (f"| {mark} | {o.candidate.label()} | {rng} | {m_lo:.2f}-{m_hi:.2f} | {o.bound} "
                    f"| {o.required_bytes / 1024**3:.1f}{'' if o.fits else ' (no fit)'} | {o.memory_source} |")
        shipped = found.written
        print(line("shipped", shipped))
        print(line("before", was))
        for index, option in enumerate(found.top(4)):
            print(line("chosen" if index == 0 else f"alt {index}", option))
        for option in found.unmeasured_faster:
            print(line("unmeasured", option))
        print(f"\n{found.compile_note}; {len(found.options)} priced, {found.pruned} pruned")
        gap = goal_gap(found.chosen, GOAL[path]) if path in GOAL and found.chosen else None
        if gap:
            print(f"\nMFU goal {GOAL[path][0]:.2f} (slow end) / {GOAL[path][1]:.2f} (fast end) for the pick:")
            for end, g in gap.items():
                terms = ", ".join(f"{n} {v:.2f}" for n, v in g["terms"])
                print(f"- {end} end: MFU {g['mfu']:.3f} vs {g['goal']:.2f}; step {g['step_s']:.2f} s vs "
                      f"{g['allowed_step_s']:.2f} s allowed ({g['over_s']:.2f} s over): {g['stopped_by']}. "
                      f"Terms (s): {terms}")
        chosen = found.chosen
        if chosen:
            (lo, hi), (m_lo, m_hi) = chosen.prediction["step_s"], chosen.prediction["mfu"]
            host = f"{chosen.host_bytes_per_node / 1024**3:.0f}" if chosen.host_bytes_per_node else "-"
            docs_rows.append(f"| {Path(path).stem} | {measured_plan.model_name(shapes)} | {chosen.candidate.label()} "
                             f"| {chosen.required_bytes / 1024**3:.1f} | {host} | {hi:.1f}-{lo:.1f} | {m_lo:.2f}-{m_hi:.2f} "
                             f"| {chosen.bound} |")
        summary[path] = {
            "chosen": chosen.candidate.label() if chosen else None,
            "chosen_step_s": list(chosen.prediction["step_s"]) if chosen else None,
            "chosen_mfu": list(chosen.prediction["mfu"]) if chosen else None,
            "chosen_bound": chosen.bound if chosen else None,
            "shipped": shipped.candidate.label() if shipped else None,
            "shipped_step_s": list(shipped.prediction["step_s"]) if shipped and shipped.prediction else None,
            "before_step_s": list(was.prediction["step_s"]) if was and was.prediction else None,
            "goal": gap,
            "before_mfu": list(was.prediction["mfu"]) if was and was.prediction else None,
            "overrides": plan_search.overrides(job, chosen.job) if chosen else [],
        }
    if args.publish and measured:
        from bench_full_size_plan import save

        save(measured, measured_plan.RESULTS, measured_plan.Cluster(), publish=True)
    print("\n" + "\n".join(docs_rows) + "\n")  # docs/jobs.md's table
    print(json.dumps({"name": "plan_search", "jobs": summary}))


if __name__ == "__main__":
    main()
