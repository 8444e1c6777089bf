"""The train stream: which sample each rank sees at each micro-step, as resumable state.

Every sample has a GLOBAL index ``g`` (0, 1, 2, ...), independent of the world size. Optimizer
step ``s`` consumes the ``global_batch`` samples ``[s*G, (s+1)*G)``; inside the step,
accumulation micro-step ``a`` of rank ``r`` takes the ``micro`` samples starting at
``s*G + (a*world + r)*micro``. So a step sees the same samples whatever the world size and
accumulation (2 ranks x 1 micro-step == 1 rank x 2 micro-steps), and the position is one
number: ``consumed_samples``.

Packed data: sample ``g`` is block ``perm_e[g mod N]`` of the ``N`` train blocks, with
``e = g div N`` the epoch and ``perm_e`` a permutation seeded by ``(seed, e)``: each epoch
visits every block once, in a fresh deterministic order. Synthetic data: sample ``g`` is
``seq_len`` random ids drawn from a generator seeded by ``(seed, g)``.

``state_dict()`` is ``{"consumed_samples", "num_blocks", "fingerprint", ...}``; take it at an
optimizer-step boundary (after the last micro-batch of a step), where it is the same on every
rank. ``load_state_dict`` continues exactly there, also with a different world size or
micro-batch size as long as the global batch is the same, and refuses state from other data.
"""
from __future__ import annotations

import abc
from typing import Any

import numpy as np
import torch

from training.data.packing import IGNORE_INDEX
from training.data.records import DataError

STATE_VERSION = 1


class TrainStream(abc.ABC):
    """Base: maps this rank's k-th ``next_batch()`` to global sample indices."""

    def __init__(self, *, seq_len: int, rank: int, world_size: int, micro_batch_size: int,
                 global_batch_size: int, seed: int, fingerprint: str):
        per_pass = world_size * micro_batch_size
        if not 0 <= rank < world_size or global_batch_size % per_pass:
            raise ValueError(f"global batch {global_batch_size} is not a multiple of world size {world_size} "
                             f"x micro batch {micro_batch_size} (rank {rank})")
        self.seq_len, self.rank, self.world_size = seq_len, rank, world_size
        self.micro_batch_size, self.global_batch_size = micro_batch_size, global_batch_size
        self.grad_accum_steps = global_batch_size // per_pass
        self.seed, self.fingerprint = seed, fingerprint
        self._served = 0  # micro-batches this rank has returned

    # -- the position ------------------------------------------------------------------------
    @property
    def consumed_samples(self) -> int:
        """Global samples consumed by all ranks, counting whole steps plus this rank's micro-steps."""
        steps, micro = divmod(self._served, self.grad_accum_steps)
        return steps * self.global_batch_size + micro * self.world_size * self.micro_batch_size

    @property
    def step(self) -> int:
        """Optimizer steps fully served to this rank."""
        return self._served // self.grad_accum_steps

    def global_indices(self, served: int) -> list[int]:
        """Global sample indices of this rank's ``served``-th micro-batch (0-based)."""
        step, accum = divmod(served, self.grad_accum_steps)
        start = step * self.global_batch_size + (accum * self.world_size + self.rank) * self.micro_batch_size
        return list(range(start, start + self.micro_batch_size))

    def next_batch(self) -> dict[str, torch.Tensor]:
        """``{"input_ids", "labels"[, "position_ids"]}``: LongTensor [micro_batch_size, seq_len];
        labels aligned with input_ids (the model shifts), -100 = not a target; packed data adds
        the per-document ``position_ids`` (attention stays inside each document)."""
        rows = [self.sample(g) for g in self.global_indices(self._served)]
        self._served += 1
        names = ("input_ids", "labels", "position_ids")
        return {name: torch.from_numpy(np.stack([r[k] for r in rows]).astype(np.int64))
                for k, name in enumerate(names[:len(rows[0])])}

    @abc.abstractmethod
    def sample(self, g: int) -> tuple[np.ndarray, ...]:
        """Sequence ``g`` of the global sample order: (input_ids, labels[, position_ids])."""

    @property
    def epoch(self) -> int:
        return 0

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "consumed_samples": self.consumed_samples,
                "global_batch_size": self.global_batch_size, "seed": self.seed,
                "fingerprint": self.fingerprint, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise DataError(f"data state version {state.get('version')!r} is not {STATE_VERSION}")
        for key in ("seed", "fingerprint"):
            if state.get(key) != getattr(self, key):
                raise DataError(f"data state {key} {state.get(key)!r} does not match this run's data "
                                f"({getattr(self, key)!r}): the data or its settings changed since the checkpoint")
        consumed = int(state["consumed_samples"])
        per_pass = self.world_size * self.micro_batch_size
        steps, rest = divmod(consumed, self.global_batch_size)
        if state.get("global_batch_size") != self.global_batch_size and rest:
            raise DataError(f"data state taken mid-step ({consumed} samples) cannot resume with another global batch")
        if rest % per_pass:
            raise DataError(f"data state at {consumed} samples is not on a micro-batch boundary "
                            f"of world {self.world_size} x micro {self.micro_batch_size}")
        self._served = steps * self.grad_accum_steps + rest // per_pass


