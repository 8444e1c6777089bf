"""Conversations in the model's own format (training/data/tokenizer.py ``chat_format``,
``chat_template_text``; training/data/tokenizer.py): Qwen2.5's ids and masks exactly as before,
a Llama-3-style template's assistant-only mask and stop tokens, the template read as
transformers reads it, and a tokenizer without a template refused in one line."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from test_data_support import DEMO_DIR, qwen_tokenizer
from tiny_llama import EOT, END_OF_TEXT, LLAMA3_CHAT_TEMPLATE, build_tokenizer

from training.data.formats import read_documents
from training.data.records import DataError, Document
from training.data.tokenizer import chat_prompt_and_answer, tokenize_documents
from training.data.tokenizer import chat_format, chat_template_text

EXTRA = [  # beyond the demo corpus: a system turn, a trailing newline, non-ASCII, padded content
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello\n"}],
    [{"role": "user", "content": "ünïcode ✓"}, {"role": "assistant", "content": "  spaced  "},
     {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
]
QWEN_FINGERPRINT = "1930182f1555f97b521656d0269e5fd223017724b8a025fd4b96a2257cbc7ac7"
"""SHA-256 of every conversation's ids, trained mask, eval prompt ids and answer, computed with
the code before chat_format existed (commit 1e27736: Qwen's ``<|im_end|>`` written in the code)."""


def test_qwen_ids_masks_and_eval_prompts_are_the_old_codes_on_the_shipped_chat_data():
    tok = qwen_tokenizer()
    docs = list(read_documents(str(DEMO_DIR / "chat"), "chat").documents)
    docs += [Document(source="x", line=i, messages=tuple(m)) for i, m in enumerate(EXTRA)]
    digest = hashlib.sha256()
    for doc, tokenized in zip(docs, tokenize_documents(tok, docs)):
        prompt_ids, answer = chat_prompt_and_answer(tok, list(doc.messages))
        digest.update(json.dumps([tokenized.ids.tolist(), tokenized.trained.tolist(), prompt_ids, answer]).encode())
    assert len(docs) == 1102 and digest.hexdigest() == QWEN_FINGERPRINT


def test_qwen_end_of_turn_and_stop_ids_come_from_its_files():
    from transformers import GenerationConfig

    fmt = chat_format(qwen_tokenizer(), GenerationConfig(eos_token_id=[151645, 151643]))  # Qwen2.5-Instruct's
    assert (fmt.end_of_turn, fmt.end_of_turn_id, fmt.stop_ids) == ("<|im_end|>", 151645, {151645, 151643})
    assert chat_format(qwen_tokenizer()).stop_ids == {151645}  # no generation config: the tokenizer's eos


def test_llama3_template_trains_only_the_answers_and_their_eot():
    tok = build_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"},
                {"role": "assistant", "content": "5"}, {"role": "user", "content": "2 km in m?"},
                {"role": "assistant", "content": "2000 m"}]
    (doc,) = tokenize_documents(tok, [Document(source="x", line=1, messages=tuple(messages))])

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    pieces = [  # (ids, trained?)
        (enc("<|begin_of_text|>" + header.format("system") + "Be brief.<|eot_id|>" + header.format("user")
             + "2 + 3?<|eot_id|>" + header.format("assistant")), False),
        (enc("5") + [EOT], True),
        (enc(header.format("user") + "2 km in m?<|eot_id|>" + header.format("assistant")), False),
        (enc("2000 m") + [EOT], True),
    ]
    assert doc.ids.tolist() == [i for ids, _ in pieces for i in ids] == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert np.where(doc.trained, doc.ids, -100).tolist() == [i if t else -100 for ids, t in pieces for i in ids]
    prompt_ids, answer = chat_prompt_and_answer(tok, messages)
    assert tok.decode(prompt_ids).endswith(header.format("assistant")) and answer == "2000 m"


def test_llama3_stops_at_its_eot_although_the_tokenizer_eos_is_end_of_text():
    """transformers 5.13 generation/utils.py:2044-2057: generate() stops at every id of the
    generation config's ``eos_token_id`` (an int or a list); the eval stops at those, the
    tokenizer's eos and the template's end-of-turn."""
    from transformers import GenerationConfig

    tok = build_tokenizer()
    assert tok.eos_token_id == END_OF_TEXT
    assert chat_format(tok).stop_ids == {END_OF_TEXT, EOT}  # <|eot_id|> read off the template
    fmt = chat_format(tok, GenerationConfig(eos_token_id=[END_OF_TEXT, EOT]))
    assert (fmt.end_of_turn, fmt.end_of_turn_id, fmt.stop_ids) == ("<|eot_id|>", EOT, {END_OF_TEXT, EOT})


def test_no_chat_template_is_one_line():
    tok = build_tokenizer(chat_template=None)
    doc = Document(source="x", line=1, messages=({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}))
    with pytest.raises(DataError, match="has no chat template .* give model.tokenizer a tokenizer that has one") as err:
        tokenize_documents(tok, [doc])
    assert "\n" not in str(err.value)
    assert tokenize_documents(tok, [Document(source="x", line=1, text="plain text")])  # text needs none


