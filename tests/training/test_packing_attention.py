"""Packed documents do not see each other, and chat conversations are never cut."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_data_support import DEMO_DIR, cfg_for, qwen_tokenizer

from tiny_qwen import tiny_qwen2_config
from training.data import DataError, build_data
from training.data.packing import pack
from training.data.records import read_documents
from training.data.tokenize import TokenizedDoc, tokenize_documents

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
    docs = tokenize_documents(tok, read.documents[:40], "chat")
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
