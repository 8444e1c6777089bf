"""The data position is trainer state: resume = same sample sequence; epochs reshuffle; 2 ranks."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_data_support import DEMO_DIR, cfg_for, qwen_tokenizer

from training.data import DataError, build_data
from training.data.stream import PackedStream, SyntheticStream

SEQ = 64


def _streams(tmp_path, *, world: int, micro: int, gb: int, seed: int = 1234):
    cfg = cfg_for("text", str(DEMO_DIR / "text"), seq_len=SEQ, micro=micro, world=world, gb=gb, seed=seed)
    return [build_data(cfg, qwen_tokenizer(), rank=r, world_size=world, cache_dir=tmp_path).train
            for r in range(world)]


def _run(streams, steps: int) -> list[list[torch.Tensor]]:
    """Per optimizer step: every rank's micro-batches, in (micro-step, rank) order."""
    out = []
    for _ in range(steps):
        step = []
        for _ in range(streams[0].grad_accum_steps):
            for s in streams:
                b = s.next_batch()
                step.append(torch.cat([b["input_ids"], b["labels"]], dim=1))
        out.append(step)
    return out


def test_resume_at_step_k_with_accumulation_and_two_ranks_sees_the_same_samples(tmp_path):
    # 2 ranks x micro 2 x accumulation 2 = global batch 8
    full = _run(_streams(tmp_path, world=2, micro=2, gb=8), 9)
    first = _streams(tmp_path, world=2, micro=2, gb=8)
    part1 = _run(first, 4)
    states = [s.state_dict() for s in first]
    assert states[0] == states[1] and states[0]["consumed_samples"] == 32
    state = json.loads(json.dumps(states[0]))  # what a checkpoint stores
    resumed = _streams(tmp_path, world=2, micro=2, gb=8)
    for s in resumed:
        s.load_state_dict(state)
    part2 = _run(resumed, 5)
    for a, b in zip(full, part1 + part2):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_steps_see_the_same_samples_whatever_world_size_and_accumulation(tmp_path):
    two_ranks = _run(_streams(tmp_path, world=2, micro=1, gb=4), 6)  # 2 ranks x 2 accumulation
    one_proc = _run(_streams(tmp_path, world=1, micro=4, gb=4), 6)   # 1 process, 1 micro-batch of 4

    def rows(step):
        return sorted(tuple(r.tolist()) for t in step for r in t)

    assert [rows(s) for s in two_ranks] == [rows(s) for s in one_proc]
    # and a 2-rank checkpoint resumes in a 1-process run (same global batch)
    two = _streams(tmp_path, world=2, micro=1, gb=4)
    _run(two, 3)
    single = _streams(tmp_path, world=1, micro=2, gb=4)[0]
    single.load_state_dict(two[0].state_dict())
    assert [rows(s) for s in _run([single], 3)] == [rows(s) for s in one_proc[3:6]]


def test_epochs_cycle_with_a_fresh_deterministic_permutation(tmp_path):
    (stream,) = _streams(tmp_path, world=1, micro=1, gb=1)
    n = stream.num_blocks
    epoch0 = [stream.block_index(g) for g in range(n)]
    epoch1 = [stream.block_index(g) for g in range(n, 2 * n)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(n))
    assert epoch0 != epoch1
    rebuilt = _streams(tmp_path, world=1, micro=1, gb=1)[0]
    assert epoch0 == [rebuilt.block_index(g) for g in range(n)]
    other_seed = _streams(tmp_path / "s2", world=1, micro=1, gb=1, seed=99)[0]
    assert [other_seed.block_index(g) for g in range(n)] != epoch0
    for _ in range(n + 3):
        stream.next_batch()
    assert stream.epoch == 1 and stream.state_dict()["epoch"] == 1


def test_load_state_refuses_other_data_or_a_mid_step_state_with_another_layout(tmp_path):
    (stream,) = _streams(tmp_path, world=1, micro=1, gb=2)
    stream.next_batch()  # mid-step: 1 of 2 micro-batches
    state = stream.state_dict()
    (other_seed,) = _streams(tmp_path / "other", world=1, micro=1, gb=2, seed=5)
    with pytest.raises(DataError, match="seed"):
        other_seed.load_state_dict(state)
    tampered = {**state, "fingerprint": "0" * 24}
    with pytest.raises(DataError, match="fingerprint"):
        _streams(tmp_path, world=1, micro=1, gb=2)[0].load_state_dict(tampered)
    with pytest.raises(DataError, match="mid-step"):
        _streams(tmp_path, world=1, micro=1, gb=4)[0].load_state_dict(state)


def test_synthetic_is_seeded_in_range_resumable_and_marked(tmp_path):
    cfg = cfg_for("synthetic", "", seq_len=32, micro=2, world=2, gb=8)
    bundles = [build_data(cfg, None, rank=r, world_size=2) for r in range(2)]
    assert bundles[0].stats.is_synthetic and bundles[0].stats.kind == "synthetic"
    a = bundles[0].train.next_batch()
    assert a["input_ids"].shape == (2, 32) and torch.equal(a["input_ids"], a["labels"])
    assert 0 <= int(a["input_ids"].min()) and int(a["input_ids"].max()) < 151_936
    again = build_data(cfg, None, rank=0, world_size=2).train.next_batch()
    assert torch.equal(a["input_ids"], again["input_ids"])
    assert not torch.equal(a["input_ids"], bundles[1].train.next_batch()["input_ids"])
    full = _run([build_data(cfg, None, rank=r, world_size=2).train for r in range(2)], 4)
    fresh = [build_data(cfg, None, rank=r, world_size=2).train for r in range(2)]
    head = _run(fresh, 2)
    resumed = [build_data(cfg, None, rank=r, world_size=2).train for r in range(2)]
    for s in resumed:
        s.load_state_dict(fresh[0].state_dict())
    tail = _run(resumed, 2)
    assert all(torch.equal(x, y) for a_, b_ in zip(full, head + tail) for x, y in zip(a_, b_))
    assert len(bundles[0].eval_batches()) == len(bundles[1].eval_batches()) > 0


def test_stream_refuses_a_global_batch_that_does_not_divide():
    ids = np.zeros((4, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="not a multiple"):
        PackedStream(ids, ids, rank=0, world_size=2, micro_batch_size=3, global_batch_size=8, seed=0, fingerprint="x")
    with pytest.raises(ValueError, match="not a multiple"):
        SyntheticStream(vocab_size=10, seq_len=8, rank=2, world_size=2, micro_batch_size=1, global_batch_size=2,
                        seed=0, fingerprint="x")
