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


class _ForceToken:
    """A logits processor that makes ``token`` the only choice: the model's first answer token is
    then its end-of-turn, and whether ``generate()`` stops there is the generation config's say."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        forced = scores.new_full(scores.shape, float("-inf"))
        forced[:, self.token] = 0.0
        return forced


def test_a_base_model_tuned_on_a_chat_template_stops_at_that_templates_end_of_turn(tmp_path):
    """A base model (generation config stopping at ``<|end_of_text|>`` only, as Llama 3.1's base
    ships) tuned on Llama 3's template, whose answers end with ``<|eot_id|>``: the export adds the
    end-of-turn to ``eos_token_id``, the only stop ``generate()`` reads (transformers 5.13
    generation/utils.py:2044-2057). Before, generation ran on past the answer."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessorList

    from tiny_llama import EOT, END_OF_TEXT, build_model_dir, build_tokenizer
    from training.checkpointing.export import export_model
    from training.data.tokenizer import chat_format

    base = AutoModelForCausalLM.from_pretrained(build_model_dir(tmp_path / "base"))
    base.generation_config = GenerationConfig(bos_token_id=base.config.bos_token_id, eos_token_id=END_OF_TEXT)
    end_of_turn = chat_format(build_tokenizer()).end_of_turn_id
    assert end_of_turn == EOT
    out = tmp_path / "hf"
    export_model(base, str(out), model_config={**base.config.to_dict(), "dtype": "float32"}, end_of_turn_id=end_of_turn)
    assert GenerationConfig.from_pretrained(out).eos_token_id == [END_OF_TEXT, EOT]
    assert base.generation_config.eos_token_id == END_OF_TEXT  # the live model's own config untouched

    loaded = AutoModelForCausalLM.from_pretrained(out)
    prompt = torch.tensor([[1, 2, 3]])
    generated = loaded.generate(prompt, max_new_tokens=5, do_sample=False,
                                logits_processor=LogitsProcessorList([_ForceToken(EOT)]))
    assert generated[0, 3:].tolist() == [EOT]


def test_an_end_of_turn_already_among_the_stops_changes_nothing():
    from transformers import GenerationConfig

    from training.checkpointing.export import stops_at_end_of_turn

    config = GenerationConfig(eos_token_id=[7, 9])
    assert stops_at_end_of_turn(config, 9) is config and stops_at_end_of_turn(config, None) is config
    assert stops_at_end_of_turn(GenerationConfig(eos_token_id=None), 4).eos_token_id == [4]


def test_the_export_takes_the_end_of_turn_the_runs_data_was_tokenized_with(tmp_path):
    """training/checkpointing/export.py reads the end-of-turn as training/data/tokenizer.py does: from the
    job's tokenizer when its data is real, none for synthetic tokens or a template-less tokenizer."""
    from types import SimpleNamespace

    from tiny_llama import EOT, build_model_dir
    from training.checkpointing.export import trained_end_of_turn

    def job(kind: str, model_dir):
        return SimpleNamespace(data=SimpleNamespace(kind=kind), model=SimpleNamespace(tokenizer="", path=str(model_dir)))

    llama = build_model_dir(tmp_path / "llama")
    plain = build_model_dir(tmp_path / "plain", chat_template=None)
    assert trained_end_of_turn(job("chat", llama)) == EOT
    assert trained_end_of_turn(job("synthetic", llama)) is None
    assert trained_end_of_turn(job("text", plain)) is None
