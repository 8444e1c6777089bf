"""Packed documents do not see each other, and chat conversations are never cut."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_data_support import DEMO_DIR, cfg_for, qwen_tokenizer

from tiny_qwen import tiny_qwen2_config
from training.data import DataError, build_data
from training.data.packing import pack
from training.data.formats import read_documents
from training.data.tokenizer import TokenizedDoc, tokenize_documents

ENDOFTEXT, IM_START = 151643, 151644


def _doc(ids) -> TokenizedDoc:
    ids = np.asarray(ids, dtype=np.int32)
    return TokenizedDoc(ids, np.ones(len(ids), dtype=bool))


def test_a_document_packed_after_another_gives_its_logits_alone():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=2))).eval()
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randint(0, 500, (n,), generator=gen).tolist() for n in (23, 17))
    separator = 511
    for seed in range(8):  # find the shuffle that puts A first
        packed = pack([_doc(a), _doc(b)], 23 + 1 + 17 + 1, separator, train_separator=True, seed=seed)
        if packed.input_ids[0, 0] == a[0]:
            break
    ids, positions = torch.from_numpy(packed.input_ids).long(), torch.from_numpy(packed.position_ids).long()
    assert positions[0, 24].item() == 0 and positions[0, 23].item() == 23  # B restarts at 0
    with torch.no_grad():
        # as the loop calls it (training.model.loss_sum): no cache, no attention mask
        together = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 24:24 + 17]
        alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
        unmasked = model(input_ids=ids, use_cache=False).logits[0, 24:24 + 17]  # what packing did before
    assert (together - alone).abs().max().item() < 1e-4
    assert (unmasked - alone).abs().max().item() > 1e-2  # the test can tell the difference


def test_no_chat_conversation_is_cut_at_seq_128(tmp_path):
    tok = qwen_tokenizer()
    bundle = build_data(cfg_for("chat", str(DEMO_DIR / "chat"), seq_len=128), tok, rank=0, world_size=1,
                        cache_dir=tmp_path)
    stream, stats = bundle.train, bundle.stats
    conversations = 0
    for block in range(stream.num_blocks):
        ids, labels, positions = (np.asarray(a[block]) for a in (stream.input_ids, stream.labels, stream.position_ids))
        cuts = [int(i) for i in np.flatnonzero(positions == 0)] + [len(ids)]
        for lo, hi in zip(cuts, cuts[1:]):
            if ids[lo] == ENDOFTEXT:  # padding at the end of a block
                assert hi == len(ids) and (labels[lo:hi] == -100).all()
                continue
            # a whole conversation: its chat template's first token ... its separator
            assert ids[lo] == IM_START and ids[hi - 1] == ENDOFTEXT, (block, lo, hi)
            conversations += 1
    assert conversations == stats.train_documents - stats.documents_dropped
    assert stats.documents_truncated == stats.documents_dropped == 0
    assert 0.5 < stats.packing_efficiency <= 1.0


def test_overlong_conversations_truncate_or_refuse():
    tok = qwen_tokenizer()
    read = read_documents(str(DEMO_DIR / "chat"), "chat", on_bad_record="error")
    docs = tokenize_documents(tok, read.documents[:40])
    longest = max(len(d.ids) for d in docs)
    seq_len = longest - 5
    packed = pack(docs, seq_len, ENDOFTEXT, train_separator=False, seed=0, whole_documents=True, overlong="truncate")
    too_long = sum(len(d.ids) + 1 > seq_len for d in docs)
    assert too_long >= 1 and packed.documents_truncated + packed.documents_dropped == too_long
    assert packed.tokens_dropped > 0
    with pytest.raises(DataError, match=r"data.overlong = 'refuse'") as caught:
        pack(docs, seq_len, ENDOFTEXT, train_separator=False, seed=0, whole_documents=True, overlong="refuse",
             source="chat/arithmetic.jsonl")
    assert "\n" not in str(caught.value) and "chat/arithmetic.jsonl" in str(caught.value)


# --- packed attention without a dense mask (training/model.py) and the target-only loss ---

def _tiny(packed: bool, layers: int = 2):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.model import use_packed_attention

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config(num_hidden_layers=layers)))
    if packed:
        use_packed_attention(model)
    return model


def _packed_batch(rows: int = 3, seq_len: int = 40, seed: int = 5) -> dict[str, torch.Tensor]:
    """Rows of several documents each (positions restart at 0), prompt tokens with label -100."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 500, (rows, seq_len), generator=gen)
    positions = torch.empty(rows, seq_len, dtype=torch.long)
    for row in range(rows):
        cuts = sorted(torch.randperm(seq_len - 2, generator=gen)[:row + 1].add(1).tolist())
        starts = [0, *cuts]
        for lo, hi in zip(starts, [*cuts, seq_len]):
            positions[row, lo:hi] = torch.arange(hi - lo)
    labels = ids.clone()
    labels[positions == 0] = -100  # a document's first token is not a target
    labels[torch.rand(rows, seq_len, generator=gen) < 0.3] = -100  # prompt tokens
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def _todays_loss(model, batch) -> torch.Tensor:
    """The loss as it was computed before the packed attention (training/model.py): transformers' sdpa path with its
    dense per-document mask, full-vocabulary logits copied to float32."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    shift_logits = logits[:, :-1, :].float()
    return torch.nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)),
                                             batch["labels"][:, 1:].reshape(-1), ignore_index=-100, reduction="sum")


def test_document_boundaries_follow_transformers_packed_sequence_rule():
    """Oracle: transformers 5.13 ``masking_utils.find_packed_sequence_indices`` (huggingface/
    transformers, v5.13.0, src/transformers/masking_utils.py) decides where a packed document
    starts; the layout's documents are its segments, plus a start at every row."""
    from transformers.masking_utils import find_packed_sequence_indices

    from training.model import document_layout

    batch = _packed_batch()
    rows, seq_len = batch["input_ids"].shape
    segments = find_packed_sequence_indices(batch["position_ids"])
    expected = [0]
    for row in range(rows):
        lengths = torch.unique_consecutive(segments[row], return_counts=True)[1].tolist()
        for length in lengths:
            expected.append(expected[-1] + length)
    layout = document_layout(batch["position_ids"], rows, seq_len)
    assert layout.cu_seqlens.tolist() == expected
    assert layout.cu_seqlens.dtype == torch.int32 and layout.max_len == max(b - a for a, b in zip(expected, expected[1:]))
    assert document_layout(None, 2, 8).cu_seqlens.tolist() == [0, 8, 16]


