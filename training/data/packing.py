"""Held-out split at document level, and packing documents into fixed ``seq_len`` blocks.

Split: each document gets a key ``sha256(seed, content)``; the ``round(n * eval_fraction)``
documents (at least 1) with the smallest keys are held out. The choice depends only on the seed
and the documents' contents, not on file order, location (local vs s3://) or world size, and
identical documents always land on the same side (no train/eval leakage by duplication).

Packing (documents shuffled by seed; each followed by the separator ``<|endoftext|>``):

- text documents: the documents are concatenated and cut into ``seq_len`` blocks (a long
  document continues in the next block). The tail that does not fill a block is dropped
  (``tokens_dropped``); only a corpus smaller than one block is padded.
- preference pairs: a pair is one piece of two documents (prompt + chosen, prompt + rejected:
  positions restart at the second), placed whole like a conversation; a pair longer than
  ``seq_len`` is dropped (``truncate``: counted) or refused, never cut.
- conversations (``whole_documents``): a conversation is never cut. Conversations are placed
  whole into blocks, best fit (the fullest block that still has room); the rest is padding.
  A conversation longer than ``seq_len`` follows ``data.overlong``: ``truncate`` keeps its first
  ``seq_len`` tokens (dropped when no target is left), ``refuse`` stops with a one-line error.

Attention stays inside each document: ``position_ids`` restart at 0 at every document start
(and at every block start), and with such positions, no attention mask and no KV cache,
transformers builds a per-document causal mask (packed sequences). The first token of each
document is not a target: the only thing before it in the block is another document.

Labels are aligned with input_ids (the loss shifts them) and are the token id where the token is
a training target, else -100. Text documents train on every other token and on the separator
(the model learns where a document ends); conversations only on assistant tokens. Padding is
the separator with label -100, positions restarting at 0 (it only attends to itself).
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from training.config_checks import OVERLONG_POLICIES
from training.data.records import DataError, Document
from training.data.tokenizer import TokenizedDoc

IGNORE_INDEX = -100


def document_key(seed: int, doc: Document) -> bytes:
    content = (json.dumps(doc.pair, sort_keys=True, ensure_ascii=False) if doc.pair else doc.text if not doc.messages
               else json.dumps(doc.messages, sort_keys=True, ensure_ascii=False))
    return hashlib.sha256(f"{seed}\x00".encode() + content.encode("utf-8")).digest()


def split_documents(documents: list[Document], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of (train, eval) documents; both non-empty, each in original order."""
    n = len(documents)
    if n < 2:
        raise DataError(f"{documents[0].source if documents else 'data'}: {n} document(s); "
                        "a held-out split needs at least 2")
    n_eval = min(n - 1, max(1, round(n * eval_fraction)))
    order = sorted(range(n), key=lambda i: (document_key(seed, documents[i]), i))
    held = set(order[:n_eval])
    return [i for i in range(n) if i not in held], [i for i in range(n) if i in held]


