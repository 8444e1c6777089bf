"""A tiny Qwen2 config for CPU tests (a plain module: ``from conftest import`` would pick up
whichever folder's conftest pytest loaded first)."""
from __future__ import annotations


# Special ids that fit a small vocabulary (a Qwen2Config with the real ids 151643.. and a small
# vocab fails: "Padding_idx must be within num_embeddings").
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
