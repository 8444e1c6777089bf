"""The model: a Hugging Face causal LM from a local directory, an ``s3://`` prefix or a hub id,
or a randomly initialised one built from a config (tiny models for tests and the local demo).

An ``s3://`` prefix is fetched ONCE per node (training/storage/files.py's ``fetch_prefix``: the
first process takes a node-local lock and downloads, the others wait and reuse the copy).
Parameters (the optimizer's master copy) are float32 unless ``model.dtype`` says otherwise; on
GPU, FSDP's MixedPrecisionPolicy computes in bfloat16 (training/parallel.py). Pure bfloat16
weights (``dtype = "bfloat16"``) halve memory but let AdamW round small updates away.

Attention for packed documents without a dense mask: each document attends causally to itself.

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

The loss head: the output layer and the cross-entropy over chunks of target tokens, inside the
model's forward, so the ``[targets, vocab]`` logits of a micro batch never exist at once.

Without it the causal LM returns compute-dtype logits for every target token (Qwen2.5's
151,936-word vocabulary: 0.30 MB per target in bf16, ~0.37 GB at 1,229 targets, ~0.62 GB when
all 2,047 of a 2,048-token block are targets) and backward makes a gradient of the same size;
the float32 cross-entropy then runs in chunks over them (:func:`chunked_cross_entropy_sum`).
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
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from training.model_config import (  # noqa: F401  (re-exported: the checks the driver and the worker share)
    CE_CHUNK_TOKENS, ModelConfigError, check_seq_len, max_positions, read_model_config,
)
from training.storage import S3_SCHEME


def resolve_dtype(name: str, on_gpu: bool) -> torch.dtype:
    """``auto`` = float32 master weights everywhere: bf16 compute on GPU comes from FSDP's
    mixed-precision policy, so updates of lr ~1e-5 are not rounded away in bf16 weights."""
    if name == "auto":
        return torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def resolve_model_path(path: str) -> str:
    """A local directory stays; ``s3://`` is fetched once per node; anything else is a hub id."""
    if path.startswith(S3_SCHEME):
        from training.storage.files import fetch_prefix  # one download per node (a node-local lock)

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
    # Packed documents attend within themselves with no dense mask (:func:`use_packed_attention`).
    use_packed_attention(model)
    # The job's model transforms (training/model_transforms/), before parallelize() shards it.
    from training.model_transforms import apply_transforms

    model = apply_transforms(model, getattr(model_cfg, "transforms", ()))
    # The output layer and the loss in chunks, never the full logits (:class:`ChunkedLossHead`);
    # after the transforms: an output layer a transform replaced keeps the logits path.
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
    packed attention (:data:`PACKED`) the ``[rows, seq_len]`` batch runs as ONE row of
    ``rows * seq_len`` tokens (every row starts a document, so the result is the same) so that
    the indices can differ per row; the document layout travels as attention kwargs. Indices
    and layout are computed here, on the host, so the device never waits for a host read.
    The layout goes to ``device``, or (None) to the device ``input_ids`` are on: flash attention
    needs it beside the tokens. ``packed`` None: whether ``model`` uses packed attention.
    """
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


def _chunk_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction=reduction)


def _joined(parts: list[torch.Tensor], reduction: str) -> torch.Tensor:
    """The chunks' sums added up (``sum``), or their per-token losses in order (``none``)."""
    return torch.cat(parts) if reduction == "none" else torch.stack(parts).sum()


def chunked_cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor,
                              chunk: int = CE_CHUNK_TOKENS, reduction: str = "sum") -> torch.Tensor:
    """Summed cross-entropy of ``[tokens, vocab]`` logits, ``chunk`` tokens at a time, in float32.

    Every chunk but the last is checkpointed: its float32 copy is made in forward, dropped, and
    made again in backward, so at most one chunk's float32 logits exist at any time. The last
    chunk keeps what it saved: nothing runs between its forward and its backward (the loss is
    the end of forward, and autograd runs the newest chunk's backward first), so recomputing it
    would cost its work again for no memory. A batch of one chunk is never recomputed.
    """
    from torch.utils.checkpoint import checkpoint

    if logits.shape[0] == 0:  # still connected to the graph: every rank runs backward
        return logits.sum(dim=-1).float() if reduction == "none" else logits.sum().float()
    starts = range(0, logits.shape[0], chunk)
    parts = [checkpoint(_chunk_loss, logits[lo:lo + chunk], targets[lo:lo + chunk], reduction, use_reentrant=False)
             for lo in starts[:-1]]
    parts.append(_chunk_loss(logits[starts[-1]:], targets[starts[-1]:], reduction))
    return _joined(parts, reduction)


def _linear_chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction=reduction)


