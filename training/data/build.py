"""``build_data``: read, tokenize, split and pack ONCE per node, then hand each rank its stream.

The packed corpus (train and held-out blocks, stats, exact-match prompts) is cached in a
node-local directory keyed by everything that determines it (files' uri/size/mtime, kind,
tokenizer, seq_len, eval_fraction, seed, on_bad_record, format version). The first process on a
node to take the entry's file lock builds it; the other local ranks wait and load the same
arrays, so tokenization happens once per node per job, never per step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.data.packing import pack, split_documents
from training.data.formats import files_of, read_documents, reads
from training.data.records import DataError
from training.storage.files import cache_root, node_lock
from training.data.stream import PackedStream, SyntheticStream, TrainStream, eval_batches_for_rank
from training.data.tokenizer import chat_prompt_and_answer, tokenize_documents

CACHE_FORMAT = 3  # 2: per-document position ids, whole-conversation packing; 3: preference pairs
SYNTHETIC_VOCAB_DEFAULT = 151_936
SYNTHETIC_EVAL_BLOCKS = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class DataStats:
    """What the run record says about the data."""

    kind: str
    is_synthetic: bool
    documents: int = 0
    """Documents read (train + held out)."""
    train_documents: int = 0
    eval_documents: int = 0
    tokens: int = 0
    """Real (non-padding) tokens in the train blocks."""
    blocks: int = 0
    """Train blocks of seq_len (one epoch)."""
    eval_blocks: int = 0
    padding_fraction: float = 0.0
    """Share of padding in the train blocks (0 unless the corpus is smaller than one block)."""
    target_fraction: float = 1.0
    """Share of train-block tokens that are training targets (labels != -100)."""
    tokens_dropped: int = 0
    """Tokens not trained on: the tail that did not fill a last block (text), the cut-off part of
    truncated conversations and the conversations dropped (chat)."""
    packing_efficiency: float = 1.0
    """Share of the train blocks' tokens that are real (1 - padding_fraction)."""
    documents_truncated: int = 0
    """Conversations longer than train.seq_len, truncated (``data.overlong = "truncate"``)."""
    documents_dropped: int = 0
    """Conversations with no target left after truncation, not trained on."""
    bad_records_skipped: int = 0
    files: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalPrompt:
    """For generation-based exact match (chat data): the prompt ids and the expected answer."""

    prompt_ids: list[int]
    answer: str


@dataclass(kw_only=True, slots=True)
class DataBundle:
    """What :func:`build_data` returns for one rank."""

    train: TrainStream
    stats: DataStats
    eval_prompts: list[EvalPrompt] = field(default_factory=list)
    """Held-out chat prompts, the SAME list on every rank (empty for non-chat data)."""
    _eval_ids: np.ndarray | None = None
    _eval_labels: np.ndarray | None = None
    _eval_positions: np.ndarray | None = None
    _rank: int = 0
    _world_size: int = 1
    _micro: int = 1
    _max_eval_batches: int = 0

    def eval_batches(self, max_batches: int | None = None) -> list[dict[str, Any]]:
        """This rank's share of the held-out blocks; every rank gets the same number of batches
        (see ``eval_batches_for_rank``); at most ``max_batches`` (default ``eval.max_batches``)."""
        return eval_batches_for_rank(self._eval_ids, self._eval_labels, rank=self._rank,
                                     world_size=self._world_size, micro_batch_size=self._micro,
                                     max_batches=max_batches if max_batches is not None else self._max_eval_batches,
                                     position_ids=self._eval_positions)


