"""The shipped GPU jobs' predicted step time and MFU: the old model beside the new one, as ranges.

Rows (:data:`PLANS`): each shipped GPU job (jobs/local.toml runs on CPU) as shipped and with a
setting changed: activation checkpointing, and micro batch 2 (the same tokens per step in half
the micro batches), each with the measured plan's peak memory per L4.

Default: print the table (Markdown) from the published trace (raytrain_eks/planning/step_trace.json),
the measured collectives (raytrain_eks/planning/measured_plan.json) and the rates of
raytrain_eks/planning/gpu_figures.py (with raytrain_eks/planning/gpu_calibration.json when ``make gpu-check`` wrote
one), then every term's source. ``--trace`` first re-measures the traces on CPU: the model built
from its config under ``FakeTensorMode`` runs one micro batch of the job's own code
(``training.model.use_packed_attention``, ``training.model.loss_inputs`` /
``loss_from_inputs``) forward and backward, in bf16 as on the GPU, and every kernel is recorded:
GEMM shapes, attention FLOPs (torch's SDPA formulas, per document), and the bytes every other
non-view kernel reads and writes. About 30 s per trace on an idle core.

Run: ``.venv/bin/python bench/bench_step_model.py [--trace]``.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from raytrain_eks.planning import gpu_figures, measured_plan, step_model  # noqa: E402
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS  # noqa: E402
from training.flops import ModelShapes  # noqa: E402

MODEL = "Qwen2.5-1.5B"


def trace(kind: str, seq_len: int, micro_batch_size: int, activation_checkpointing: bool = False,
          model_name: str = MODEL, lora: dict | None = None) -> dict:
    """One micro batch of the job's code on fake tensors; see the module docstring. ``lora``: a
    LoRA transform's options (training/model_transforms/lora.py applied as build_model applies
    it: the frozen base's weight gradients are never computed, the trace shows it)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils import flop_counter as fc
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench_full_size_plan import DOC_LENGTHS, packed_chat_batch
    from training.flops import training_flops_per_token
    from training.model import loss_from_inputs, loss_inputs, use_chunked_loss_head, use_packed_attention
    from training.parallel import checkpoint_activations

    aten = torch.ops.aten
    gemm_ops = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2), aten.bmm.default: (0, 1)}
    no_bytes = {aten.detach.default, aten._unsafe_view.default}

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.gemms, self.attention, self.bytes, self.kernels = collections.Counter(), 0, 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in gemm_ops:
                a, b = (args[i] for i in gemm_ops[func])
                self.gemms[(a.shape[-2], b.shape[-1], a.shape[-1])] += a.shape[0] if a.dim() == 3 else 1
            elif func is aten._scaled_dot_product_flash_attention_for_cpu.default:
                q, k = args[0].shape, args[1].shape
                self.attention += fc.sdpa_flop_count(q, (*k[:1], q[1], *k[2:]), (*k[:1], q[1], *k[2:]))
            elif func is aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
                g, q, k = args[0].shape, args[1].shape, args[2].shape
                self.attention += fc.sdpa_backward_flop_count(g, q, (*k[:1], q[1], *k[2:]), (*k[:1], q[1], *k[2:]))
            elif not func.is_view and func not in no_bytes and isinstance(out, torch.Tensor | tuple | list):
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                if tensors:
                    self.bytes += sum(t.numel() * t.element_size() for t in tensors)
                    self.kernels += 1
            return out

    config = Qwen2Config(**MODEL_CONFIGS[model_name])
    if kind == "chat":  # packed documents, each one's first 40 % a prompt (bench_full_size_plan)
        batch, docs = packed_chat_batch(micro_batch_size, seq_len), list(DOC_LENGTHS)
    else:  # synthetic: random ids, one document per row, every token a target
        ids = torch.randint(0, config.vocab_size, (micro_batch_size, seq_len), generator=torch.Generator().manual_seed(0))
        batch, docs = {"input_ids": ids, "labels": ids.clone()}, [seq_len]
    prepared = loss_inputs(None, batch, packed=True)  # host work, before the fake mode
    began = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # FSDP computes in bf16
        model.config.use_cache = False
        use_packed_attention(model)
        if lora is not None:  # the transform before the loss head, as build_model
            from training.model_transforms import lora as lora_transform

            lora_transform.apply(model, lora)
            for module in model.modules():  # the adapters compute in bf16 too (FSDP's param dtype)
                for name, param in module.named_parameters(recurse=False):
                    param.data = param.data.to(torch.bfloat16)
        use_chunked_loss_head(model)  # as build_model: the output layer and the loss in chunks
        model.train()
        if activation_checkpointing:  # as training/parallel.py: the blocks' forward again in backward
            checkpoint_activations(model)
        recorder = Recorder()
        with recorder:
            loss_from_inputs(model, *prepared).backward()
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS[model_name]})
    from raytrain_eks.planning.measured_plan import lora_key
    from raytrain_eks.planning.memory_estimate import lora_adapter_params
    from training.flops import lora_training_flops_per_token

    per_token = (training_flops_per_token(shapes, seq_len) if lora is None
                 else lora_training_flops_per_token(shapes, seq_len, lora_adapter_params(shapes, lora)))
    return {"model": model_name, "kind": kind, "seq_len": seq_len, "micro_batch_size": micro_batch_size,
            "activation_checkpointing": activation_checkpointing, "lora": lora_key(lora) if lora is not None else None,
            "doc_lengths": docs, "target_tokens": int(prepared[1].numel()),
            "gemms": sorted([*shape, count] for shape, count in recorder.gemms.items()),
            "attention_flops": int(recorder.attention), "elementwise_bytes": int(recorder.bytes),
            "kernels": recorder.kernels,
            "model_flops": per_token * seq_len * micro_batch_size,
            "torch": torch.__version__, "measure_s": round(time.perf_counter() - began, 1)}


