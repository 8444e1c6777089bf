"""A tiny Llama-architecture model with its own Llama-3-style tokenizer and chat template, built
offline into one model directory (config.json, generation_config.json, weights, tokenizer), as a
model from the hub arrives: a plain module, like tiny_qwen.py.

The tokenizer is byte-level (one token per byte, no merges: ids 0-255) plus Llama 3's special
tokens; its chat template is Meta-Llama-3-8B-Instruct's (tokenizer_config.json "chat_template"
on the hub, meta-llama/Meta-Llama-3-8B-Instruct), which closes every turn with ``<|eot_id|>``.
As in Llama 3.1's base model, the TOKENIZER's eos is ``<|end_of_text|>``; only the generation
config (``eos_token_id`` a list, as Meta ships it) and the template name ``<|eot_id|>``.
"""
from __future__ import annotations

from pathlib import Path

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT = range(256, 256 + len(SPECIAL))
VOCAB = 272  # 256 bytes + the special tokens, rounded up


def build_tokenizer(chat_template: str | None = LLAMA3_CHAT_TEMPLATE):
    """The byte-level tokenizer (a transformers fast tokenizer), with or without a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIAL[0], eos_token=SPECIAL[1],
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = chat_template
    return tokenizer


def build_model_dir(target: Path, *, chat_template: str | None = LLAMA3_CHAT_TEMPLATE, seed: int = 0) -> Path:
    """Write a random-init ~50 k-parameter LlamaForCausalLM and its tokenizer into ``target``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=END_OF_TEXT)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=[END_OF_TEXT, EOT])
    model.save_pretrained(str(target))
    build_tokenizer(chat_template).save_pretrained(str(target))
    return target