def _tokenizer_fingerprint(tokenizer) -> str:
    parts = [type(tokenizer).__name__, str(len(tokenizer)), str(getattr(tokenizer, "chat_template", "") or ""),
             str(tokenizer.eos_token_id), str(getattr(tokenizer, "name_or_path", ""))]
    tok_file = Path(str(getattr(tokenizer, "name_or_path", ""))) / "tokenizer.json"
    if tok_file.is_file():
        st = tok_file.stat()
        parts += [str(st.st_size), str(st.st_mtime_ns)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def build_packed(cfg, tokenizer, separator_id: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read, split, tokenize and pack (no cache): the arrays and the JSON-safe metadata."""
    d = cfg.data
    read = read_documents(d.path, d.kind, on_bad_record=d.on_bad_record)
    train_idx, eval_idx = split_documents(read.documents, d.eval_fraction, d.seed)
    tokenized = tokenize_documents(tokenizer, read.documents)
    is_chat = bool(read.documents[0].messages)  # one corpus is all of one shape (formats.one_shape)
    is_pairs = bool(read.documents[0].pair)
    options = dict(train_separator=not (is_chat or is_pairs), whole_documents=is_chat or is_pairs, overlong=d.overlong,
                   source=d.path)
    train = pack([tokenized[i] for i in train_idx], cfg.train.seq_len, separator_id, seed=d.seed, **options)
    held = pack([tokenized[i] for i in eval_idx], cfg.train.seq_len, separator_id, seed=d.seed + 1, **options)
    prompts = []
    if is_chat:
        for i in eval_idx:
            ids, answer = chat_prompt_and_answer(tokenizer, list(read.documents[i].messages))
            prompts.append({"prompt_ids": ids, "answer": answer})
    stats = DataStats(
        kind=d.kind, is_synthetic=False, documents=len(read.documents), train_documents=len(train_idx),
        eval_documents=len(eval_idx), tokens=train.real_tokens, blocks=train.num_blocks,
        eval_blocks=held.num_blocks, padding_fraction=train.padding_fraction,
        target_fraction=float((train.labels != -100).mean()), tokens_dropped=train.tokens_dropped,
        packing_efficiency=train.efficiency, documents_truncated=train.documents_truncated,
        documents_dropped=train.documents_dropped,
        bad_records_skipped=read.bad_records, files=len(read.files),
    )
    arrays = {"train_ids": train.input_ids, "train_labels": train.labels, "train_positions": train.position_ids,
              "eval_ids": held.input_ids, "eval_labels": held.labels, "eval_positions": held.position_ids}
    # The stream's fingerprint is the CONTENT of the train blocks, so a resume elsewhere (another
    # node, a fresh download with new mtimes) is accepted exactly when it would see the same samples.
    digest = hashlib.sha256(train.input_ids.tobytes() + train.labels.tobytes()
                            + train.position_ids.tobytes()).hexdigest()[:24]
    meta = {"stats": stats.to_dict(), "eval_prompts": prompts, "files": read.fingerprint, "blocks_sha256": digest}
    return arrays, meta


def _cache_key(cfg, tokenizer, separator_id: int) -> str:
    d = cfg.data
    try:
        listing = [[f.uri, f.size, f.mtime] for f in files_of(d.path, d.kind)]
    except FileNotFoundError as err:
        raise DataError(f"{err} (data.kind {d.kind!r} reads {reads(d.kind)})") from None
    key = {"format": CACHE_FORMAT, "kind": d.kind, "files": listing, "seq_len": cfg.train.seq_len,
           "eval_fraction": d.eval_fraction, "seed": d.seed, "on_bad_record": d.on_bad_record, "overlong": d.overlong,
           "tokenizer": _tokenizer_fingerprint(tokenizer), "separator": separator_id}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def load_packed(cfg, tokenizer, *, cache_dir: str | Path | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any], str]:
    """The packed corpus for ``cfg`` from the node-local cache, building it under a lock if absent."""
    from training.data.tokenizer import document_separator_id

    separator_id = document_separator_id(tokenizer)
    key = _cache_key(cfg, tokenizer, separator_id)
    entry = (Path(cache_dir) if cache_dir else cache_root()) / f"data-{key}"
    with node_lock(entry):
        if not (entry / "meta.json").is_file():
            arrays, meta = build_packed(cfg, tokenizer, separator_id)
            entry.mkdir(parents=True, exist_ok=True)
            np.savez(entry / "blocks.npz", **arrays)
            (entry / "meta.json").write_text(json.dumps(meta), encoding="utf-8")  # written last: marks complete
        with np.load(entry / "blocks.npz") as npz:
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    return arrays, meta, key


def build_data(cfg, tokenizer, *, rank: int, world_size: int, cache_dir: str | Path | None = None) -> DataBundle:
    """The data for one rank of a job: see the ``training.data`` package docstring."""
    d, t = cfg.data, cfg.train
    common = dict(rank=rank, world_size=world_size, micro_batch_size=t.micro_batch_size,
                  global_batch_size=t.global_batch_size, seed=d.seed)
    place = dict(_rank=rank, _world_size=world_size, _micro=t.micro_batch_size, _max_eval_batches=cfg.eval.max_batches)
    if d.kind == "synthetic":
        vocab = int(cfg.model.config.get("vocab_size", 0)) or (len(tokenizer) if tokenizer is not None else 0) \
            or SYNTHETIC_VOCAB_DEFAULT
        fingerprint = f"synthetic-v{vocab}-s{t.seq_len}"
        stream = SyntheticStream(vocab_size=vocab, seq_len=t.seq_len, fingerprint=fingerprint, **common)
        held = SyntheticStream(vocab_size=vocab, seq_len=t.seq_len, fingerprint=fingerprint,
                               **{**common, "seed": d.seed + 1, "rank": 0, "world_size": 1, "micro_batch_size": 1,
                                  "global_batch_size": 1})
        eval_ids = np.stack([held.sample(g)[0] for g in range(SYNTHETIC_EVAL_BLOCKS)])
        stats = DataStats(kind="synthetic", is_synthetic=True, eval_blocks=SYNTHETIC_EVAL_BLOCKS)
        return DataBundle(train=stream, stats=stats, _eval_ids=eval_ids, _eval_labels=eval_ids.copy(), **place)
    arrays, meta, _ = load_packed(cfg, tokenizer, cache_dir=cache_dir)
    stream = PackedStream(arrays["train_ids"], arrays["train_labels"], arrays["train_positions"],
                          fingerprint=meta["blocks_sha256"], **common)
    prompts = [EvalPrompt(**p) for p in meta["eval_prompts"]]
    return DataBundle(train=stream, stats=DataStats(**meta["stats"]), eval_prompts=prompts,
                      _eval_ids=arrays["eval_ids"], _eval_labels=arrays["eval_labels"],
                      _eval_positions=arrays["eval_positions"], **place)
