"""Per-GPU memory, FLOPs and collective bytes of the FULL-SIZE job, measured on CPU by the real code.

No GPU and no weights: the model is built from its config under ``FakeTensorMode`` (shapes and
dtypes only), rank 0 of a fake process group of 2 x 4 ranks (2 x g6.12xlarge) runs the job's
own code (``training.parallel.parallelize`` on the shipped mesh, ``training.model.loss_inputs``
/ ``loss_from_inputs``, ``training.loop``'s accumulation helpers, AdamW), and torch measures:

- memory: ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (every tensor FSDP2,
  autograd and the optimizer allocate, by category), peak over a second optimizer step;
- FLOPs executed: ``torch.utils.flop_counter.FlopCounterMode`` over one micro batch (forward +
  backward, recompute included), against the model FLOPs of training/flops.py;
- collectives: every ``torch.distributed`` collective FSDP2 issues, with its buffer bytes and
  group (intra-node shard group / cross-node replicate group), per micro batch.

"today" is the code before the packed attention (training/model.py; commit f6968c4): transformers' sdpa path with
its dense per-document mask, full-vocabulary logits copied to fp32, accumulation with the
parameters gathered and the unsharded fp32 gradient kept until the last micro batch (their
few lines are repeated here as ``_todays_*``). "after" is the shipped code; a row without
``loss_head: true`` was measured before the output layer ran in chunks (training/model.py: ChunkedLossHead).

Run: ``.venv/bin/python bench/bench_full_size_plan.py [--models Qwen2.5-1.5B,Qwen2.5-7B]``, or
``--jobs jobs/family/lora-qwen2.5-7b.toml,...``: each shipped job's own plan (docs/jobs.md)
(a few minutes per variant on an idle machine; ``make bench`` runs them all). Writes
``bench/results/full_size_plan.json``; ``--publish`` also writes the copy the preflight reads
(raytrain_eks/planning/measured_plan.json); ``--table`` prints the results as Markdown.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from raytrain_eks.planning.measured_plan import (MODEL_CONFIGS, PUBLISHED, RESULTS, Cluster, job_plan, lora_key,  # noqa: E402
                                        predict, published_model)

SEQ_LEN, MICRO_BATCH, GLOBAL_BATCH = 2048, 1, 64  # jobs/finetune-qwen2.5-1.5b.toml
DOC_LENGTHS = (700, 420, 310, 618)
"""Packed chat block: four conversations filling 2048 tokens; each one's last 60 % (the
assistant's reply) are the targets."""
MEASURED_ACCUM = 3
"""Micro batches measured per step: the first, a middle one and the last show each kind's
collectives (a schedule that keeps parameters gathered gathers only in the first); a step of
``A`` is ``first + (A - 2) x middle + last``."""
_COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
                "all_reduce")


def packed_chat_batch(rows: int = MICRO_BATCH, seq_len: int = SEQ_LEN) -> dict[str, torch.Tensor]:
    """Host tensors of ``rows`` packed blocks: :data:`DOC_LENGTHS` scaled to ``seq_len``, each
    document's first 40 % a prompt (label -100), positions restarting at every document."""
    lengths = [n * seq_len // sum(DOC_LENGTHS) for n in DOC_LENGTHS]
    lengths[-1] += seq_len - sum(lengths)
    ids = torch.randint(0, 150000, (rows, seq_len), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(rows, -1).contiguous()
    labels = ids.clone()
    at = 0
    for n in lengths:
        labels[:, at:at + int(n * 0.4)] = -100
        labels[:, at] = -100
        at += n
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


_KINDS = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
          "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "all_reduce": "all_reduce"}


def _buffer(name: str, args: tuple, kwargs: dict) -> int:
    """Bytes of the collective's full buffer: the gathered output, the input to reduce-scatter,
    the all-reduced tensor."""
    if name.startswith("all_gather"):
        tensor = kwargs.get("output_tensor", args[0] if args else None)
    elif name.startswith("reduce_scatter"):
        tensor = kwargs.get("input", kwargs.get("input_tensor", args[1] if len(args) > 1 else None))
    else:
        tensor = kwargs.get("tensor", args[0] if args else None)
    return tensor.numel() * tensor.element_size()


class _Collectives:
    """Wraps the torch.distributed collectives: per micro batch, per kind and group size."""

    def __init__(self):
        self.rows: list[dict] = []
        self.micro = 0
        self.originals = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}

    def __enter__(self):
        for name, original in self.originals.items():
            def counted(*args, _name=name, _original=original, **kwargs):
                group = kwargs.get("group")
                if group is not None:  # the step's own token-count all-reduces use the default group
                    self.rows.append({"micro": self.micro, "kind": _KINDS[_name], "group_size": dist.get_world_size(group),
                                      "bytes": _buffer(_name, args, kwargs)})
                return _original(*args, **kwargs)
            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(dist, name, original)


def _todays_mask(config, batch):
    """The dense mask transformers' sdpa path builds from packed position_ids (built here, before
    the fake mode, because its packed-sequence check reads a tensor on the host)."""
    from transformers.masking_utils import create_causal_mask

    config = type(config)(**config.to_dict())
    config._attn_implementation = "sdpa"
    embeds = torch.empty(*batch["input_ids"].shape, 1)
    return create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None, past_key_values=None,
                              position_ids=batch["position_ids"])


