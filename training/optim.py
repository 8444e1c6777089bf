"""Optimization: AdamW, linear warmup then cosine decay to ``min_lr_ratio``, gradient clipping.

Gradient accumulation lives in the loop (micro batches per optimizer step =
``JobConfig.grad_accum_steps``); this module owns what happens once per optimizer step.
"""
from __future__ import annotations

import math

import torch


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (step 0 already trains, at lr/warmup), then a half
    cosine from 1 down to ``min_lr_ratio`` at the last step.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, train_cfg) -> torch.optim.Optimizer:
    """AdamW over all trainable parameters; no weight decay on biases and norms (1-D tensors)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(0.9, 0.95), eps=1e-8, **adamw_kernel(model))


def adamw_kernel(model: torch.nn.Module) -> dict[str, bool]:
    """``fused=True`` (one kernel for the whole update, DTensor shards included, as torchtitan
    runs FSDP2) when the parameters are on a GPU; ``foreach=True`` elsewhere (the CPU path
    the tests and the demo run)."""
    on_gpu = any(p.is_cuda for p in model.parameters())
    return {"fused": True} if on_gpu else {"foreach": True}


def build_scheduler(optimizer: torch.optim.Optimizer, train_cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + cosine as a LambdaLR (its state_dict is part of the trainer state)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps=train_cfg.warmup_steps, max_steps=train_cfg.max_steps,
                               min_lr_ratio=train_cfg.min_lr_ratio),
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
