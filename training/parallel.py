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


def build_mesh(strategy: str, workers_per_node: int, on_gpu: bool) -> DeviceMesh:
    """The device mesh over the already-initialised default process group."""
    plan = mesh_plan(strategy, dist.get_world_size(), workers_per_node)
    return init_device_mesh("cuda" if on_gpu else "cpu", plan.shape, mesh_dim_names=plan.dim_names)


def parallelize(model: torch.nn.Module, mesh: DeviceMesh, *, strategy: str, on_gpu: bool,
                activation_checkpointing: bool = False, compile: bool = False) -> torch.nn.Module:
    """Apply activation checkpointing, optional compile and FSDP2 to ``model`` in place.

    On GPU parameters are gathered in bfloat16 and gradients reduced in float32
    (``MixedPrecisionPolicy``); on CPU everything stays float32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if activation_checkpointing:
        # Non-reentrant checkpointing composes with FSDP2 and torch.compile.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = decoder_layers(model)
    if compile:
        for layer in layers:
            layer.compile()
    kwargs = {"mesh": mesh}
    if on_gpu:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # With nothing to shard (no_shard) re-gathering after forward would only cost time.
    reshard = strategy != "no_shard"
    for index, layer in enumerate(layers):
        # The last block's parameters are needed again right away by backward: keep them.
        fully_shard(layer, reshard_after_forward=reshard and index < len(layers) - 1, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model