def _todays_loss(model, batch):
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"],
                   use_cache=False).logits
    shift = logits[:, :-1, :].float()
    return torch.nn.functional.cross_entropy(shift.reshape(-1, shift.size(-1)), batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=-100, reduction="sum")


def _todays_begin_micro_batch(model, index, count):
    from training.parallel import reshard_plan

    if index == 0:
        for module, _ in reshard_plan(model, model._raytrain_strategy):
            module.set_reshard_after_forward(False, recurse=False)
    model.set_requires_gradient_sync(index == count - 1)
    model.set_reshard_after_backward(index == count - 1)


def _flop_mapping():
    """CPU flash attention is not in torch's FLOP table: count it with torch's own SDPA formulas
    (keys/values expanded to the query heads, as the GPU kernels' counts are)."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def fwd(query_shape, key_shape, value_shape, *args, **kwargs):
        return fc.sdpa_flop_count(query_shape, (*key_shape[:1], query_shape[1], *key_shape[2:]),
                                  (*value_shape[:1], query_shape[1], *value_shape[2:]))

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape,
                                           (*key_shape[:1], query_shape[1], *key_shape[2:]),
                                           (*value_shape[:1], query_shape[1], *value_shape[2:]))

    return {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}


def measure(model_name: str, *, code: str, activation_checkpointing: bool, strategy: str = "hybrid_shard",
            reduce_dtype: str = "float32", keep_gathered: bool = False, cluster: Cluster = Cluster(),
            loss_head: bool = True, cpu_offload: bool = False, lora: dict | None = None, probe=None,
            micro_batch_size: int = MICRO_BATCH, accumulation: str = "sharded", checkpoint_every: int = 1) -> dict:
    """One variant's figures. ``micro_batch_size``: rows per micro batch, the global batch (and
    so the tokens per step) unchanged: fewer, larger micro batches. ``cpu_offload``:
    ``parallel.cpu_offload`` with the job's own AdamW (training/optim.py: on host-held
    parameters ``auto`` is foreach, whose temporaries are host memory too); ``probe``
    (bench/bench_offload_transfer.py's): a tracker class, entered around the measured micro
    batches, told each one's index, and adding its figures to the result.
    ``lora``: the options of a ``[[model.transforms]]`` LoRA entry, applied as build_model applies
    it (training/model_transforms/lora.py: the base frozen in its dtype, float32 adapters), the
    optimizer over the adapters only, as training/optim.py builds it from the trainable ones.
    ``checkpoint_every``: with checkpointing, every k-th block only (training/parallel.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training import flops
    from training.model import loss_from_inputs, loss_inputs, use_chunked_loss_head, use_packed_attention
    from training.parallel import begin_micro_batch, end_accumulation, mesh_plan, parallelize

    plan = mesh_plan(strategy, cluster.world_size, cluster.gpus_per_node)
    mesh = init_device_mesh("cpu", plan.shape, mesh_dim_names=plan.dim_names)
    config = Qwen2Config(**MODEL_CONFIGS[model_name])
    accum = GLOBAL_BATCH // (cluster.world_size * micro_batch_size)
    batch = packed_chat_batch(micro_batch_size)
    prepared = loss_inputs(None, batch, packed=True)  # host work, before the fake mode
    began = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        # A LoRA job loads its base in the adapters' base dtype (jobs/family/lora-*.toml: model.dtype)
        load_dtype = getattr(torch, lora_key(lora)["base_dtype"]) if lora is not None else torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=load_dtype)
        model.config.use_cache = False
        if code == "after":
            use_packed_attention(model)
            if lora is not None:  # the transform comes before the loss head, as in build_model
                from training.model_transforms import lora as lora_transform

                lora_transform.apply(model, lora)
            if loss_head:  # the output layer and the loss in chunks (training/model.py: ChunkedLossHead), as build_model does
                use_chunked_loss_head(model)
        else:
            batch = {**batch, "attention_mask": _todays_mask(config, batch)}
        with _unpinned():  # a fake tensor cannot be pinned; pinning changes where, not how much
            parallelize(model, mesh, strategy=strategy, on_gpu=True, activation_checkpointing=activation_checkpointing,
                        keep_gathered=keep_gathered, reduce_dtype=reduce_dtype, cpu_offload=cpu_offload,
                        accumulation=accumulation, checkpoint_every=checkpoint_every)
        if cpu_offload:
            from training.config_sections import OptimConfig, TrainConfig
            from training.optim import build_optimizer

            optimizer = build_optimizer(model, TrainConfig(), OptimConfig())
        else:  # on the GPU the job's AdamW is fused: per tensor here, no foreach temporaries
            optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5, foreach=False)
        tracker = (probe.tracker_class if probe else FSDPMemTracker)(model, optimizer)
        collectives = _Collectives()
        watch = probe if probe else contextlib.nullcontext()
        if probe:
            probe.model = model
        # The FLOPs of one micro batch, counted on a step of its own before the memory is: under
        # torch's FlopCounterMode a checkpointed layer's recomputed activations outlive its
        # backward until the mode exits (measured: a tiny Qwen2's checkpointed peak grows by them,
        # a LoRA one's nearly doubles); no real step runs under that mode.
        (begin_micro_batch if code == "after" else _todays_begin_micro_batch)(model, 0, 1)
        with FlopCounterMode(display=False, custom_mapping=_flop_mapping()) as counter:
            (loss_from_inputs(model, *prepared) if code == "after" else _todays_loss(model, batch)).backward()
        executed = counter.get_total_flops()
        end_accumulation(model, MEASURED_ACCUM)  # the plan parallelize chose, as after any step
        optimizer.zero_grad(set_to_none=True)
        with tracker:
            # AdamW's state first (as after any earlier step), without a forward/backward
            for param in (q for q in model.parameters() if q.requires_grad):
                param.grad = torch.zeros_like(param)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with collectives, watch:
                for index in range(MEASURED_ACCUM):
                    tracker.reset_mod_stats()  # per-module stats are per forward; the peak is kept
                    (begin_micro_batch if code == "after" else _todays_begin_micro_batch)(model, index, MEASURED_ACCUM)
                    collectives.micro = watch.micro = index
                    loss = loss_from_inputs(model, *prepared) if code == "after" else _todays_loss(model, batch)
                    loss.backward()
                end_accumulation(model, MEASURED_ACCUM)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")
    device = next(iter(peak))
    breakdown = {key: int(value) for key, value in peak[device].items()}
    shapes = flops.ModelShapes.from_hf_config(config.to_dict())
    model_flops = flops.training_flops_per_token(shapes, SEQ_LEN) * SEQ_LEN * micro_batch_size
    result = {"model": model_name, "code": code, "strategy": strategy, "activation_checkpointing": activation_checkpointing,
              "reduce_dtype": reduce_dtype, "keep_gathered": keep_gathered, "compile": False, "seq_len": SEQ_LEN,
              "loss_head": code == "after" and loss_head,
              "micro_batch_size": micro_batch_size, "global_batch_size": GLOBAL_BATCH, "doc_lengths": list(DOC_LENGTHS),
              "peak_bytes": breakdown.pop("Total"), "peak_breakdown": breakdown,
              "executed_flops_per_micro_batch": int(executed), "model_flops_per_micro_batch": int(model_flops),
              "collectives": _per_step(collectives.rows, accum),
              "measure_s": round(time.perf_counter() - began, 1)}
    if cpu_offload:
        result["cpu_offload"] = True
    if accumulation != "sharded":  # a row without it accumulated sharded (measured_plan.lookup)
        result["accumulation"] = accumulation
    if checkpoint_every != 1:  # a row without it checkpointed every block (measured_plan.lookup)
        result["checkpoint_every"] = checkpoint_every
    if lora is not None:
        result["lora"] = lora_key(lora)
    if probe:
        result.update(probe.figures(tracker, accum))
    result["prediction"] = predict(result, cluster)
    return result


