"""Held-out split at document level, and packing documents into fixed ``seq_len`` blocks.

Split: each document gets a key ``sha256(seed, content)``; the ``round(n * eval_fraction)``
documents (at least 1) with the smallest keys are held out. The choice depends only on the seed
and the documents' contents, not on file order, location (local vs s3://) or world size, and
identical documents always land on the same side (no train/eval leakage by duplication).

Packing: documents (shuffled by seed) are concatenated, each followed by the separator token
(``<|endoftext|>``), and cut into ``seq_len`` blocks. Labels are aligned with input_ids
(Hugging Face causal LMs shift them inside the loss) and are the token id where the token is a
training target, else -100. Text documents train on every token and on the separator (the model
learns where a document ends); chat documents only on assistant tokens (the separator is -100).
The tail that does not fill a block is dropped (counted in ``tokens_dropped``); only a corpus
smaller than one block is padded (pad = separator, label -100), so blocks are ~100% real tokens.
Attention is not masked across documents inside a block (the usual packed pre-training setup).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from training.data.records import DataError, Document
from training.data.tokenize import TokenizedDoc

IGNORE_INDEX = -100


def document_key(seed: int, doc: Document) -> bytes:
    content = doc.text if not doc.messages else json.dumps(doc.messages, sort_keys=True, ensure_ascii=False)
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
    real_tokens: int
    padding_tokens: int
    tokens_dropped: int

    @property
    def num_blocks(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def padding_fraction(self) -> float:
        total = self.input_ids.size
        return self.padding_tokens / total if total else 0.0


def pack(docs: list[TokenizedDoc], seq_len: int, separator_id: int, *, train_separator: bool,
         seed: int) -> PackedBlocks:
    """Shuffle ``docs`` by ``seed``, join them with the separator and cut into blocks."""
    order = np.random.default_rng([seed, 0x9ACC]).permutation(len(docs))
    sep = np.array([separator_id], dtype=np.int32)
    sep_trained = np.array([train_separator])
    ids = np.concatenate([part for i in order for part in (docs[i].ids, sep)])
    trained = np.concatenate([part for i in order for part in (docs[i].trained, sep_trained)])
    labels = np.where(trained, ids, IGNORE_INDEX).astype(np.int32)
    n_blocks, tail = divmod(len(ids), seq_len)
    padding = 0
    if n_blocks == 0:
        padding = seq_len - len(ids)
        ids = np.concatenate([ids, np.full(padding, separator_id, dtype=np.int32)])
        labels = np.concatenate([labels, np.full(padding, IGNORE_INDEX, dtype=np.int32)])
        n_blocks, tail = 1, 0
    keep = n_blocks * seq_len
    return PackedBlocks(
        input_ids=ids[:keep].reshape(n_blocks, seq_len).copy(),
        labels=labels[:keep].reshape(n_blocks, seq_len).copy(),
        real_tokens=keep - padding, padding_tokens=padding, tokens_dropped=tail,
    )
