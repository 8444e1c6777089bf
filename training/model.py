"""The model: a Hugging Face causal LM from a local directory, an ``s3://`` prefix or a hub id,
or a randomly initialised one built from a config (tiny models for tests and the local demo).

An ``s3://`` prefix is fetched ONCE per node (training/data/remote.py's ``fetch_prefix``: the
first process takes a node-local lock and downloads, the others wait and reuse the copy).
Parameters (the optimizer's master copy) are float32 unless ``model.dtype`` says otherwise; on
GPU, FSDP's MixedPrecisionPolicy computes in bfloat16 (training/parallel.py). Pure bfloat16
weights (``dtype = "bfloat16"``) halve memory but let AdamW round small updates away.
"""
from __future__ import annotations

from typing import Any

import torch

from training.model_config import (  # noqa: F401  (re-exported: the checks the driver and the worker share)
    ModelConfigError, check_seq_len, max_positions, read_model_config,
)


def resolve_dtype(name: str, on_gpu: bool) -> torch.dtype:
    """``auto`` = float32 master weights everywhere: bf16 compute on GPU comes from FSDP's
    mixed-precision policy, so updates of lr ~1e-5 are not rounded away in bf16 weights."""
    if name == "auto":
        return torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def resolve_model_path(path: str) -> str:
    """A local directory stays; ``s3://`` is fetched once per node; anything else is a hub id."""
    if path.startswith("s3://"):
        from training.data.remote import fetch_prefix  # one download per node (a node-local lock)

        return str(fetch_prefix(path))
    return path


def build_model(model_cfg: Any, *, seq_len: int, on_gpu: bool) -> torch.nn.Module:
    """Build the causal LM described by the job config's ``model`` section (on CPU).

    FSDP's ``fully_shard`` moves each shard to the mesh's device later, so a full copy never
    has to fit on one GPU.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    dtype = resolve_dtype(model_cfg.dtype, on_gpu)
    if model_cfg.path:
        path = resolve_model_path(model_cfg.path)
        hf_config = AutoConfig.from_pretrained(path)
        check_seq_len(seq_len, hf_config.to_dict())
        published = hf_config.dtype  # loading with dtype= overwrites it
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        hf_config = Qwen2Config(**dict(model_cfg.config))
        check_seq_len(seq_len, hf_config.to_dict())
        published = hf_config.dtype
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    # Training never reuses the KV cache; it only costs memory.
    model.config.use_cache = False
    # The dtype the model was published in (bf16 for Qwen2.5), before the fp32 master copy:
    # the export writes this one.
    model.published_dtype = str(published or dtype).removeprefix("torch.")
    return model


def export_config(model: torch.nn.Module) -> dict[str, Any]:
    """The model's config for checkpoints and the export, with the dtype it was published in."""
    return {**model.config.to_dict(), "dtype": getattr(model, "published_dtype", None) or "float32"}


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks (``model.model.layers`` for Qwen2/Llama-style models)."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__}: no decoder ModuleList at .{model.base_model_prefix}.layers")
    return layers


IGNORE_INDEX = -100
"""Label value that carries no loss (prompt tokens, padding), as in Hugging Face."""


def count_targets(labels: torch.Tensor) -> int:
    """Tokens that carry loss in a batch whose labels are aligned with ``input_ids``."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed next-token cross-entropy of a batch (labels aligned with ``input_ids``, shifted here).

    A SUM, not a mean: the loop divides by the token count of the whole global batch, so the
    loss and gradients do not depend on how the batch is split over ranks and micro batches.
    """
    # No cache and no attention mask: with per-document position_ids (packed data) transformers
    # then builds a per-document causal mask; a KV cache would silently disable it.
    inputs = {"input_ids": batch["input_ids"], "use_cache": False}
    if "position_ids" in batch:
        inputs["position_ids"] = batch["position_ids"]
    logits = model(**inputs).logits
    shift_logits = logits[:, :-1, :].float()
    shift_labels = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum")