@contextlib.contextmanager
def _unpinned():
    """training.parallel's offload policy without pinned memory (FakeTensorMode implements no
    ``aten._pin_memory``)."""
    from unittest import mock

    from torch.distributed.fsdp import CPUOffloadPolicy

    with mock.patch("training.parallel.offload_policy", lambda on_gpu: CPUOffloadPolicy(pin_memory=False)):
        yield


def _per_step(rows: list[dict], accum: int) -> list[dict]:
    """Bytes per collective kind and group size for one step of ``accum`` micro batches."""
    out: dict[tuple[str, int], dict] = {}
    for row in rows:
        which = "first" if row["micro"] == 0 else "last" if row["micro"] == MEASURED_ACCUM - 1 else "middle"
        weight = (accum - 2) / (MEASURED_ACCUM - 2) if which == "middle" else 1
        entry = out.setdefault((row["kind"], row["group_size"]),
                               {"kind": row["kind"], "group_size": row["group_size"], "calls": 0, "bytes": 0,
                                "first_bytes": 0, "middle_bytes": 0, "last_bytes": 0})
        entry["calls"] += weight
        entry["bytes"] += weight * row["bytes"]
        entry[f"{which}_bytes"] += row["bytes"] / (MEASURED_ACCUM - 2 if which == "middle" else 1)
    return sorted(out.values(), key=lambda e: (e["kind"], e["group_size"]))