def test_packed_attention_document_equals_document_alone():
    model = _tiny(packed=True).eval()
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randint(0, 500, (n,), generator=gen) for n in (23, 17))
    ids = torch.cat([a, b]).unsqueeze(0)
    positions = torch.cat([torch.arange(23), torch.arange(17)]).unsqueeze(0)
    with torch.no_grad():
        together = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        alone_a = model(input_ids=a.unsqueeze(0), use_cache=False).logits[0]
        alone_b = model(input_ids=b.unsqueeze(0), use_cache=False).logits[0]
        unmasked = _tiny(packed=False).eval()(input_ids=ids, use_cache=False).logits[0, 23:]
    assert (together[:23] - alone_a).abs().max().item() < 1e-4
    assert (together[23:] - alone_b).abs().max().item() < 1e-4
    assert (unmasked - alone_b).abs().max().item() > 1e-2  # the test can tell the difference


def test_no_mask_tensor_reaches_sdpa_in_the_training_loss(monkeypatch):
    """The job's loss (training.model.loss_sum on a model from build_model) calls SDPA only with
    ``attn_mask=None`` and ``is_causal=True``: no dense [rows, 1, seq, seq] mask is built."""
    from types import SimpleNamespace

    from training.model import build_model, loss_sum

    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("attn_mask", args[3] if len(args) > 3 else None), kwargs.get("is_causal")))
        return original(*args, **kwargs)

    model = build_model(SimpleNamespace(dtype="float32", path="", config=tiny_qwen2_config()), seq_len=40, on_gpu=False)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    loss_sum(model, _packed_batch()).backward()
    assert calls, "SDPA was not called"
    masks = [type(mask).__name__ for mask, _ in calls if mask is not None]
    assert not masks, f"{len(masks)} of {len(calls)} SDPA calls got an attention mask ({masks[0]})"
    assert all(causal is True for _, causal in calls)


