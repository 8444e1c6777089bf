"""Optimization: AdamW, linear warmup then the schedule's shape down to ``min_lr_ratio``,
gradient clipping. Every setting comes from the job config: ``[train]`` (lr, warmup_steps,
min_lr_ratio, weight_decay, grad_clip) and ``[optim]`` (betas, eps, the no-decay rule, the
AdamW kernel, the schedule's shape); the defaults are the optimizer every run had before
``[optim]`` existed (tests/training/test_optim.py holds that one and compares).

Gradient accumulation lives in the loop (micro batches per optimizer step =
``JobConfig.grad_accum_steps``); this module owns what happens once per optimizer step.
"""
from __future__ import annotations

import math

import torch


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float, schedule: str = "cosine") -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (step 0 already trains, at lr/warmup), then from 1 down
    to ``min_lr_ratio`` at the last step: a half cosine (``cosine``) or a straight line
    (``linear``); ``constant`` stays at 1.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, max_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def decays(param: torch.Tensor, no_decay: str) -> bool:
    """Whether AdamW's weight decay applies to ``param`` under the rule ``optim.no_decay``:
    ``1d`` spares tensors of fewer than 2 dimensions (biases, norm weights), ``none`` spares none."""
    return no_decay == "none" or param.ndim >= 2


def build_optimizer(model: torch.nn.Module, train_cfg, optim_cfg) -> torch.optim.Optimizer:
    """AdamW over all trainable parameters, in two groups: decayed, and spared by ``optim.no_decay``
    (the second group is there, empty or not, so a checkpoint's groups always line up)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if decays(param, optim_cfg.no_decay) else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(optim_cfg.beta1, optim_cfg.beta2), eps=optim_cfg.eps,
                             **adamw_kernel(model, optim_cfg.kernel))


def adamw_kernel(model: torch.nn.Module, kernel: str = "auto") -> dict[str, bool]:
    """torch.optim.AdamW's implementation arguments for ``optim.kernel``.

    ``auto``: ``fused=True`` (one kernel for the whole update, DTensor shards included, as
    torchtitan runs FSDP2) when the parameters are on a GPU, and when FSDP2 holds them in host
    memory on a GPU node (``parallel.cpu_offload``): torch 2.13 has a fused CPU AdamW
    (torch/utils/_foreach_utils.py ``_get_fused_kernels_supported_devices`` lists "cpu"; DTensor
    shards dispatch ``aten._fused_adamw_`` per local shard), measured 7x faster per parameter than
    foreach on one host thread (bench/bench_host_adamw.py), and it runs on the worker's
    OMP_NUM_THREADS threads (Ray sets them to the worker's ``num_cpus``). ``foreach=True`` on
    CPU-only machines (the tests and the demo: the rule before ``[optim]``, kept so their numbers
    stay). ``for_loop``: neither (one tensor at a time).
    """
    if kernel == "auto":
        offloaded = getattr(model, "_raytrain_cpu_offload", False) and torch.cuda.is_available()
        kernel = "fused" if offloaded or any(p.is_cuda for p in model.parameters()) else "foreach"
    return {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}[kernel]


def build_scheduler(optimizer: torch.optim.Optimizer, train_cfg, optim_cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + ``optim.schedule`` as a LambdaLR (its state_dict is part of the trainer state)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps=train_cfg.warmup_steps, max_steps=train_cfg.max_steps,
                               min_lr_ratio=train_cfg.min_lr_ratio, schedule=optim_cfg.schedule),
    )


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (over all shards) and return it before clipping, as a
    device tensor (the loop reads it on the host only at log steps).

    With FSDP2 the parameters are DTensors and ``clip_grad_norm_`` returns a DTensor norm whose
    ``full_tensor()`` is the same global value on every rank. ``max_norm`` 0 only measures.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach()