def chunked_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                     targets: torch.Tensor, chunk: int = CE_CHUNK_TOKENS,
                                     reduction: str = "sum") -> torch.Tensor:
    """Summed cross-entropy of ``linear(hidden, weight, bias)`` (``hidden`` ``[tokens, in]``),
    ``chunk`` tokens at a time in float32; every chunk but the last checkpointed (the last's
    backward runs first, right after forward: recomputing it would save nothing)."""
    from torch.utils.checkpoint import checkpoint

    if hidden.shape[0] == 0:  # still connected to the graph: every rank runs backward
        empty = torch.nn.functional.linear(hidden, weight, bias)
        return empty.sum(dim=-1).float() if reduction == "none" else empty.sum().float()
    starts = range(0, hidden.shape[0], chunk)
    parts = [checkpoint(_linear_chunk_loss, hidden[lo:lo + chunk], weight, bias, targets[lo:lo + chunk], reduction,
                        use_reentrant=False) for lo in starts[:-1]]
    parts.append(_linear_chunk_loss(hidden[starts[-1]:], weight, bias, targets[starts[-1]:], reduction))
    return _joined(parts, reduction)


class ChunkedLossHead(torch.nn.Linear):
    """An ``nn.Linear`` output layer that returns the summed cross-entropy of the selected
    positions (shape ``[]``) instead of logits while :meth:`computing_loss` is active."""

    _loss_request: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, str] | None = None
    chunk: int = CE_CHUNK_TOKENS
    """Target tokens per chunk (an instance may set its own: tests use small ones)."""

    @contextmanager
    def computing_loss(self, targets: torch.Tensor, rows: torch.Tensor | None = None,
                       cols: torch.Tensor | None = None, reduction: str = "sum") -> Iterator[None]:
        """For one forward: ``targets`` of the positions the model already kept
        (``logits_to_keep``: the hidden states arrive as ``[1, targets, in]``), or of
        ``hidden[rows, cols]`` when ``rows``/``cols`` are given (the dense-mask path).
        ``reduction="none"``: each target's loss, in order (an objective that sums per sequence)."""
        self._loss_request = (targets, rows, cols, reduction)
        try:
            yield
        finally:
            self._loss_request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._loss_request is None:
            return super().forward(hidden)
        targets, rows, cols, reduction = self._loss_request
        selected = hidden[0] if rows is None else hidden[rows, cols]
        return chunked_linear_cross_entropy_sum(selected, self.weight, self.bias, targets, self.chunk, reduction)


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


def loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """Summed next-token cross-entropy of a batch (labels aligned with ``input_ids``, shifted here).

    A SUM, not a mean: the loop divides by the token count of the whole global batch, so the
    loss and gradients do not depend on how the batch is split over ranks and micro batches.
    ``batch`` should be the host copy (``device`` then receives the inputs); a batch already on
    the device works too, at the price of a host read for the target indices.
    """
    return loss_from_inputs(model, *loss_inputs(model, batch, device))


def document_segments(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """``(segment of every target, segments)`` of a HOST batch: the documents that hold targets,
    numbered 0, 1, ... in order (rows, then documents by :func:`document_layout`'s rule), and
    each target's number, in the order of ``labels[:, 1:] != -100`` (as :func:`loss_inputs`
    keeps them): what sums :func:`token_losses` per sequence."""
    labels = batch["labels"]
    rows, seq_len = labels.shape
    positions = batch.get("position_ids")
    if positions is None:
        starts = torch.zeros(rows, seq_len, dtype=torch.bool)
    else:
        positions = positions.expand(rows, -1)
        starts = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1) != 1
    starts[:, 0] = True
    document = torch.cumsum(starts.reshape(-1).long(), 0).reshape(rows, seq_len) - 1
    owner = document[:, 1:][labels[:, 1:] != IGNORE_INDEX]  # the document of each predicted token
    found, segment = torch.unique(owner, sorted=True, return_inverse=True)
    return segment, len(found)


def token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """Each target token's cross-entropy (= minus its log-probability), in the row-major order of
    ``labels[:, 1:] != -100``: what an objective sums per sequence (DPO's log-probabilities)."""
    return loss_from_inputs(model, *loss_inputs(model, batch, device), reduction="none")


def loss_from_inputs(model: torch.nn.Module, inputs: dict[str, Any], targets: torch.Tensor,
                     reduction: str = "sum") -> torch.Tensor:
    """The device half of :func:`loss_sum`, on what :func:`loss_inputs` prepared. With a
    :class:`ChunkedLossHead` the model's forward returns the loss itself
    (as ``.logits``), computed chunk by chunk; otherwise from the logits of the targets."""
    inputs = dict(inputs)
    rows, cols = inputs.pop("_rows", None), inputs.pop("_cols", None)
    head = loss_head(model)
    if head is not None:
        with head.computing_loss(targets, rows, cols, reduction):
            return model(**inputs).logits
    logits = model(**inputs).logits
    logits = logits[0] if rows is None else logits[rows, cols]
    return chunked_cross_entropy_sum(logits, targets, reduction=reduction)