def test_new_loss_and_gradients_equal_todays_on_cpu():
    from training.model import loss_sum

    batch = _packed_batch()
    today, new = _tiny(packed=False), _tiny(packed=True)
    before = _todays_loss(today, batch)
    after = loss_sum(new, batch)
    before.backward()
    after.backward()
    assert after.item() == pytest.approx(before.item(), abs=1e-4)
    for (name, p_today), p_new in zip(today.named_parameters(), new.parameters()):
        assert (p_today.grad - p_new.grad).abs().max().item() < 1e-4, name


def test_loss_without_packed_attention_gives_the_same_sum():
    """A model left on transformers' own attention takes the per-row path of loss_sum."""
    from training.model import loss_sum

    batch = _packed_batch()
    model = _tiny(packed=False)
    assert loss_sum(model, batch).item() == pytest.approx(_todays_loss(model, batch).item(), abs=1e-4)


def test_chunked_cross_entropy_equals_one_pass_and_keeps_no_float32_copy_of_all_logits():
    from training.model import chunked_cross_entropy_sum

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(37, 50, generator=gen).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 50, (37,), generator=gen)
    reference = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    (ref_grad,) = torch.autograd.grad(reference, logits)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        chunked = chunked_cross_entropy_sum(logits, targets, chunk=8)
    (grad,) = torch.autograd.grad(chunked, logits)
    assert chunked.item() == pytest.approx(reference.item(), rel=1e-6)
    assert (grad.float() - ref_grad.float()).abs().max().item() < 1e-2
    # what autograd keeps from forward to backward: the bf16 chunks, never a float32 [37, 50]
    assert not [t for t in saved if t.dtype == torch.float32 and t.numel() > 8 * 50]
    empty = chunked_cross_entropy_sum(logits[:0], targets[:0])
    assert empty.item() == 0.0 and empty.requires_grad