def test_a_template_that_never_ends_a_turn_is_refused():
    tok = build_tokenizer(chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                                        "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(DataError, match="closes an assistant turn with '\\\\n': no stop or special token"):
        chat_format(tok)


@pytest.mark.parametrize("layout", ["jinja-file", "tokenizer-config", "config-list", "named-only", "none"])
def test_chat_template_text_reads_what_transformers_reads(tmp_path, layout):
    """transformers 5.13 tokenization_utils_base.py:1795-1811 (chat_template.jinja and
    additional_chat_templates/*.jinja over tokenizer_config.json's "chat_template", a list of
    named ones becoming a dict, :1090) and :3260-3290 (``get_chat_template``: the lone template,
    else the one named ``default``; none: a ValueError)."""
    from transformers import AutoTokenizer

    tok = build_tokenizer(chat_template=None if layout in ("none", "named-only") else LLAMA3_CHAT_TEMPLATE)
    tok.save_pretrained(str(tmp_path), save_jinja_files=layout == "jinja-file")
    config_file = tmp_path / "tokenizer_config.json"
    if layout == "config-list":
        config = json.loads(config_file.read_text())
        config["chat_template"] = [{"name": "default", "template": LLAMA3_CHAT_TEMPLATE}, {"name": "tool_use", "template": "x"}]
        config_file.write_text(json.dumps(config))
    if layout == "named-only":
        (tmp_path / "additional_chat_templates").mkdir()
        (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("{{ messages }}")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    try:
        expected = loaded.get_chat_template()
    except ValueError:
        expected = ""
    assert chat_template_text(tmp_path) == expected
    assert (expected == LLAMA3_CHAT_TEMPLATE) == (layout in ("jinja-file", "tokenizer-config", "config-list"))
    assert chat_template_text(f"s3://bucket/{tmp_path.name}") is None  # read by the workers


def chatml_with_generation(newline_inside: bool) -> str:
    """Qwen2.5's ChatML with ``{% generation %}`` around each answer and its ``<|im_end|>`` (and,
    with ``newline_inside``, the newline the template writes after it)."""
    block = "{% generation %}{{ m['content'] }}<|im_end|>" + ("\n{% endgeneration %}" if newline_inside
                                                               else "{% endgeneration %}\n")
    return ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n" + block +
            "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("inside", [False, True], ids=["eot-closes-the-block", "newline-inside-the-block"])
def test_the_mask_is_transformers_own_for_a_template_with_generation_markers(inside):
    """Oracle: transformers 5.13 ``apply_chat_template(..., return_assistant_tokens_mask=True)``
    (tokenization_utils_base.py:3146-3162: the tokens from ``char_to_token(start)`` to
    ``char_to_token(end - 1)`` of each ``{% generation %}`` block, utils/chat_template_utils.py
    :433-471), on the real Qwen2.5 tokenizer and every shipped conversation. A block that closes
    with the end-of-turn token gives the same mask; what a block holds after it (a newline) is
    the template's own and stays untrained here, the one deliberate difference."""
    import copy

    tok = copy.deepcopy(qwen_tokenizer())
    tok.chat_template = chatml_with_generation(inside)
    docs = list(read_documents(str(DEMO_DIR / "chat"), "chat").documents)
    docs += [Document(source="x", line=i, messages=tuple(m)) for i, m in enumerate(EXTRA)]
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    for doc, ours in zip(docs, tokenize_documents(tok, docs), strict=True):
        theirs = tok.apply_chat_template(list(doc.messages), tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
        assert list(theirs["input_ids"]) == ours.ids.tolist()
        mask = np.asarray(theirs["assistant_masks"], dtype=bool)
        if inside:  # transformers also trains the newline after each <|im_end|>
            after_eot = np.zeros_like(mask)
            after_eot[1:] = (ours.ids[:-1] == 151645) & (ours.ids[1:] == newline[0])
            assert not (ours.trained & after_eot).any() and (mask & after_eot).any()
            mask &= ~after_eot
        assert mask.tolist() == ours.trained.tolist()


def test_a_multi_token_end_of_turn_is_refused_in_one_line():
    """A template that closes a turn with text the tokenizer splits into several tokens (``</s>``
    where it is no token of the vocabulary: 4 byte tokens, then a newline) could teach no single
    stop token: refused in one line where the conversations are tokenized (a DataError: the
    run fails with it, not retried). The driver's check (training/data/check.py) reads the
    template's text only, with the standard library: it cannot tokenize."""
    tok = build_tokenizer(chat_template="{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>\n{% endfor %}"
                                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    assert len(tok("</s>", add_special_tokens=False)["input_ids"]) == 4
    with pytest.raises(DataError, match=r"closes an assistant turn with '</s>\\n': no stop or special token") as err:
        tokenize_documents(tok, [Document(source="x", line=1, messages=(
            {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}))])
    assert "\n" not in str(err.value)


def test_an_end_of_turn_that_is_the_eos_then_a_newline_is_one_token_trained_stopped_at_and_exported():
    """Llama 2 / Mistral close a turn with the eos ``</s>`` (then, in many templates, a newline):
    the end of turn is the ONE token ``</s>``, trained as the answer's last target (not the
    newline), the evaluation stops at it, and the export's generation config stops at it
    (transformers 5.13 generation/utils.py:2044-2057: ``eos_token_id`` an int or a list)."""
    from transformers import GenerationConfig

    from training.checkpointing.export import stops_at_end_of_turn

    tok = build_tokenizer(chat_template="{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% if m['role'] == "
                                        "'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
                                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    tok.add_special_tokens({"eos_token": "</s>"})
    eos = tok.eos_token_id
    found = chat_format(tok, GenerationConfig(eos_token_id=END_OF_TEXT))
    assert (found.end_of_turn, found.end_of_turn_id, found.stop_ids) == ("</s>", eos, {eos, END_OF_TEXT})
    messages = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "c"})
    done = tokenize_documents(tok, [Document(source="x", line=1, messages=messages)])[0]
    trained = [tok.decode([i]) for i, t in zip(done.ids.tolist(), done.trained.tolist()) if t]
    assert trained == ["a", "b", "</s>", "c", "</s>"]
    assert stops_at_end_of_turn(GenerationConfig(eos_token_id=END_OF_TEXT), eos).eos_token_id == [END_OF_TEXT, eos]