class PackedStream(TrainStream):
    """Packed blocks, reshuffled every epoch with a permutation seeded by (seed, epoch)."""

    def __init__(self, input_ids: np.ndarray, labels: np.ndarray, position_ids: np.ndarray | None = None, **kwargs):
        super().__init__(seq_len=int(input_ids.shape[1]), **kwargs)
        self.input_ids, self.labels, self.position_ids = input_ids, labels, position_ids
        self.num_blocks = int(input_ids.shape[0])
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_blocks)
            self._perm_epoch = epoch
        return self._perm

    def block_index(self, g: int) -> int:
        epoch, pos = divmod(g, self.num_blocks)
        return int(self._permutation(epoch)[pos])

    def sample(self, g: int) -> tuple[np.ndarray, ...]:
        b = self.block_index(g)
        if self.position_ids is None:
            return self.input_ids[b], self.labels[b]
        return self.input_ids[b], self.labels[b], self.position_ids[b]

    @property
    def epoch(self) -> int:
        return self.consumed_samples // self.num_blocks

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "num_blocks": self.num_blocks}


class SyntheticStream(TrainStream):
    """Random ids in ``[0, vocab_size)``, a pure function of (seed, global index): infra checks only."""

    def __init__(self, *, vocab_size: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size

    def sample(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.random.default_rng([self.seed, g]).integers(0, self.vocab_size, self.seq_len, dtype=np.int64)
        return ids, ids


def eval_batches_for_rank(input_ids: np.ndarray, labels: np.ndarray, *, rank: int, world_size: int,
                          micro_batch_size: int, max_batches: int | None,
                          position_ids: np.ndarray | None = None) -> list[dict[str, torch.Tensor]]:
    """Held-out blocks dealt round-robin: every rank gets the SAME number of batches (FSDP needs
    all ranks in each forward); slots past the last block repeat a block with labels all -100,
    so they add no tokens to a loss computed as sum over tokens / count of targets."""
    n = int(input_ids.shape[0])
    per_round = world_size * micro_batch_size
    rounds = -(-n // per_round)
    if max_batches:
        rounds = min(rounds, max_batches)
    batches = []
    for j in range(rounds):
        ids, labs, pos = [], [], []
        for i in range(micro_batch_size):
            e = j * per_round + rank * micro_batch_size + i
            ids.append(input_ids[e % n])
            labs.append(labels[e] if e < n else np.full(input_ids.shape[1], IGNORE_INDEX, dtype=labels.dtype))
            if position_ids is not None:
                pos.append(position_ids[e % n])
        batch = {"input_ids": torch.from_numpy(np.stack(ids).astype(np.int64)),
                 "labels": torch.from_numpy(np.stack(labs).astype(np.int64))}
        if pos:
            batch["position_ids"] = torch.from_numpy(np.stack(pos).astype(np.int64))
        batches.append(batch)
    return batches