def _log_softmax_runs(fn) -> int:
    """How many times ``fn`` computes a log-softmax (forward and checkpoint recomputes)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        runs = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._log_softmax.default:
                Count.runs += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.runs


@pytest.mark.parametrize("tokens", [5, 8, 37])
def test_chunked_cross_entropy_recomputes_every_chunk_but_the_last(tokens):
    from training.model import chunked_cross_entropy_sum

    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(tokens, 50, generator=gen).requires_grad_()
    targets = torch.randint(0, 50, (tokens,), generator=gen)
    chunks = -(-tokens // 8)
    # forward: one per chunk; backward: the checkpointed ones again, never the last
    assert _log_softmax_runs(lambda: chunked_cross_entropy_sum(logits, targets, chunk=8).backward()) \
        == chunks + chunks - 1


@pytest.mark.parametrize("tokens", [512, 1536])
def test_keeping_the_last_chunk_costs_no_memory(tokens):
    """Measured by torch's MemTracker: the peak of forward + backward is not above the plan that
    checkpoints every chunk (the last chunk's saved float32 copy dies before any recompute)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.checkpoint import checkpoint

    from training import model

    def every_chunk_checkpointed(logits, targets, chunk):
        return torch.stack([checkpoint(model._chunk_loss, logits[lo:lo + chunk], targets[lo:lo + chunk],
                                       use_reentrant=False) for lo in range(0, logits.shape[0], chunk)]).sum()

    def peak(loss_fn) -> int:
        gen = torch.Generator().manual_seed(3)
        hidden = torch.randn(tokens, 32, generator=gen, dtype=torch.bfloat16).requires_grad_()
        weight = torch.randn(8000, 32, generator=gen, dtype=torch.bfloat16).requires_grad_()
        targets = torch.randint(0, 8000, (tokens,), generator=gen)
        tracker = MemTracker()
        with tracker:
            loss_fn(hidden @ weight.T, targets, 512).backward()
        [(_, stats)] = tracker.get_tracker_snapshot("peak").items()
        return stats["Total"]

    assert peak(model.chunked_cross_entropy_sum) <= peak(every_chunk_checkpointed)


def test_gpu_branch_calls_varlen_flash_attention_with_the_packers_layout(monkeypatch):
    """The CUDA branch runs on CPU with only the device decision and the kernel injected: the
    kernel gets the flattened tokens, the packer's cu_seqlens (int32, on the tensors' device),
    causal window (-1, 0) and GQA without repeated keys/values (torch 2.13
    ``torch/nn/attention/varlen.py``: ``window_size == (-1, 0)`` is causal; ``enable_gqa``)."""
    from training import model as modeling
    from training.model import loss_sum

    seen = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa):
        seen.append({"q": tuple(q.shape), "k": tuple(k.shape), "cu": cu_q.tolist(), "cu_dtype": cu_q.dtype,
                     "same_cu": cu_q is cu_k, "max": (max_q, max_k), "window": window_size, "gqa": enable_gqa})
        return modeling._per_document_sdpa(q, k, v, cu_q.tolist(), scale)

    batch = _packed_batch()
    model = _tiny(packed=True)
    on_cpu = loss_sum(model, batch).item()
    monkeypatch.setattr(modeling, "_on_accelerator", lambda tensor: True)
    monkeypatch.setattr(modeling, "_varlen_attn", fake_varlen)
    on_gpu_branch = loss_sum(model, batch).item()
    layout = modeling.document_layout(batch["position_ids"], 3, 40)
    assert len(seen) == 2  # one call per decoder layer
    assert seen[0] == {"q": (120, 4, 16), "k": (120, 2, 16), "cu": layout.cu_seqlens.tolist(),
                       "cu_dtype": torch.int32, "same_cu": True, "max": (layout.max_len,) * 2,
                       "window": (-1, 0), "gqa": True}
    assert on_gpu_branch == pytest.approx(on_cpu, abs=1e-5)


def test_the_layout_goes_to_the_device_of_the_ids():
    """A batch already on the device, passed without ``device=``: the layout kwargs go where
    ``input_ids`` are (flash attention needs them there; a model without FSDP2's root moving its
    arguments would otherwise fail). ``meta`` is the second device a CPU machine has."""
    from training.model import loss_inputs

    batch = _packed_batch()
    on_device = {**batch, "input_ids": batch["input_ids"].to("meta"), "position_ids": batch["position_ids"]}
    inputs, _ = loss_inputs(None, on_device, packed=True)
    assert inputs["cu_seq_lens_q"].device == inputs["cu_seq_lens_k"].device == torch.device("meta")
    host, _ = loss_inputs(None, batch, packed=True)
    assert host["cu_seq_lens_q"].device == torch.device("cpu")
    moved, _ = loss_inputs(None, batch, torch.device("meta"), packed=True)
    assert moved["cu_seq_lens_q"].device == moved["input_ids"].device == torch.device("meta")


def test_evaluation_passes_the_host_batch_and_the_device(monkeypatch):
    """training/evaluation.py hands ``loss_sum`` the host batch and ``device`` (through the
    objective, training/objectives/sft.py), as training/loop.py does, so the indices and the
    layout are computed on the host and moved with the tokens."""
    import torch.distributed as dist

    from training import evaluation
    from training import model as forward

    seen = []

    def fake_loss_sum(model, batch, device=None):
        seen.append(({k: v.device for k, v in batch.items()}, device))
        return torch.tensor(1.0)

    monkeypatch.setattr(forward, "loss_sum", fake_loss_sum)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: None)
    batch = _packed_batch()
    device = torch.device("cpu")
    figures = evaluation.evaluate(torch.nn.Linear(1, 1), [batch], device=device, max_batches=4, step=0)
    assert figures["eval_batches_per_rank"] == 1
    assert seen == [({k: torch.device("cpu") for k in batch}, device)]