def _job(name: str) -> dict:
    return tomllib.loads((ROOT / "jobs" / f"{name}.toml").read_text())


PLANS: tuple[tuple[str, dict], ...] = (
    ("finetune-qwen2.5-1.5b", {}),
    ("finetune-qwen2.5-1.5b", {"activation_checkpointing": True}),
    # the lever "fewer, larger micro batches": the same 64 x 2048 tokens per step in 4 micro batches
    ("finetune-qwen2.5-1.5b", {"micro_batch_size": 2}),
    ("finetune-qwen2.5-1.5b", {"micro_batch_size": 2, "activation_checkpointing": True}),
    ("smoke", {}),
    ("smoke", {"activation_checkpointing": True}),
)
"""The table's rows: each shipped GPU job as shipped ({}) and with a setting changed (a user's
``--set``); bench/bench_full_size_plan.py measured each one's plan."""


def _plan(name: str, change: dict) -> dict:
    """The row's job key: data kind, sequence, micro batch, checkpointing and the measured plan's
    other keys, the job file's values with ``change`` applied (the config's defaults filled in)."""
    import dataclasses

    from training.config_sections import ParallelConfig

    default = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
    job = _job(name)
    t, p = job["train"], job["parallel"]
    plan = {"kind": "synthetic" if job["data"]["kind"] == "synthetic" else "chat", "seq_len": t["seq_len"],
            "micro_batch_size": t["micro_batch_size"], "global_batch_size": t["global_batch_size"],
            "strategy": p["strategy"],
            "activation_checkpointing": p.get("activation_checkpointing", default["activation_checkpointing"]),
            "reduce_dtype": p.get("grad_reduce_dtype", default["grad_reduce_dtype"]),
            "keep_gathered": p.get("keep_params_gathered", default["keep_params_gathered"])}
    return {**plan, **change}


