"""The exported model generates as the base model does: its generation config (sampling
defaults, stop ids) travels into ``hf/``, and the KV cache, off for training, is on again.

transformers 5.13 (``generation/utils.py``, ``GenerationMixin._prepare_generation_config``):
``generate()`` starts from ``model.generation_config``, read from ``generation_config.json``
by ``from_pretrained``; a model saved from a bare config gets only defaults derived from
``config.json``. With ``use_cache`` false in config.json every generated token recomputes the
whole prefix (``_prepare_cache_for_generation`` makes no cache)."""
from __future__ import annotations

import json


def test_export_keeps_the_base_models_generation_config_and_the_kv_cache(tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from training.checkpointing.export import export_model

    config = Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, vocab_size=128, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config)
    base = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, repetition_penalty=1.05, eos_token_id=[5, 6])
    model.generation_config = base
    model.config.use_cache = False  # as training/model.py builds it
    out = tmp_path / "hf"
    export_model(model, str(out), model_config={**model.config.to_dict(), "dtype": "float32"})
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.config.use_cache is True
    for key in ("do_sample", "temperature", "top_p", "repetition_penalty", "eos_token_id"):
        assert getattr(loaded.generation_config, key) == getattr(base, key), key