@dataclass(frozen=True, slots=True)
class PackedBlocks:
    input_ids: np.ndarray
    """int32 [blocks, seq_len]"""
    labels: np.ndarray
    """int32 [blocks, seq_len], -100 = not a target"""
    position_ids: np.ndarray
    """int32 [blocks, seq_len]: position inside the document, 0 at each document's start"""
    real_tokens: int
    padding_tokens: int
    tokens_dropped: int
    documents_truncated: int = 0
    """Documents longer than a block, cut to ``seq_len`` (``overlong = "truncate"``)."""
    documents_dropped: int = 0
    """Documents left with no training target after truncation."""

    @property
    def num_blocks(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def padding_fraction(self) -> float:
        total = self.input_ids.size
        return self.padding_tokens / total if total else 0.0

    @property
    def efficiency(self) -> float:
        """Share of block tokens that are real (not padding)."""
        return 1.0 - self.padding_fraction


def _positions(starts: np.ndarray) -> np.ndarray:
    """Position of each token inside its document, given True at every document start."""
    index = np.arange(len(starts))
    return (index - np.maximum.accumulate(np.where(starts, index, 0))).astype(np.int32)


def _labels(ids: np.ndarray, trained: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.where(trained & ~starts, ids, IGNORE_INDEX).astype(np.int32)


def pack(docs: list[TokenizedDoc], seq_len: int, separator_id: int, *, train_separator: bool,
         seed: int, whole_documents: bool = False, overlong: str = "truncate", source: str = "data") -> PackedBlocks:
    """Shuffle ``docs`` by ``seed`` and pack them into ``seq_len`` blocks (see the module docstring)."""
    order = np.random.default_rng([seed, 0x9ACC]).permutation(len(docs))
    if whole_documents:
        return _pack_whole([docs[i] for i in order], seq_len, separator_id, train_separator, overlong, source)
    sep = np.array([separator_id], dtype=np.int32)
    sep_trained = np.array([train_separator])
    ids = np.concatenate([part for i in order for part in (docs[i].ids, sep)])
    trained = np.concatenate([part for i in order for part in (docs[i].trained, sep_trained)])
    starts = np.concatenate([np.arange(len(docs[i].ids) + 1) == 0 for i in order])
    n_blocks, tail = divmod(len(ids), seq_len)
    padding = 0
    if n_blocks == 0:
        padding = seq_len - len(ids)
        ids = np.concatenate([ids, np.full(padding, separator_id, dtype=np.int32)])
        trained = np.concatenate([trained, np.zeros(padding, dtype=bool)])
        starts = np.concatenate([starts, np.arange(padding) == 0])
        n_blocks, tail = 1, 0
    keep = n_blocks * seq_len
    starts = starts[:keep].copy()
    starts[::seq_len] = True  # a document continued from the previous block cannot see its start
    return PackedBlocks(
        input_ids=ids[:keep].reshape(n_blocks, seq_len).copy(),
        labels=_labels(ids[:keep], trained[:keep], starts).reshape(n_blocks, seq_len),
        position_ids=_positions(starts).reshape(n_blocks, seq_len),
        real_tokens=keep - padding, padding_tokens=padding, tokens_dropped=tail,
    )


def _pack_whole(docs: list[TokenizedDoc], seq_len: int, separator_id: int, train_separator: bool,
                overlong: str, source: str) -> PackedBlocks:
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong: {overlong!r} (allowed: {', '.join(OVERLONG_POLICIES)})")
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    truncated = dropped = dropped_tokens = 0
    for doc in docs:
        ids = np.append(doc.ids, np.int32(separator_id)).astype(np.int32)
        trained = np.append(doc.trained, train_separator)
        if doc.starts is not None and len(ids) > seq_len:
            # a preference pair is two documents that must stay together and whole (DPO sums each
            # completion's log-probabilities): it is never cut, only dropped or refused
            if overlong == "refuse":
                raise DataError(f"{source}: a preference pair of {len(doc.ids)} tokens (prompt + chosen, prompt + "
                                f"rejected) does not fit train.seq_len = {seq_len} (data.overlong = 'refuse'; set "
                                "'truncate' to drop such pairs, or a longer seq_len)")
            dropped, dropped_tokens = dropped + 1, dropped_tokens + len(ids)
            continue
        if len(ids) > seq_len:
            if overlong == "refuse":
                raise DataError(f"{source}: a conversation of {len(doc.ids)} tokens does not fit train.seq_len = "
                                f"{seq_len} (data.overlong = 'refuse'; set 'truncate' or a longer seq_len)")
            dropped_tokens += len(ids) - seq_len
            ids, trained = ids[:seq_len], trained[:seq_len]
            if not trained[1:].any():
                dropped, dropped_tokens = dropped + 1, dropped_tokens + seq_len
                continue
            truncated += 1
        starts = np.arange(len(ids)) == 0
        if doc.starts is not None:
            starts[:len(doc.starts)] = doc.starts
        pieces.append((ids, trained, starts))
    # Best fit: each piece goes into the block with the least room that still holds it.
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
    for index, (ids, _, _) in enumerate(pieces):
        at = bisect.bisect_left(room, (len(ids), -1))
        if at == len(room):
            bins.append([index])
            free, slot = seq_len - len(ids), len(bins) - 1
        else:
            free, slot = room.pop(at)
            bins[slot].append(index)
            free -= len(ids)
        if free > 0:
            bisect.insort(room, (free, slot))
    n = max(1, len(bins))
    input_ids = np.full((n, seq_len), separator_id, dtype=np.int32)
    labels = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)
    starts = np.zeros((n, seq_len), dtype=bool)
    real = 0
    for row, members in enumerate(bins):
        at = 0
        for index in members:
            ids, trained, doc_starts = pieces[index]
            input_ids[row, at:at + len(ids)] = ids
            labels[row, at:at + len(ids)] = _labels(ids, trained, doc_starts)
            starts[row, at:at + len(ids)] = doc_starts
            at += len(ids)
        starts[row, at:at + 1] = True  # padding is its own "document"
        real += at
    starts[:, 0] = True
    positions = _positions(starts.reshape(-1)).reshape(n, seq_len)
    return PackedBlocks(input_ids=input_ids, labels=labels, position_ids=positions, real_tokens=real,
                        padding_tokens=n * seq_len - real, tokens_dropped=dropped_tokens,
                        documents_truncated=truncated, documents_dropped=dropped)