def _label(name: str, change: dict, plan: dict) -> str:
    settings = ", ".join(f"{k} = {str(v).lower()}" for k, v in change.items())
    return f"{name} ({plan['strategy']}, seq {plan['seq_len']} x micro batch {plan['micro_batch_size']}, " \
           f"checkpointing {'on' if plan['activation_checkpointing'] else 'off'}" \
           f"{'; ' + settings if settings else ', as shipped'})"


def rows(figures: gpu_figures.Figures | None = None) -> list[dict]:
    """Per row of :data:`PLANS`: the old predictions, the new range (with and without the
    lever) and the measured memory per GPU."""
    import contextlib
    import dataclasses

    from charts.jobs import plan_job
    from environment import load_environment
    from environment.instances import INSTANCE_TYPES
    from raytrain_eks.planning.memory_estimate import usable_bytes
    from raytrain_eks.planning.step_model import DEFAULT_MFU, estimate_time

    env = load_environment(ROOT / "environment.toml")

    cluster = measured_plan.Cluster()
    instance = INSTANCE_TYPES[cluster.instance]
    figures = figures or gpu_figures.figures_for(instance.gpu_model, instance.network_gbps)
    shapes = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS[MODEL]})
    traces, results = step_model.load_traces(), measured_plan.load()
    out = []
    with contextlib.chdir(ROOT):  # plan_job reads the jobs' relative paths from the root
        for name, change in PLANS:
            plan = _plan(name, change)
            label = _label(name, change, plan)
            found = measured_plan.lookup(results, model=MODEL, **{k: plan[k] for k in (
                "strategy", "seq_len", "micro_batch_size", "activation_checkpointing", "reduce_dtype", "keep_gathered")})
            tr = step_model.find_trace(traces, model=MODEL, **{k: plan[k] for k in (
                "kind", "seq_len", "micro_batch_size", "activation_checkpointing")})
            if found is None or tr is None:
                out.append({"job": label, "missing": "no measured plan" if found is None else "no trace"})
                continue
            found = {**found, "global_batch_size": plan["global_batch_size"]}
            old = measured_plan.predict(found, cluster)
            found["grad_accum_steps"] = old["grad_accum_steps"]
            # the hand model of raytrain_eks/planning/step_model.py (estimate_time), on the job as the shipped spec sizes it
            config = plan_job(env, ROOT / "jobs" / f"{name}.toml", ROOT).config
            config = dataclasses.replace(
                config, train=dataclasses.replace(config.train, micro_batch_size=plan["micro_batch_size"]),
                parallel=dataclasses.replace(config.parallel, activation_checkpointing=plan["activation_checkpointing"]))
            hand = estimate_time(env, config, shapes, DEFAULT_MFU)
            new = step_model.predict(tr, found, cluster, shapes, figures, last_backward_lever=plan["keep_gathered"])
            without = step_model.predict(tr, found, cluster, shapes, figures, last_backward_lever=False)
            required = measured_plan.required_bytes(found)
            out.append({"job": label, "shipped": not change, "kind": plan["kind"], "accum": old["grad_accum_steps"],
                        "hand": (hand["step_s"], hand["effective_mfu"]), "old": old, "new": new, "without_lever": without,
                        "peak_gib": found["peak_bytes"] / 1024**3, "required_gib": required / 1024**3,
                        "fits": required <= usable_bytes(instance.gpu_memory_gib)})
    return out


