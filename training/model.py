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
    CE_CHUNK_TOKENS, ModelConfigError, check_seq_len, max_positions, read_model_config,
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
    """Build the causal LM described by the job config's ``model`` section (on CPU), with its
    transforms (``model.transforms``) applied.

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
    # Packed documents attend within themselves with no dense mask (training/attention.py).
    from training.attention import use_packed_attention

    use_packed_attention(model)
    # The job's model transforms (training/model_transforms/), before parallelize() shards it.
    from training.model_transforms import apply_transforms

    model = apply_transforms(model, getattr(model_cfg, "transforms", ()))
    # The output layer and the loss in chunks, never the full logits (training/loss_head.py);
    # after the transforms: an output layer a transform replaced keeps the logits path.
    from training.loss_head import use_chunked_loss_head

    use_chunked_loss_head(model)
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


def loss_inputs(model: torch.nn.Module | None, batch: dict[str, torch.Tensor], device: torch.device | None = None,
                *, packed: bool | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """The model kwargs and the target token ids of a batch, prepared from its HOST copy.

    Only positions whose next token is a target are sent through the output layer
    (``logits_to_keep`` = their flat indices): prompt and padding rows never get logits. With
    packed attention (training/attention.py) the ``[rows, seq_len]`` batch runs as ONE row of
    ``rows * seq_len`` tokens (every row starts a document, so the result is the same) so that
    the indices can differ per row; the document layout travels as attention kwargs. Indices
    and layout are computed here, on the host, so the device never waits for a host read.
    The layout goes to ``device``, or (None) to the device ``input_ids`` are on: flash attention
    needs it beside the tokens. ``packed`` None: whether ``model`` uses packed attention.
    """
    from training.attention import document_layout, uses_packed_attention

    ids, labels = batch["input_ids"], batch["labels"]
    rows, seq_len = ids.shape
    positions = batch.get("position_ids")
    is_target = labels[:, 1:] != IGNORE_INDEX
    row, col = torch.nonzero(is_target, as_tuple=True)
    targets = labels[:, 1:][is_target].long()
    move = (lambda t: t) if device is None else (lambda t: t.to(device, non_blocking=True))
    if uses_packed_attention(model) if packed is None else packed:
        if positions is None:
            positions = torch.arange(seq_len).expand(rows, -1)
        layout = document_layout(positions, rows, seq_len)
        inputs = {"input_ids": move(ids.reshape(1, -1)), "position_ids": move(positions.reshape(1, -1)),
                  "logits_to_keep": move(row * seq_len + col),
                  **layout.kwargs(ids.device if device is None else device)}  # the layout goes where the ids go
    else:
        # The model builds its own (dense) mask from position_ids: one row per sequence.
        inputs = {"input_ids": move(ids), "_rows": move(row), "_cols": move(col)}
        if positions is not None:
            inputs["position_ids"] = move(positions)
    return {"use_cache": False, **inputs}, move(targets)


def _chunk_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")


def chunked_cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor,
                              chunk: int = CE_CHUNK_TOKENS) -> torch.Tensor:
    """Summed cross-entropy of ``[tokens, vocab]`` logits, ``chunk`` tokens at a time, in float32.

    Every chunk but the last is checkpointed: its float32 copy is made in forward, dropped, and
    made again in backward, so at most one chunk's float32 logits exist at any time. The last
    chunk keeps what it saved: nothing runs between its forward and its backward (the loss is
    the end of forward, and autograd runs the newest chunk's backward first), so recomputing it
    would cost its work again for no memory. A batch of one chunk is never recomputed.
    """
    from torch.utils.checkpoint import checkpoint

    if logits.shape[0] == 0:
        return logits.sum().float()  # still connected to the graph: every rank runs backward
    starts = range(0, logits.shape[0], chunk)
    parts = [checkpoint(_chunk_loss, logits[lo:lo + chunk], targets[lo:lo + chunk], use_reentrant=False)
             for lo in starts[:-1]]
    parts.append(_chunk_loss(logits[starts[-1]:], targets[starts[-1]:]))
    return torch.stack(parts).sum()


def loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """Summed next-token cross-entropy of a batch (labels aligned with ``input_ids``, shifted here).

    A SUM, not a mean: the loop divides by the token count of the whole global batch, so the
    loss and gradients do not depend on how the batch is split over ranks and micro batches.
    ``batch`` should be the host copy (``device`` then receives the inputs); a batch already on
    the device works too, at the price of a host read for the target indices.
    """
    return loss_from_inputs(model, *loss_inputs(model, batch, device))


def loss_from_inputs(model: torch.nn.Module, inputs: dict[str, Any], targets: torch.Tensor) -> torch.Tensor:
    """The device half of :func:`loss_sum`, on what :func:`loss_inputs` prepared. With a
    :class:`training.loss_head.ChunkedLossHead` the model's forward returns the loss itself
    (as ``.logits``), computed chunk by chunk; otherwise from the logits of the targets."""
    from training.loss_head import loss_head

    inputs = dict(inputs)
    rows, cols = inputs.pop("_rows", None), inputs.pop("_cols", None)
    head = loss_head(model)
    if head is not None:
        with head.computing_loss(targets, rows, cols):
            return model(**inputs).logits
    logits = model(**inputs).logits
    logits = logits[0] if rows is None else logits[rows, cols]
    return chunked_cross_entropy_sum(logits, targets)
