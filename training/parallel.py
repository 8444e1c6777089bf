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


def backend_for(on_gpu: bool) -> str:
    """NCCL between GPUs, gloo on CPU."""
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
                activation_checkpointing: bool = False, compile: bool = False) -> torch.nn.Module:
    """Apply activation checkpointing, optional compile and FSDP2 to ``model`` in place.

    On GPU parameters are gathered in bfloat16 and gradients reduced in float32
    (``MixedPrecisionPolicy``); on CPU everything stays float32.
    """
    from torch.distributed.fsdp import fully_shard

    if activation_checkpointing:
        # Non-reentrant checkpointing composes with FSDP2 and torch.compile.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile:
        for layer in decoder_layers(model):
            layer.compile()
    kwargs = {"mesh": mesh}
    if on_gpu:
        kwargs["mp_policy"] = mixed_precision_policy()
    for layer, reshard in reshard_plan(model, strategy):
        fully_shard(layer, reshard_after_forward=reshard, **kwargs)
    model._raytrain_strategy = strategy  # the accumulation helpers restore this plan
    return model


def mixed_precision_policy():
    """bf16 all-gathers and compute, fp32 gradient reduction (the master weights stay fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


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
    """Gradient accumulation with ONE all-gather per FSDP unit per optimizer step.

    ``set_requires_gradient_sync(False)`` alone skips only the reduce-scatter: the parameters
    would still be all-gathered again in every micro-batch's forward and backward. So during
    accumulation the parameters stay unsharded from the first forward until the last backward,
    which reshards them and reduce-scatters the accumulated gradient once. The price is memory:
    the unsharded parameters and an unsharded fp32 gradient for the whole step (the preflight's
    memory model counts both). Call before each micro-batch; :func:`end_accumulation` after.
    """
    if count <= 1 or not hasattr(model, "set_requires_gradient_sync"):
        return
    last = index == count - 1
    if index == 0:
        for module, _ in reshard_plan(model, getattr(model, "_raytrain_strategy", "full_shard")):
            module.set_reshard_after_forward(False, recurse=False)
    model.set_requires_gradient_sync(last)
    model.set_reshard_after_backward(last)


def end_accumulation(model: torch.nn.Module, count: int) -> None:
    """Restore the per-unit resharding plan after an accumulated step (evaluation and the next
    step's memory use see the plan ``parallelize`` chose)."""
    if count <= 1 or not hasattr(model, "set_requires_gradient_sync"):
        return
    for module, reshard in reshard_plan(model, getattr(model, "_raytrain_strategy", "full_shard")):
        module.set_reshard_after_forward(reshard, recurse=False)