VARIANTS = (
    {"code": "today", "activation_checkpointing": True},
    {"code": "today", "activation_checkpointing": False},
    {"code": "after", "activation_checkpointing": True},
    {"code": "after", "activation_checkpointing": False},
    {"code": "after", "activation_checkpointing": False, "reduce_dtype": "bfloat16"},
    {"code": "after", "activation_checkpointing": False, "keep_gathered": True, "reduce_dtype": "bfloat16"},
    {"code": "after", "activation_checkpointing": False, "keep_gathered": True},
    # the shipped plan with checkpointing (a user's switch): its own measured plan and trace
    {"code": "after", "activation_checkpointing": True, "keep_gathered": True},
    # the lever "fewer, larger micro batches": 2 rows of 2048, the same 64 x 2048 tokens per step
    # in 4 micro batches instead of 8; without and with checkpointing (docs/gpu-step.md)
    {"code": "after", "activation_checkpointing": False, "keep_gathered": True, "micro_batch_size": 2},
    {"code": "after", "activation_checkpointing": True, "keep_gathered": True, "micro_batch_size": 2},
)
VARIANTS_7B = (
    {"code": "after", "activation_checkpointing": True, "strategy": "hybrid_shard"},
    {"code": "after", "activation_checkpointing": True, "strategy": "full_shard"},
)
VARIANTS_BY_MODEL = {"Qwen2.5-1.5B": VARIANTS, "Qwen2.5-7B": VARIANTS_7B}
"""The variants ``--models`` measures; a shipped job's own plan is measured with ``--jobs``."""


def job_variant(path: str) -> tuple[str, dict]:
    """The model and :func:`measure` arguments of a job's own plan (``--jobs``), keyed as the
    preflight looks it up (raytrain_eks/planning/measured_plan.py ``job_plan``); the model by its folder's
    name (``s3://{bucket}/models/Qwen2.5-7B-Instruct`` is ``Qwen2.5-7B``)."""
    from training.config import load_job_config

    job = load_job_config(path)
    plan, name = job_plan(job), published_model(job.model.path)
    if name is None:
        raise SystemExit(f"{path}: model.path {job.model.path!r}: no published shapes (known: {', '.join(MODEL_CONFIGS)})")
    if plan is None or plan["compile"] or plan["seq_len"] != SEQ_LEN:
        raise SystemExit(f"{path}: measured at seq {SEQ_LEN}, uncompiled, lora the only transform; the job has {plan}")
    keys = ("strategy", "activation_checkpointing", "reduce_dtype", "keep_gathered", "cpu_offload", "lora",
            "micro_batch_size", "accumulation", "checkpoint_every")
    return name, {"code": "after", **{key: plan[key] for key in keys}}


