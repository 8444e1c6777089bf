"""Tokenize, mask, split and pack with the real Qwen2.5 tokenizer; local and s3:// sources."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_data_support import DEMO_DIR, cfg_for, qwen_tokenizer, s3_put_tree, use_moto

from training.data import DataError, build_data
from training.data.packing import pack, split_documents
from training.data.formats import read_documents
from training.data.records import Document
from training.data.tokenizer import TokenizedDoc, tokenize_documents

IM_END, ENDOFTEXT = 151645, 151643


def test_chat_labels_only_on_assistant_tokens_exactly():
    tok = qwen_tokenizer()
    messages = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"},
                {"role": "user", "content": "Convert 2 km to m."}, {"role": "assistant", "content": "2000 m"}]
    (doc,) = tokenize_documents(tok, [Document(source="x", line=1, messages=tuple(messages))])

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    system = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    pieces = [  # (ids, trained?)
        (enc(system + "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"), False),
        (enc("5") + [IM_END], True),
        (enc("\n<|im_start|>user\nConvert 2 km to m.<|im_end|>\n<|im_start|>assistant\n"), False),
        (enc("2000 m") + [IM_END], True),
        (enc("\n"), False),
    ]
    expected_ids = [i for ids, _ in pieces for i in ids]
    expected_labels = [i if trained else -100 for ids, trained in pieces for i in ids]
    assert doc.ids.tolist() == expected_ids == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert np.where(doc.trained, doc.ids, -100).tolist() == expected_labels
    assert tok.decode(doc.ids[doc.trained]) == "5<|im_end|>2000 m<|im_end|>"
    # packed: the separator after a chat is not a target
    block = pack([doc], len(doc.ids) + 1, ENDOFTEXT, train_separator=False, seed=0)
    assert block.input_ids[0, -1] == ENDOFTEXT and block.labels[0, -1] == -100
    assert block.labels[0, :-1].tolist() == expected_labels


@pytest.mark.parametrize("kind", ["text", "jsonl", "chat"])
def test_demo_corpus_packs_densely(kind, tmp_path):
    bundle = build_data(cfg_for(kind, str(DEMO_DIR / kind)), qwen_tokenizer(), rank=0, world_size=2, cache_dir=tmp_path)
    s = bundle.stats
    # text is cut at block boundaries (~100% real tokens); chat keeps conversations whole (best fit)
    dense = 0.99 if kind != "chat" else 0.9
    assert s.blocks >= 50 and s.packing_efficiency >= dense and s.tokens >= dense * s.blocks * 256
    assert s.packing_efficiency == pytest.approx(1 - s.padding_fraction)
    assert s.bad_records_skipped == 0 and not s.is_synthetic
    batch = bundle.train.next_batch()
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (2, 256)
    assert batch["input_ids"].dtype == batch["labels"].dtype == __import__("torch").int64
    n_sep = int((batch["input_ids"] == ENDOFTEXT).sum())
    assert n_sep >= 2  # documents are short: several per block, separated by <|endoftext|>
    assert int((batch["position_ids"] == 0).sum()) >= 2 * 2  # positions restart per document
    if kind == "chat":
        assert s.tokens_dropped == s.documents_truncated == s.documents_dropped == 0  # all fit in 256
        assert 0.03 < s.target_fraction < 0.3 and bundle.eval_prompts and s.eval_documents == len(bundle.eval_prompts)
        p = bundle.eval_prompts[0]
        assert p.prompt_ids[-3:] == [151644, 77091, 198]  # "<|im_start|>assistant\n"
    else:
        assert s.tokens_dropped < 256 and not bundle.eval_prompts
        # every token (separator included) is a target, except a document's first token (its
        # only context would be another document)
        starts = batch["position_ids"] == 0
        assert bool((batch["labels"][~starts] == batch["input_ids"][~starts]).all())
        assert bool((batch["labels"][starts] == -100).all()) and s.target_fraction > 0.95


def test_small_corpus_is_padded_with_ignored_labels(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(4)))
    bundle = build_data(cfg_for("jsonl", str(path), seq_len=64, world=1, micro=1, gb=1), qwen_tokenizer(),
                        rank=0, world_size=1, cache_dir=tmp_path / "c")
    assert bundle.stats.blocks == 1 and bundle.stats.padding_fraction > 0.5
    batch = bundle.train.next_batch()
    labels, positions = batch["labels"][0], batch["position_ids"][0]
    # padding and each document's first token carry no loss
    documents = 3  # train documents of the 4 (one is held out)
    assert int((labels == -100).sum()) == round(bundle.stats.padding_fraction * 64) + documents
    assert int((positions == 0).sum()) == documents + 1  # + the padding, its own "document"


def test_eval_split_is_document_level_deterministic_and_order_independent():
    docs = [Document(source="f", line=i, text=f"doc {i}") for i in range(200)]
    train, held = split_documents(docs, 0.05, seed=7)
    assert len(held) == 10 and sorted(train + held) == list(range(200))
    assert split_documents(docs, 0.05, seed=7) == (train, held)
    assert split_documents(docs, 0.05, seed=8)[1] != held
    moved = [Document(source="s3://b/other", line=999 - i, text=d.text) for i, d in enumerate(reversed(docs))]
    held_texts = {docs[i].text for i in held}
    assert {moved[i].text for i in split_documents(moved, 0.05, seed=7)[1]} == held_texts
    # duplicates never straddle the split
    dup = docs + [Document(source="g", line=1, text=docs[held[0]].text)]
    assert 200 in split_documents(dup, 0.05, seed=7)[1]
    with pytest.raises(DataError, match="at least 2"):
        split_documents(docs[:1], 0.05, seed=7)


def test_held_out_documents_are_not_in_train_blocks(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"record {i} says {i * 7919 % 1000}"}) + "\n" for i in range(100)))
    cfg = cfg_for("jsonl", str(path), seq_len=32, world=1, micro=1, gb=1, eval_fraction=0.1)
    tok = qwen_tokenizer()
    bundle = build_data(cfg, tok, rank=0, world_size=1, cache_dir=tmp_path / "c")
    train_text = tok.decode(bundle.train.input_ids.reshape(-1))
    eval_text = tok.decode(np.concatenate([b["input_ids"][0].numpy() for b in bundle.eval_batches(100)]))
    docs = read_documents(str(path), "jsonl").documents
    _, held = split_documents(docs, 0.1, seed=cfg.data.seed)
    assert len(held) == bundle.stats.eval_documents == 10
    for i in held:
        assert docs[i].text not in train_text
        assert docs[i].text in eval_text or docs[i].text[:12] in eval_text  # tail of the eval stream may be cut


def test_eval_batches_same_count_on_every_rank_each_block_once(tmp_path):
    cfg = cfg_for("text", str(DEMO_DIR / "text"), seq_len=64, micro=2, world=3, gb=6)
    tok = qwen_tokenizer()
    per_rank = [build_data(cfg, tok, rank=r, world_size=3, cache_dir=tmp_path).eval_batches(max_batches=1000)
                for r in range(3)]
    assert len({len(b) for b in per_rank}) == 1
    n_eval = build_data(cfg, tok, rank=0, world_size=3, cache_dir=tmp_path).stats.eval_blocks
    targets = [row for batches in per_rank for b in batches for row in b["labels"] if bool((row != -100).any())]
    assert len(targets) == n_eval
    assert len({tuple(t.tolist()) for t in targets}) == n_eval
    assert all(len(b) <= 2 for b in
               [build_data(cfg, tok, rank=0, world_size=3, cache_dir=tmp_path).eval_batches(max_batches=2)])


def test_tokenized_once_per_node_then_loaded_from_cache(tmp_path):
    cfg = cfg_for("chat", str(DEMO_DIR / "chat"))
    tok = qwen_tokenizer()
    first = build_data(cfg, tok, rank=0, world_size=2, cache_dir=tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    stamp = (entry / "blocks.npz").stat().st_mtime_ns
    second = build_data(cfg, tok, rank=1, world_size=2, cache_dir=tmp_path)
    assert (entry / "blocks.npz").stat().st_mtime_ns == stamp
    assert first.train.state_dict()["fingerprint"] == second.train.state_dict()["fingerprint"]
    assert not bool((first.train.next_batch()["input_ids"] == second.train.next_batch()["input_ids"]).all())


def test_s3_prefix_gives_the_same_blocks_as_the_local_copy(tmp_path, monkeypatch):
    use_moto(monkeypatch)
    head = b"".join((DEMO_DIR / "chat" / "arithmetic.jsonl").read_bytes().splitlines(keepends=True)[:150])
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "part-000.jsonl").write_bytes(head)
    s3_put_tree("data-bucket", "corpora/chat", {"part-000.jsonl": head, "README.md": b"not data"})
    tok = qwen_tokenizer()
    remote = build_data(cfg_for("chat", "s3://data-bucket/corpora/chat", seq_len=64), tok, rank=0, world_size=2,
                        cache_dir=tmp_path / "remote-cache")
    local = build_data(cfg_for("chat", str(tmp_path / "local"), seq_len=64), tok, rank=0, world_size=2,
                       cache_dir=tmp_path / "local-cache")
    assert remote.stats.files == 1
    assert remote.train.state_dict()["fingerprint"] == local.train.state_dict()["fingerprint"]
    with pytest.raises(DataError, match="s3://data-bucket/nothing"):
        build_data(cfg_for("chat", "s3://data-bucket/nothing"), tok, rank=0, world_size=2, cache_dir=tmp_path)


def test_skip_policy_counts_bad_records_in_stats(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"text": f"good record {i}"}) for i in range(20)] + ["{broken", json.dumps({"txt": "x"})]
    path.write_text("\n".join(lines) + "\n")
    bundle = build_data(cfg_for("jsonl", str(path), seq_len=16, world=1, micro=1, gb=1, on_bad_record="skip"),
                        qwen_tokenizer(), rank=0, world_size=1, cache_dir=tmp_path / "c")
    assert bundle.stats.bad_records_skipped == 2 and bundle.stats.documents == 20
    with pytest.raises(DataError, match=r"mixed\.jsonl, line 21: not valid JSON"):
        build_data(cfg_for("jsonl", str(path), seq_len=16, world=1, micro=1, gb=1), qwen_tokenizer(),
                   rank=0, world_size=1, cache_dir=tmp_path / "c")


def test_pack_concatenates_with_separators_and_drops_only_the_tail():
    docs = [TokenizedDoc(np.arange(1, 6, dtype=np.int32), np.ones(5, bool)),
            TokenizedDoc(np.arange(10, 13, dtype=np.int32), np.array([False, True, True]))]
    orders = ([1, 2, 3, 4, 5, 0, 10, 11, 12, 0], [10, 11, 12, 0, 1, 2, 3, 4, 5, 0])
    for seed in range(4):
        packed = pack(docs, 4, 0, train_separator=True, seed=seed)
        assert packed.num_blocks == 2 and packed.tokens_dropped == 2 and packed.padding_tokens == 0
        assert packed.input_ids.reshape(-1).tolist() in [o[:8] for o in orders]
        # no -100 but at a document's or a block's first token (10 is untrained anyway)
        first = (packed.position_ids == 0)
        expected = np.where(first | (packed.input_ids == 10), -100, packed.input_ids)
        assert (packed.labels == expected).all()
        # positions count inside each document and restart at every document and block start
        flat_ids, flat_pos = packed.input_ids.reshape(-1), packed.position_ids.reshape(-1)
        for index in range(1, 8):
            follows = flat_ids[index - 1] != 0 and index % 4 != 0
            assert flat_pos[index] == (flat_pos[index - 1] + 1 if follows else 0)
    assert pack(docs, 4, 0, train_separator=True, seed=1).input_ids.tolist() == \
        pack(docs, 4, 0, train_separator=True, seed=1).input_ids.tolist()


def test_committed_demo_corpus_is_what_its_generator_makes(tmp_path):
    from devtools.demo_corpus import main

    main(tmp_path)
    for rel in ("text/notes.txt", "jsonl/notes.jsonl", "chat/arithmetic.jsonl"):
        assert (tmp_path / rel).read_bytes() == (DEMO_DIR / rel).read_bytes(), rel
    assert sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file()) < 400_000
