"""Attention for packed documents without a dense mask: each document attends causally to itself.

With packed ``position_ids`` transformers' ``sdpa`` path builds a dense 4-D boolean mask per
forward (``masking_utils.find_packed_sequence_indices`` + ``sdpa_mask``): no flash kernel, the
full ``seq_len``² scores with no causal skipping, GQA keys/values repeated, and a host sync. This
module registers its own implementation, :data:`PACKED`, in transformers' ``AttentionInterface``
instead. transformers 5.13 (``masking_utils._preprocess_mask_arguments``) builds NO mask for an
implementation that is not in ``ALL_MASK_ATTENTION_FUNCTIONS``: the function here receives
``attention_mask=None`` and the document layout as ``cu_seq_lens_q``/``max_length_q`` (the names
transformers' flash-attention kwargs use; they travel through ``model(**kwargs)`` to every
attention call) and runs:

- on GPU, variable-length flash attention over the flattened tokens
  (``torch.nn.attention.varlen.varlen_attn``, causal, GQA without repeating keys/values);
- on CPU, one causal ``scaled_dot_product_attention`` per document (``is_causal=True``, no mask
  tensor): the same function of the same inputs, so a packed document's output equals the
  document alone.

Documents are found by transformers' own rule (``find_packed_sequence_indices``: a new document
wherever the position does not follow the previous one by 1), and every row starts one, so rows
of a batch are independent documents too (the loss may flatten a batch into one row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PACKED = "raytrain_packed"
"""The attention implementation name registered in transformers' ``AttentionInterface``."""


@dataclass(frozen=True, slots=True)
class DocumentLayout:
    """Where documents start in the flattened ``[rows * seq_len]`` tokens of a batch."""

    cu_seqlens: torch.Tensor
    """int32 ``[documents + 1]``: cumulative document lengths, 0 first, the token count last."""
    max_len: int
    """The longest document (an int: the flash kernel needs it on the host)."""

    def kwargs(self, device: torch.device | None = None) -> dict:
        """The model kwargs that carry the layout to every attention call."""
        cu = self.cu_seqlens if device is None else self.cu_seqlens.to(device, non_blocking=True)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": self.max_len, "max_length_k": self.max_len}


def document_layout(position_ids: torch.Tensor | None, rows: int, seq_len: int) -> DocumentLayout:
    """The layout of a ``[rows, seq_len]`` batch from its ``position_ids`` (None: one document
    per row). Call it on the host copy of the positions: on a device tensor it syncs.

    The boundary rule is transformers 5.13's ``masking_utils.find_packed_sequence_indices``
    (position difference != 1 starts a document), plus a start at every row.
    """
    if position_ids is None:
        starts = torch.zeros(rows, seq_len, dtype=torch.bool)
    else:
        positions = position_ids.expand(rows, -1).cpu()
        starts = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1) != 1
    starts[:, 0] = True
    begin = torch.nonzero(starts.reshape(-1)).reshape(-1)
    cu = torch.cat([begin, torch.tensor([rows * seq_len])]).to(torch.int32)
    return DocumentLayout(cu_seqlens=cu, max_len=int((cu[1:] - cu[:-1]).max()))


def _on_accelerator(tensor: torch.Tensor) -> bool:
    """The device decision, apart so a CPU test can take the GPU branch."""
    return tensor.is_cuda


def _varlen_attn(*args, **kwargs) -> torch.Tensor:
    """torch 2.13's variable-length flash attention (``torch/nn/attention/varlen.py``)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(*args, **kwargs)


def _per_document_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int],
                       scale: float | None) -> torch.Tensor:
    """Causal SDPA on each document of ``[tokens, heads, dim]`` tensors; no mask tensor."""
    gqa = q.shape[1] != k.shape[1]
    out = []
    for lo, hi in zip(cu, cu[1:]):
        one = [t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, heads, len, dim]
        out.append(torch.nn.functional.scaled_dot_product_attention(
            *one, is_causal=True, scale=scale, enable_gqa=gqa)[0].transpose(0, 1))
    return torch.cat(out)


def packed_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             sliding_window: int | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                             max_length_q: int | None = None, position_ids: torch.Tensor | None = None,
                             **_: object) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[batch, heads, seq, dim]``,
    ``key``/``value`` ``[batch, kv_heads, seq, dim]``; returns ``[batch, seq, heads, dim]``."""
    if attention_mask is not None:
        raise ValueError(f"{PACKED}: got an attention mask; document boundaries come from position_ids")
    if sliding_window is not None or dropout:
        raise ValueError(f"{PACKED}: sliding-window attention and attention dropout are not supported")
    rows, heads, seq_len, dim = query.shape
    if key.shape[2] != seq_len:
        raise ValueError(f"{PACKED}: {seq_len} queries over {key.shape[2]} keys (a KV cache is not supported)")
    if cu_seq_lens_q is None:  # not passed by the caller: derived here (a host read on GPU)
        layout = document_layout(position_ids, rows, seq_len)
        cu_seq_lens_q, max_length_q = layout.cu_seqlens.to(query.device), layout.max_len
    q, k, v = (t.transpose(1, 2).reshape(rows * seq_len, t.shape[1], dim) for t in (query, key, value))
    if _on_accelerator(q):
        out = _varlen_attn(q, k, v, cu_seq_lens_q, cu_seq_lens_q, max_length_q, max_length_q, scale=scaling,
                           window_size=(-1, 0), enable_gqa=heads != k.shape[1])
    else:
        out = _per_document_sdpa(q, k, v, cu_seq_lens_q.tolist(), scaling)
    return out.reshape(rows, seq_len, heads, dim), None


def register() -> None:
    """Register :data:`PACKED` in transformers' global attention interface (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED, packed_attention_forward)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model to :data:`PACKED` (before FSDP wraps it)."""
    register()
    model.set_attn_implementation(PACKED)


def uses_packed_attention(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == PACKED
