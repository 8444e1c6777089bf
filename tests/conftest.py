"""Shared fixtures: a tiny Qwen2 config and ONE local Ray cluster per test session.

Every ``TorchTrainer.fit`` costs ~20-30 s of start-up on 2 cores, and ``ray.init`` itself a few
seconds more: tests that need Ray take ``ray_cluster`` and share the same one.
"""
from __future__ import annotations

import os

import pytest

# Special ids that fit a small vocabulary (a Qwen2Config with the real ids 151643.. and a small
# vocab fails: "Padding_idx must be within num_embeddings", pitfalls.md).
TINY_VOCAB = 512


def tiny_qwen2_config(vocab_size: int = TINY_VOCAB, **overrides) -> dict:
    """Keyword arguments of a ~0.1 M-parameter Qwen2Config (2 layers, GQA 4/2 heads)."""
    special = vocab_size - 1
    config = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=True, pad_token_id=special, bos_token_id=special,
                  eos_token_id=special)
    config.update(overrides)
    return config


@pytest.fixture
def tiny_qwen2():
    """A tiny Qwen2 config (dict of Qwen2Config kwargs) with a small vocabulary."""
    return tiny_qwen2_config()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs; no dashboard)."""
    ray = pytest.importorskip("ray")
    # Each ray.train.report waits for a controller poll (pitfalls.md): poll fast in tests.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}})
    yield ray
    ray.shutdown()
