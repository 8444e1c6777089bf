"""The output layer and the cross-entropy in chunks (training/model.py: ChunkedLossHead): the loss and every
gradient equal the unchunked loss on CPU in float32, the full ``[targets, vocab]`` logits are
never made, and the model's parameters, state-dict keys and tie are unchanged."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tiny_qwen import tiny_qwen2_config

VOCAB, CHUNK = 2000, 16


def _model(chunked: bool):
    from training.model import build_model

    torch.manual_seed(0)
    cfg = SimpleNamespace(path="", config=tiny_qwen2_config(VOCAB), dtype="float32", transforms=())
    model = build_model(cfg, seq_len=64, on_gpu=False)
    if chunked:
        model.lm_head.chunk = CHUNK
    else:  # the plain output layer: one pass over the full logits
        model.lm_head.__class__ = torch.nn.Linear
    return model


def _batch(rows: int = 2, seq_len: int = 48) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB - 1, (rows, seq_len), generator=gen)
    labels = ids.clone()
    labels[:, :5] = -100  # a prompt: positions without a target
    positions = torch.cat([torch.arange(30), torch.arange(seq_len - 30)]).expand(rows, -1)
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def _unchunked_loss(model, batch) -> torch.Tensor:
    """The reference: full float32 logits, one cross-entropy over every target."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=-100, reduction="sum")


@pytest.mark.parametrize("packed", [True, False])
def test_chunked_head_gives_the_unchunked_loss_and_gradients(packed):
    from training.model import loss_sum

    batch = _batch()
    reference, chunked = _model(chunked=False), _model(chunked=True)
    if not packed:  # the dense-mask path: targets picked by rows/cols from [rows, seq, hidden]
        chunked.set_attn_implementation("sdpa")
        reference.set_attn_implementation("sdpa")
    ref = _unchunked_loss(reference, batch)
    ref.backward()
    loss = loss_sum(chunked, batch)
    loss.backward()
    assert (batch["labels"][:, 1:] != -100).sum() > 3 * CHUNK  # several chunks, a short last one
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    for (name, a), (_, b) in zip(chunked.named_parameters(), reference.named_parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6), name


def test_no_tensor_holds_the_logits_of_every_target():
    """The largest tensor with the vocabulary as its last dimension, forward and backward, has
    one chunk's rows (the unchunked head makes ``[targets, vocab]``)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from training.model import count_targets, loss_sum

    class Widest(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in [] if func.is_view else tree_flatten(out)[0]:  # a view (the weight's .T) holds nothing new
                if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == VOCAB:
                    Widest.rows = max(Widest.rows, t.numel() // VOCAB)
            return out

    model, batch = _model(chunked=True), _batch()
    model.lm_head.chunk = CHUNK
    with Widest():
        loss_sum(model, batch).backward()
    assert count_targets(batch["labels"]) > 3 * CHUNK
    assert Widest.rows == CHUNK


def test_the_head_keeps_parameters_keys_and_tie():
    from training.model import ChunkedLossHead

    chunked, plain = _model(chunked=True), _model(chunked=False)
    assert isinstance(chunked.lm_head, ChunkedLossHead)
    assert chunked.lm_head.weight is chunked.model.embed_tokens.weight
    assert list(chunked.state_dict()) == list(plain.state_dict())
    probe = torch.tensor([[1, 2, 3]])
    assert torch.equal(chunked(input_ids=probe).logits, plain(input_ids=probe).logits)  # generation and eval


def test_no_targets_still_reaches_every_parameter():
    """A micro batch without targets: backward still runs through the whole model (every FSDP
    rank must reduce the same gradients), with zero gradients."""
    from training.model import loss_sum

    model, batch = _model(chunked=True), _batch()
    batch["labels"][:] = -100
    loss = loss_sum(model, batch)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
