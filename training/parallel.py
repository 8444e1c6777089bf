"""Parallelism in one place: the device mesh per strategy and ``parallelize()``.

Order (as in torchtitan's parallelize.py): activation checkpointing, optional torch.compile per
block, then FSDP2 ``fully_shard`` on every decoder layer and finally on the root (embeddings,
final norm and the - possibly tied - output layer stay together in the root's group).

Strategies, all with FSDP2 so there is one code path:
- ``full_shard``: a 1-D mesh over all ranks; parameters, gradients and optimizer state sharded.
- ``hybrid_shard``: a 2-D mesh ``(nodes, workers_per_node)`` named ``("replicate", "shard")``:
  shard inside a node (fast NVLink/PCIe), all-reduce across nodes (the network, EFA).
- ``no_shard``: a 2-D mesh ``(world, 1)``: every rank holds everything and gradients are
  all-reduced, i.e. DDP-equivalent.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.config_checks import ACCUMULATIONS
from training.model import decoder_layers


@dataclass(frozen=True, kw_only=True, slots=True)
class MeshPlan:
    """The mesh shape for a strategy; ``dim_names`` matches ``shape``."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]


def mesh_plan(strategy: str, world_size: int, workers_per_node: int) -> MeshPlan:
    """The mesh a strategy needs on ``world_size`` ranks with ``workers_per_node`` per node."""
    if strategy == "full_shard":
        return MeshPlan(shape=(world_size,), dim_names=("shard",))
    if strategy == "no_shard":
        return MeshPlan(shape=(world_size, 1), dim_names=("replicate", "shard"))
    if strategy == "hybrid_shard":
        if world_size % workers_per_node:
            raise ValueError(f"hybrid_shard: world size {world_size} is not a multiple of workers_per_node {workers_per_node}")
        return MeshPlan(shape=(world_size // workers_per_node, workers_per_node), dim_names=("replicate", "shard"))
    raise ValueError(f"unknown strategy {strategy!r} (allowed: full_shard, hybrid_shard, no_shard)")


def backend_for(on_gpu: bool, cpu_offload: bool = False) -> str:
    """NCCL between GPUs, gloo on CPU. With ``cpu_offload`` on GPUs both, by device: the
    gradient shards live in host memory, so the gradient clip's norm is a CPU DTensor whose
    all-reduce needs a CPU backend (torch 2.13 ``distributed_c10d.py``: ``"<device>:<backend>,..."``
    picks the backend by the tensor's device; Ray 2.58 ``train/torch/config.py``
    ``_is_backend_nccl`` takes such a list as NCCL)."""
    if on_gpu and cpu_offload:
        return "cpu:gloo,cuda:nccl"
    return "nccl" if on_gpu else "gloo"


def check_node_grouping(strategy: str, workers_per_node: int, local_world_size: int | None) -> None:
    """hybrid_shard shards inside a node: the ranks of one mesh row must share a node, so the
    ranks per node Ray placed must equal ``workers_per_node`` (None: not known, outside Ray)."""
    if strategy == "hybrid_shard" and local_world_size is not None and local_world_size != workers_per_node:
        raise ValueError(f"parallel.workers_per_node: {workers_per_node} but this node runs {local_world_size} "
                         "workers: hybrid_shard would shard across nodes (set it to the GPUs per node)")


def build_mesh(strategy: str, workers_per_node: int, on_gpu: bool, local_world_size: int | None = None) -> DeviceMesh:
    """The device mesh over the already-initialised default process group."""
    check_node_grouping(strategy, workers_per_node, local_world_size)
    plan = mesh_plan(strategy, dist.get_world_size(), workers_per_node)
    return init_device_mesh("cuda" if on_gpu else "cpu", plan.shape, mesh_dim_names=plan.dim_names)


def parallelize(model: torch.nn.Module, mesh: DeviceMesh, *, strategy: str, on_gpu: bool,
                activation_checkpointing: bool = False, compile: bool = False,
                keep_gathered: bool = False, reduce_dtype: str = "float32", cpu_offload: bool = False,
                accumulation: str = "sharded", checkpoint_every: int = 1) -> torch.nn.Module:
    """Apply activation checkpointing, optional compile and FSDP2 to ``model`` in place.

    On GPU parameters are gathered in bfloat16 and gradients reduced in ``reduce_dtype``
    (``MixedPrecisionPolicy``); on CPU everything stays float32. ``cpu_offload``: FSDP2's
    ``CPUOffloadPolicy`` (:func:`offload_policy`). ``accumulation``: ``sharded`` (every micro
    batch reduce-scatters) or ``local`` (one reduce-scatter per step): :func:`begin_micro_batch`.
    ``checkpoint_every``: with ``activation_checkpointing``, every k-th block only
    (:func:`checkpoint_activations`).
    """
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation {accumulation!r} (allowed: {', '.join(ACCUMULATIONS)})")
    from torch.distributed.fsdp import fully_shard

    if activation_checkpointing:
        checkpoint_activations(model, every=checkpoint_every)
    if compile:
        for layer in decoder_layers(model):
            layer.compile()
    kwargs = {"mesh": mesh}
    if on_gpu or reduce_dtype != "float32":  # on CPU: fp32 compute, the reduction dtype as asked
        kwargs["mp_policy"] = mixed_precision_policy(reduce_dtype, param_dtype="bfloat16" if on_gpu else None)
    if cpu_offload:
        kwargs["offload_policy"] = offload_policy(on_gpu)
    for layer, reshard in reshard_plan(model, strategy):
        fully_shard(layer, reshard_after_forward=reshard, **kwargs)
    model._raytrain_strategy = strategy  # the accumulation helpers restore this plan
    model._raytrain_keep_gathered = keep_gathered  # parameters stay gathered across micro-batches
    model._raytrain_accumulation = accumulation
    model._raytrain_cpu_offload = cpu_offload  # training/optim.py: the host AdamW kernel
    return model


def checkpoint_activations(model: torch.nn.Module, every: int = 1) -> None:
    """Checkpoint every ``every``-th decoder layer (blocks k, 2k, ... counted from 1, as
    torchtitan's per-layer selective checkpointing, ``_apply_ac_to_transformer_block``): backward
    runs those layers' forward again (transformers 5.13 ``GradientCheckpointingLayer``, only while
    ``model.training``); the others keep their activations. Non-reentrant checkpointing composes
    with FSDP2 and torch.compile. One definition: the job, the measured plans
    (bench/bench_full_size_plan.py) and the step model's trace (bench/bench_step_model.py) apply
    it the same way.

    ``gradient_checkpointing_enable`` turns it on for every module with a
    ``gradient_checkpointing`` flag (transformers 5.13 ``modeling_utils.py``
    ``_set_gradient_checkpointing``) and makes the embeddings' output require grad (so a
    checkpointed first block of a frozen base still backpropagates); the blocks left out get
    their flag back off, and ``GradientCheckpointingLayer.__call__`` then runs them plainly."""
    if every < 1:
        raise ValueError(f"checkpoint_every {every!r}: must be at least 1")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for index, layer in enumerate(decoder_layers(model), start=1):
        layer.gradient_checkpointing = index % every == 0


def mixed_precision_policy(reduce_dtype: str = "float32", param_dtype: str | None = "bfloat16"):
    """bf16 all-gathers and compute; gradients reduced in ``reduce_dtype`` (fp32 by default;
    bf16 halves the reduce-scatter and cross-node all-reduce bytes). The master weights and
    AdamW stay fp32 either way. The micro batches are summed in fp32 only where FSDP2 casts each
    one to the fp32 ``.grad``: full_shard, or a single micro batch. While hybrid_shard's or
    no_shard's all-reduce is held back (:func:`begin_micro_batch`), FSDP2 sums them in a
    ``reduce_dtype`` buffer (torch 2.13 ``_fsdp_collectives.py`` ``foreach_reduce``), so the job
    config refuses bf16 there (training/config.py)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype) if param_dtype else None,
                                reduce_dtype=getattr(torch, reduce_dtype))


def offload_policy(on_gpu: bool):
    """FSDP2's CPU offload (torch 2.13 ``_fully_shard/_fsdp_api.py`` ``CPUOffloadPolicy``): each
    sharded parameter lives in host memory and is copied to the GPU before its all-gather; each
    gradient shard is copied to the host after its reduce-scatter (``_fsdp_collectives.py``
    ``foreach_reduce``); the optimizer's state is made where the parameters are, so AdamW steps
    on the CPU (``optim.kernel = "auto"`` then picks foreach: training/optim.py). Pinned host
    memory on GPU nodes (the copies overlap compute); a CPU-only run cannot pin (no accelerator)
    and has nothing to copy."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=on_gpu)


def reshard_plan(model: torch.nn.Module, strategy: str) -> list[tuple[torch.nn.Module, bool]]:
    """``(module, reshard_after_forward)`` for every FSDP unit: the blocks, then the root.

    With nothing to shard (no_shard) re-gathering after forward would only cost time; the last
    block's parameters are needed again right away by backward; the root (embeddings, norm,
    output layer) stays gathered from forward into backward.
    """
    layers = decoder_layers(model)
    reshard = strategy != "no_shard"
    return [(layer, reshard and index < len(layers) - 1) for index, layer in enumerate(layers)] + [(model, False)]


def begin_micro_batch(model: torch.nn.Module, index: int, count: int) -> None:
    """Gradient accumulation: call before each micro-batch; :func:`end_accumulation` after the last.

    SHARDED accumulation (``parallelize(accumulation="sharded")``, the default): every
    micro-batch's backward reduce-scatters its gradients into a sharded buffer, so no unsharded
    gradient outlives a block's backward and the gradient traffic overlaps every micro-batch's
    compute instead of bunching into the last one. full_shard adds each one to the sharded fp32
    gradient. hybrid shard's (and no_shard's) all-reduce (``set_requires_all_reduce``) waits for
    the last micro-batch, so the network (EFA) carries it once per step. Until then FSDP2 sums
    the reduce-scatter outputs in a buffer of the reduce dtype, and ``.grad`` is None (fp32
    because the config refuses a bf16 reduction there; :func:`mixed_precision_policy`).

    LOCAL accumulation (``accumulation="local"``): ``set_requires_gradient_sync(False)`` on all
    but the last micro-batch, so each unit's post-backward skips both the reduce-scatter and the
    all-reduce and keeps the gradient unsharded: FSDP2 casts it to the reduce dtype on the first
    backward and adds every later one to it (torch 2.13 ``_fsdp_param_group.py`` ``post_backward``,
    ``_fsdp_param.py`` ``to_accumulated_grad_if_needed`` / ``accumulate_unsharded_grad_if_needed``);
    the last backward reduce-scatters that sum once. The gradient traffic is 1/count of the
    sharded schedule's, at the memory of one unsharded fp32 gradient of every trained parameter
    for the whole step (the config refuses a bf16 reduce dtype here: the sum would be bf16).

    Parameters are re-gathered per micro-batch (the plan ``parallelize`` chose; with local
    accumulation too: skipping the reduce-scatter does not keep them), unless
    ``parallelize(keep_gathered=True)``: then they stay unsharded from the first forward to the
    last backward (one all-gather per unit per step), which costs the unsharded bf16 parameters
    for the whole step: the memory plan decides (``parallel.keep_params_gathered``).
    """
    if count <= 1 or not hasattr(model, "set_requires_gradient_sync"):
        return
    last = index == count - 1
    if index == 0:
        model.set_requires_gradient_sync(True)
        if getattr(model, "_raytrain_keep_gathered", False):
            for module, _ in reshard_plan(model, getattr(model, "_raytrain_strategy", "full_shard")):
                module.set_reshard_after_forward(False, recurse=False)
    if getattr(model, "_raytrain_accumulation", "sharded") == "local":
        model.set_requires_gradient_sync(last)  # reduce-scatter (and all-reduce) only in the last backward
    else:
        model.set_requires_all_reduce(last)
    if getattr(model, "_raytrain_keep_gathered", False):
        model.set_reshard_after_backward(last)
        # Only the last backward waits for the retained reduce-scatters (the root's, the largest,
        # runs from the final callback): before it, the compute stream goes on into the next
        # forward while it runs (torch 2.13 _fsdp_state.py:421-431). Kept-gathered only: there
        # every unit stays unsharded through the step, so backward's prefetch by the forward
        # order (not cleared until the last backward) unshards nothing (_fsdp_param_group.py:829).
        model.set_is_last_backward(last)


def end_accumulation(model: torch.nn.Module, count: int) -> None:
    """Restore the per-unit plan after an accumulated step (evaluation and the next step's
    memory use see the plan ``parallelize`` chose)."""
    if count <= 1 or not hasattr(model, "set_requires_gradient_sync"):
        return
    model.set_requires_gradient_sync(True)
    model.set_reshard_after_backward(True)
    model.set_is_last_backward(True)
    for module, reshard in reshard_plan(model, getattr(model, "_raytrain_strategy", "full_shard")):
        module.set_reshard_after_forward(reshard, recurse=False)