def table(results: list[dict]) -> str:
    lines = ["| job | data | peak GiB per L4 (tensors / with overhead + 10 %) | old: hand (step_model.py estimate_time, MFU 0.30 stated) "
             "s / MFU | old: measured_plan.py s / MFU | new, lever off: s / MFU | new (lever on): s / MFU |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "missing" in r:
            lines.append(f"| {r['job']} | {r['missing']} | | | | | |")
            continue
        rng = lambda p: f"{p['step_s'][0]:.2f}-{p['step_s'][1]:.2f} / {p['mfu'][0]:.2f}-{p['mfu'][1]:.2f}"
        fits = "" if r["fits"] else " (does not fit)"
        lines.append(f"| {r['job']}, {r['accum']} micro batches | {r['kind']} "
                     f"| {r['peak_gib']:.2f} / {r['required_gib']:.2f}{fits} "
                     f"| {r['hand'][0]:.2f} / {r['hand'][1]:.2f} | {r['old']['step_s']:.2f} / {r['old']['mfu']:.2f} "
                     f"| {rng(r['without_lever'])} | {rng(r['new'])} |")
    shown = next((r for r in results if "new" in r and r["shipped"]), None)
    if shown:
        lines += ["", f"Terms of {shown['job']} (seconds per step, fast end - slow end):", "",
                  "| term | s |", "|---|---|"]
        lines += [f"| {k} | {a:.2f}-{b:.2f} |" for k, (a, b) in shown["new"]["terms"].items()]
        lines += ["", "| source | figure |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in shown["new"]["sources"].items()]
        lines += ["", f"Assumed: {', '.join(shown['new']['assumed']) or 'nothing'}"]
    return "\n".join(lines)


FAMILY_LORA = {"rank": 16, "alpha": 32, "dropout": 0.05}  # jobs/family/lora-*.toml
FAMILY_TRACES = tuple((model, lora, micro, checkpointing)
                      for micro, checkpointing in ((1, True), (1, False), (2, True))
                      for model, lora in (("Qwen2.5-0.5B", None), ("Qwen2.5-3B", None), ("Qwen2.5-7B", FAMILY_LORA),
                                          ("Qwen2.5-7B", None), ("Qwen2.5-14B", FAMILY_LORA))) + (
    ("Qwen2.5-0.5B", None, 2, False),)
"""The micro batches of the family jobs the plan search prices (raytrain_eks/planning/plan_search.py):
micro batch 1 with and without checkpointing, micro batch 2 with it (and without for the 0.5B,
whose activations allow it); chat data at seq 2048. ``--trace-family`` records them (about
20 minutes on the loaded 2-core machine: the 14B's micro batch 2 alone took 5.6)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help=f"re-measure the traces into {step_model.TRACES.name}")
    parser.add_argument("--trace-family", action="store_true",
                        help=f"add the family jobs' traces (FAMILY_TRACES) to {step_model.TRACES.name}")
    args = parser.parse_args()
    if args.trace_family:
        traces = step_model.load_traces()
        for model, lora, micro, checkpointing in FAMILY_TRACES:
            fresh = trace("chat", 2048, micro, checkpointing, model_name=model, lora=lora)
            traces = [t for t in traces if (t["model"], t["kind"], t["seq_len"], t["micro_batch_size"],
                                            t.get("activation_checkpointing", False), t.get("lora")) != (
                fresh["model"], "chat", 2048, micro, checkpointing, fresh["lora"])] + [fresh]
            step_model.TRACES.write_text(json.dumps({"traces": traces}, indent=1) + "\n")
    if args.trace:  # the micro batch of every row of PLANS
        keys = ("kind", "seq_len", "micro_batch_size", "activation_checkpointing")
        wanted = sorted({tuple(_plan(n, c)[k] for k in keys) for n, c in PLANS})
        traces = [trace(*w) for w in wanted]
        step_model.TRACES.write_text(json.dumps({"traces": traces}, indent=1) + "\n")
    results = rows()
    print(table(results))
    # the last line, for `make bench` (bench/run_all.py): the ranges of each row
    print(json.dumps({"name": "step_model", **{r["job"]: {"step_s": r["new"]["step_s"], "mfu": r["new"]["mfu"],
                                                        "step_s_without_lever": r["without_lever"]["step_s"],
                                                        "old_step_s": r["old"]["step_s"],
                                                        "required_gib": round(r["required_gib"], 2)}
                                              for r in results if "new" in r}}))


if __name__ == "__main__":
    main()