def table(results: list[dict], cluster: Cluster = Cluster()) -> str:
    """The results as a Markdown table (predictions recomputed by measured_plan.predict)."""
    from raytrain_eks.planning.measured_plan import required_bytes

    gib, gb = 1024**3, 1e9
    rows = ["| model | code | checkpointing | reduce | kept gathered | strategy | micro batch | peak GiB/GPU (tensors) "
            "| with overhead + 10% "
            "| FLOPs executed / model | all-gather GB | reduce-scatter GB | all-reduce GB | PCIe GB/GPU | EFA GB/node "
            "| compute s | exposed s | step s | MFU |", "|" + "---|" * 19]
    for r in results:
        p = predict(r, cluster)
        comm = {kind: sum(c["bytes"] for c in r["collectives"] if c["kind"] == kind) / gb
                for kind in ("all_gather", "reduce_scatter", "all_reduce")}
        label = r["model"] + (f" + LoRA r {r['lora']['rank']}" if r.get("lora") else "") + (
            " + cpu_offload (peak: GPU and host)" if r.get("cpu_offload") else "")
        rows.append(f"| {label} | {r['code']} | {'on' if r['activation_checkpointing'] else 'off'} | {r['reduce_dtype']} "
                    f"| {'yes' if r['keep_gathered'] else 'no'} | {r['strategy']} | {r['micro_batch_size']} | {r['peak_bytes'] / gib:.2f} "
                    f"| {required_bytes(r) / gib:.2f} | {p['executed_over_model_flops']:.3f} | {comm['all_gather']:.1f} "
                    f"| {comm['reduce_scatter']:.1f} | {comm['all_reduce']:.1f} | {p['pcie_bytes_per_gpu'] / gb:.1f} "
                    f"| {p['efa_bytes_per_node'] / gb:.1f} | {p['compute_s']:.2f} | {p['exposed_comm_s']:.2f} "
                    f"| {p['step_s']:.2f} | {p['mfu']:.3f} |")
    return "\n".join(rows)


def jobs_table(paths: list[str], results: list[dict], cluster: Cluster = Cluster()) -> str:
    """One row per job (``--jobs ... --table``): its measured plan's memory per GPU with the
    CUDA/NCCL overhead and fragmentation, FLOPs executed / model FLOPs, collective GB per GPU per
    step, and the predicted step (the preflight's point, and its range over the published rates)."""
    from raytrain_eks.planning.measured_plan import host_bytes_per_gpu, lookup, predict_range, required_bytes

    rows = ["| job | model | plan | GiB per L4 (with overhead) | host GiB per node | FLOPs executed / model "
            "| collectives GB per GPU per step | predicted step s (range) | MFU |", "|" + "---|" * 9]
    for path in paths:
        name, variant = job_variant(path)
        r = lookup(results, model=name, seq_len=SEQ_LEN, **{k: v for k, v in variant.items() if k != "code"})
        if r is None:
            rows.append(f"| {Path(path).stem} | {name} | not measured | | | | | | |")
            continue
        p, (fast, slow) = predict(r, cluster), predict_range(r, cluster)
        every = r.get("checkpoint_every", 1)
        plan = (f"{r['strategy']}, checkpointing {'on' if r['activation_checkpointing'] else 'off'}"
                + (f" every {every}th block" if every > 1 else "")
                + (", kept gathered" if r["keep_gathered"] else "") + (", cpu_offload" if r.get("cpu_offload") else "")
                + (f", LoRA r {r['lora']['rank']}" if r.get("lora") else ""))
        host = host_bytes_per_gpu(r) * cluster.gpus_per_node / 1024**3
        rows.append(f"| {Path(path).stem} | {name} | {plan} | {required_bytes(r) / 1024**3:.1f} "
                    f"| {f'{host:.0f}' if host else '-'} | {p['executed_over_model_flops']:.2f} "
                    f"| {sum(c['bytes'] for c in r['collectives']) / 1e9:.1f} | {p['step_s']:.1f} ({fast:.1f}-{slow:.1f}) "
                    f"| {p['mfu']:.2f} |")
    return "\n".join(rows)


HOST = ("Sharded Param", "Sharded Grad", "OptState")
"""(:class:`OffloadProbe`) FSDPMemTracker's categories CPUOffloadPolicy keeps in host memory (the step's own allocations
are ``OptState`` to the tracker: it marks everything the optimizer step makes)."""
STAGED = ("Sharded Param", "OptState")
"""What a checkpoint copies into pinned host memory (the model and optimizer state)."""

