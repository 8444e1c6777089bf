"""The output layer and the cross-entropy over chunks of target tokens, inside the model's
forward: the ``[targets, vocab]`` logits of a micro batch never exist at once.

Without it the causal LM returns compute-dtype logits for every target token (Qwen2.5's
151,936-word vocabulary: 0.30 MB per target in bf16, ~0.37 GB at 1,229 targets, ~0.62 GB when
all 2,047 of a 2,048-token block are targets) and backward makes a gradient of the same size;
the float32 cross-entropy then runs in chunks over them (:func:`training.model.chunked_cross_entropy_sum`).
Here each chunk of :data:`CE_CHUNK_TOKENS` targets runs ``hidden @ W.T`` and its float32
cross-entropy; every chunk but the last is checkpointed (its logits are made again in backward:
one more ``2 x chunk x hidden x vocab`` FLOP GEMM), so one chunk's logits and their gradient
exist at a time. The numbers are those of the unchunked loss (the same bf16 GEMM, then float32).

It runs INSIDE the root module's forward (the causal LM's own ``lm_head`` call), so FSDP2's root
hooks gather the (tied) output weight and reduce its gradient exactly as for the plain linear:
:func:`use_chunked_loss_head` turns the model's ``lm_head`` (an ``nn.Linear``) into a
:class:`ChunkedLossHead` in place (the same parameter object, state-dict key and tie), which is
the plain linear unless :meth:`ChunkedLossHead.computing_loss` hands it a micro batch's targets.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from training.model_config import CE_CHUNK_TOKENS


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")


def chunked_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                     targets: torch.Tensor, chunk: int = CE_CHUNK_TOKENS) -> torch.Tensor:
    """Summed cross-entropy of ``linear(hidden, weight, bias)`` (``hidden`` ``[tokens, in]``),
    ``chunk`` tokens at a time in float32; every chunk but the last checkpointed (the last's
    backward runs first, right after forward: recomputing it would save nothing)."""
    from torch.utils.checkpoint import checkpoint

    if hidden.shape[0] == 0:  # still connected to the graph: every rank runs backward
        return torch.nn.functional.linear(hidden, weight, bias).sum().float()
    starts = range(0, hidden.shape[0], chunk)
    parts = [checkpoint(_chunk_loss, hidden[lo:lo + chunk], weight, bias, targets[lo:lo + chunk], use_reentrant=False)
             for lo in starts[:-1]]
    parts.append(_chunk_loss(hidden[starts[-1]:], weight, bias, targets[starts[-1]:]))
    return torch.stack(parts).sum()


class ChunkedLossHead(torch.nn.Linear):
    """An ``nn.Linear`` output layer that returns the summed cross-entropy of the selected
    positions (shape ``[]``) instead of logits while :meth:`computing_loss` is active."""

    _loss_request: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None = None
    chunk: int = CE_CHUNK_TOKENS
    """Target tokens per chunk (an instance may set its own: tests use small ones)."""

    @contextmanager
    def computing_loss(self, targets: torch.Tensor, rows: torch.Tensor | None = None,
                       cols: torch.Tensor | None = None) -> Iterator[None]:
        """For one forward: ``targets`` of the positions the model already kept
        (``logits_to_keep``: the hidden states arrive as ``[1, targets, in]``), or of
        ``hidden[rows, cols]`` when ``rows``/``cols`` are given (the dense-mask path)."""
        self._loss_request = (targets, rows, cols)
        try:
            yield
        finally:
            self._loss_request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._loss_request is None:
            return super().forward(hidden)
        targets, rows, cols = self._loss_request
        selected = hidden[0] if rows is None else hidden[rows, cols]
        return chunked_linear_cross_entropy_sum(selected, self.weight, self.bias, targets, self.chunk)


def use_chunked_loss_head(model: torch.nn.Module) -> bool:
    """Make ``model``'s output layer a :class:`ChunkedLossHead` (before FSDP wraps it); False,
    and nothing changed, when it is not a plain ``nn.Linear`` (a transform replaced it)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is torch.nn.Linear:
        head.__class__ = ChunkedLossHead  # same parameters, state-dict keys and tie
    return isinstance(head, ChunkedLossHead)


def loss_head(model: torch.nn.Module) -> ChunkedLossHead | None:
    """The model's :class:`ChunkedLossHead`, or None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if isinstance(head, ChunkedLossHead) else None