class OffloadProbe:
    """Counts the copies per micro batch and splits the memory peak (see the module docstring)."""

    def __init__(self):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        probe = self
        self.model = None
        """Set by the measurement once the model is sharded."""
        self.micro = 0
        self.h2d: dict[int, int] = {}
        self.d2h: dict[int, int] = {}
        self.largest_unit = 0
        self.peaks = {"gpu": (0, {}), "host": (0, {})}

        class Tracker(FSDPMemTracker):
            """DTensor's sharding propagation builds its ops' arguments at their GLOBAL shape
            under the ambient fake mode (torch 2.13 ``distributed/tensor/_sharding_prop.py``
            ``_propagate_tensor_meta_non_cached``); in a real run that is a private fake mode
            and no memory, under this bench's fake mode the tracker would count it (a foreach
            AdamW step over every shard at full size): peaks are not taken while it runs."""

            propagating = 0

            def __enter__(self):
                from torch.distributed.tensor._sharding_prop import ShardingPropagator

                self._propagator = ShardingPropagator
                self._original = original = ShardingPropagator._propagate_tensor_meta_non_cached
                tracker = self

                def propagate(*args, **kwargs):
                    tracker.propagating += 1
                    try:
                        return original(*args, **kwargs)
                    finally:
                        tracker.propagating -= 1

                ShardingPropagator._propagate_tensor_meta_non_cached = propagate
                return super().__enter__()

            def __exit__(self, *exc):
                self._propagator._propagate_tensor_meta_non_cached = self._original
                return super().__exit__(*exc)

            def _update_peak_stats(self, peak_state) -> None:
                if self.propagating:
                    return
                super()._update_peak_stats(peak_state)
                for snap in self._curr_mem_snap.values():
                    host = sum(snap.get(key, 0) for key in HOST)
                    probe._peak("host", host, snap)
                    probe._peak("gpu", snap["Total"] - host, snap)

        self.tracker_class = Tracker

    def _peak(self, where: str, value: int, snap: dict) -> None:
        if value > self.peaks[where][0]:
            keys = HOST if where == "host" else [k for k in snap if k not in HOST and k != "Total"]
            self.peaks[where] = (value, {key: int(snap.get(key, 0)) for key in keys})

    def __enter__(self):
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        self._module, self._original = _fsdp_collectives, _fsdp_collectives._get_param_all_gather_inputs

        def counted(fsdp_params):
            unit = sum(p._sharded_param_data.numel() * p._sharded_param_data.element_size()
                       for p in fsdp_params if p.offload_to_cpu)
            self.h2d[self.micro] = self.h2d.get(self.micro, 0) + unit
            self.largest_unit = max(self.largest_unit, unit)
            return self._original(fsdp_params)

        _fsdp_collectives._get_param_all_gather_inputs = counted
        # model.parameters() are FSDP2's sharded parameters, the tensors foreach_reduce hands .grad to
        self._hooks = [param.register_post_accumulate_grad_hook(self._gradient)
                       for param in self.model.parameters() if param.requires_grad]
        return self

    def _gradient(self, param) -> None:
        local = param.grad._local_tensor if hasattr(param.grad, "_local_tensor") else param.grad
        self.d2h[self.micro] = self.d2h.get(self.micro, 0) + local.numel() * local.element_size()

    def __exit__(self, *exc):
        self._module._get_param_all_gather_inputs = self._original
        for hook in self._hooks:
            hook.remove()
        return False

    def figures(self, tracker, accum: int) -> dict:
        """The result's offload fields: per micro batch (first, middle, last) and per step of
        ``accum`` micro batches, the peaks, and what a checkpoint stages on the host."""
        def step(counts: dict[int, int]) -> dict:
            first, last = counts.get(0, 0), counts.get(MEASURED_ACCUM - 1, 0)
            middle = sum(counts.get(i, 0) for i in range(1, MEASURED_ACCUM - 1)) / max(1, MEASURED_ACCUM - 2)
            return {"first_bytes": first, "middle_bytes": middle, "last_bytes": last,
                    "step_bytes": int(first + max(0, accum - 2) * middle + last)}

        now = next(iter(tracker.get_tracker_snapshot("current").values()), {})
        return {"offload": {
            "h2d": step(self.h2d), "d2h": step(self.d2h),
            "gpu_peak_bytes": self.peaks["gpu"][0], "gpu_peak_breakdown": self.peaks["gpu"][1],
            "gpu_staging_bytes": 3 * self.largest_unit, "largest_unit_h2d_bytes": self.largest_unit,
            "host_peak_bytes": self.peaks["host"][0], "host_peak_breakdown": self.peaks["host"][1],
            "checkpoint_staging_bytes": int(sum(now.get(key, 0) for key in STAGED)),
            "pinned_rounding_bytes": self.pinned_rounding(),
        }}

    def pinned_rounding(self) -> int:
        """What pinning adds on the host over the tracked bytes: one pinned allocation per
        parameter (its padded shard) and per gradient shard, each rounded up to a power of two
        (raytrain_eks/planning/memory_estimate.py ``pinned_host_bytes``)."""
        from torch.distributed.fsdp import FSDPModule

        from raytrain_eks.planning.memory_estimate import pinned_rounding

        shards = []
        for module in self.model.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            for p in (group.fsdp_params if group else []):
                if p.offload_to_cpu:
                    size = p._sharded_param_data.element_size()
                    shards.append(p._sharded_param_data.numel() * size)
                    if p.sharded_param.requires_grad:
                        shards.append(p.sharded_size.numel() * size)
        return pinned_rounding(shards)


def save(results: list[dict], out: Path, cluster: Cluster, *, publish: bool) -> list[dict]:
    """Write ``results`` into ``out`` (and the preflight's copy with ``publish``): a run of some
    variants replaces those and keeps the others already measured. Returns all of them."""
    key = lambda r: tuple(json.dumps(r.get(k, False), sort_keys=True) for k in (
        "model", "code", "strategy", "activation_checkpointing", "reduce_dtype", "keep_gathered", "compile", "seq_len",
        "micro_batch_size", "cpu_offload", "lora", "accumulation", "checkpoint_every"))
    start = out if out.is_file() else PUBLISHED  # a fresh checkout has only the published copy
    previous = json.loads(start.read_text())["results"] if start.is_file() else []
    fresh = {key(r) for r in results}
    results = [r for r in previous if key(r) not in fresh] + results
    text = json.dumps({"cluster": cluster.to_dict(), "results": results}, indent=1) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if publish:
        PUBLISHED.write_text(text)
    return results


def main() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Qwen2.5-1.5B,Qwen2.5-7B")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--variants", default="", help="indices into the model's variant list (default: all)")
    parser.add_argument("--publish", action="store_true", help=f"also write {PUBLISHED.name} for the preflight")
    parser.add_argument("--table", action="store_true", help="print the results file as a Markdown table and exit")
    parser.add_argument("--jobs", default="", help="comma-separated job files: measure each one's own plan instead")
    args = parser.parse_args()
    cluster = Cluster()
    if args.table:
        source = Path(args.out) if Path(args.out).is_file() else PUBLISHED
        results = json.loads(source.read_text())["results"]
        print(jobs_table(args.jobs.split(","), results, cluster) if args.jobs else table(results, cluster))
        return
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cluster.world_size)
    if args.jobs:
        runs = [job_variant(path) for path in args.jobs.split(",")]
    else:
        runs = []
        for name in args.models.split(","):
            variants = VARIANTS_BY_MODEL[name]
            chosen = [int(i) for i in args.variants.split(",")] if args.variants else range(len(variants))
            runs += [(name, variants[i]) for i in chosen]
    results = []
    for name, variant in runs:
        if variant.get("cpu_offload"):  # the host<->GPU copies and the GPU/host split too
            variant = {**variant, "probe": OffloadProbe()}
        results.append(measure(name, cluster=cluster, **variant))
        print(json.dumps({k: results[-1][k] for k in ("model", "code", "activation_checkpointing", "micro_batch_size",
                                                      "peak_bytes", "measure_s")}), file=sys.stderr, flush=True)
    out = Path(args.out)
    results = save(results, out, cluster, publish=args.publish)
    print(json.dumps({"name": "full_size_plan", "written": str(out), "variants": len(results),
                      "peak_gib": {f"{r['model']} {r['code']} ckpt={r['activation_checkpointing']} kept={r['keep_gathered']} "
                                   f"reduce={r['reduce_dtype']} micro={r['micro_batch_size']}": round(r["peak_bytes"] / 1024**3, 2) for r in results}}))


if __name__ == "__main__":
    main()
