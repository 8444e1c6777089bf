"""Documents -> token ids and a per-token "trained" mask.

Text documents are trained on every token. Chat documents are rendered with the tokenizer's
own chat template and trained ONLY on assistant tokens: the assistant's content and the
end-of-turn token that closes its turn (so the model learns to stop: ``<|im_end|>`` for Qwen2.5,
``<|eot_id|>`` for Llama 3, read off the template by :func:`training.data.tokenizer.chat_format`),
not the system/user turns, not the assistant header the generation prompt writes and not what
the template writes after the end-of-turn token (Qwen's newline).

The assistant spans are found on the rendered TEXT, by rendering growing prefixes of the
conversation: ``render(messages[:i], add_generation_prompt=True)`` ends where assistant
message ``i`` begins and ``render(messages[:i+1])`` ends just after it (the prefix diff
transformers 5.13's own ``encode_message_with_chat_template`` does, tokenization_utils_base.py
:3178-3236, on text). Its ``return_assistant_tokens_mask`` (:3146-3162) needs a template with
``{% generation %}`` blocks, which neither Qwen2.5's nor Llama 3's has (chat_template_utils.py
:508 warns and marks nothing), so it is not used. The full text is then tokenized once (so ids
equal what ``apply_chat_template(..., tokenize=True)`` gives) and a token is trained when its
first character lies inside an assistant span.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.data.records import DataError, Document
from training.data.tokenizer import chat_format

BATCH = 256


@dataclass(frozen=True, slots=True)
class TokenizedDoc:
    ids: np.ndarray
    """int32 token ids."""
    trained: np.ndarray
    """bool, same length: True where the token is a training target."""
    starts: np.ndarray | None = None
    """A preference pair: bool, same length, True where each of its two sequences starts (they
    are packed together and attend each within itself). None: one document."""


def render_chat(tokenizer, messages: list[dict[str, str]], end_of_turn: str) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as text, and the (start, end) character spans of the assistant turns,
    each ending just after its ``end_of_turn`` token."""
    msgs = list(messages)
    full = tokenizer.apply_chat_template(msgs, tokenize=False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True)
        upto = full if i == len(msgs) - 1 else tokenizer.apply_chat_template(msgs[:i + 1], tokenize=False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise DataError("the tokenizer's chat template does not render conversations prefix by prefix; "
                            "assistant-only labels need a template that does (Qwen2.5's and Llama 3's do)")
        # The turn ends with the end-of-turn token; what the template writes after it is its own.
        end = upto.rfind(end_of_turn, len(before))
        if end < 0:
            raise DataError(f"the tokenizer's chat template closes assistant turn {i} without its end-of-turn "
                            f"token {end_of_turn!r}")
        spans.append((len(before), end + len(end_of_turn)))
    return full, spans


def _trained_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    starts = np.fromiter((o[0] for o in offsets), dtype=np.int64, count=len(offsets))
    trained = np.zeros(len(offsets), dtype=bool)
    for lo, hi in spans:
        trained |= (starts >= lo) & (starts < hi)
    return trained


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_pair(tokenizer, pair: tuple) -> TokenizedDoc:
    """A preference pair as TRL 1.16.0 tokenizes it (``trl/trainer/dpo_trainer.py``
    ``DPOTrainer._prepare_dataset``): plain text gets the tokenizer's eos appended to each
    completion (unless it ends with it) and is tokenized with the tokenizer's own special-token
    rule (``trl/data_utils.py`` ``_tokenize``: ``processing_class(text=...)``); conversations
    through the chat template (the prompt with the generation prompt). The completion starts
    where the tokenized prompt and prompt + completion diverge (``common_prefix_length``), the
    shorter of the two; its tokens are the targets. The result is prompt + chosen, then
    prompt + rejected, each its own document."""
    prompt, chosen, rejected = pair
    if isinstance(prompt, str):
        eos = tokenizer.eos_token or ""
        chosen, rejected = (c if c.endswith(eos) else c + eos for c in (chosen, rejected))
        encode = lambda text: list(tokenizer(text)["input_ids"])  # noqa: E731
        prompt_ids = encode(prompt)
        full = [encode(prompt + chosen), encode(prompt + rejected)]
    else:
        def encode_chat(messages, **kw):
            return list(tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, **kw)["input_ids"])
        prompt_ids = encode_chat(prompt, add_generation_prompt=True)
        full = [encode_chat(tuple(prompt) + tuple(chosen)), encode_chat(tuple(prompt) + tuple(rejected))]
    keep = min(_common_prefix(prompt_ids, f) for f in full)
    ids, trained, starts = [], [], []
    for sequence in full:
        completion = sequence[keep:]
        if not completion:
            raise DataError("a preference pair's completion is empty after tokenization (nothing to compare)")
        ids += prompt_ids[:keep] + completion
        trained += [False] * keep + [True] * len(completion)
        starts += [True] + [False] * (keep + len(completion) - 1)
    return TokenizedDoc(np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool), np.asarray(starts, dtype=bool))


def tokenize_documents(tokenizer, documents: list[Document]) -> list[TokenizedDoc]:
    """Tokenize every document (batched through the fast tokenizer), in order: a conversation
    is trained on its assistant turns, a text on every token, a preference pair on its two
    completions (:func:`tokenize_pair`)."""
    if documents and documents[0].pair:
        return [tokenize_pair(tokenizer, d.pair) for d in documents]
    out: list[TokenizedDoc] = []
    end_of_turn = chat_format(tokenizer).end_of_turn if any(d.messages for d in documents) else ""
    for lo in range(0, len(documents), BATCH):
        chunk = documents[lo:lo + BATCH]
        done: dict[int, TokenizedDoc] = {}
        chats = [i for i, d in enumerate(chunk) if d.messages]
        texts = [i for i, d in enumerate(chunk) if not d.messages]
        if chats:
            rendered = [render_chat(tokenizer, list(chunk[i].messages), end_of_turn) for i in chats]
            enc = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
            for i, ids, offsets, (_, spans) in zip(chats, enc["input_ids"], enc["offset_mapping"], rendered):
                done[i] = TokenizedDoc(np.asarray(ids, dtype=np.int32), _trained_from_offsets(offsets, spans))
        if texts:
            enc = tokenizer([chunk[i].text for i in texts], add_special_tokens=False)
            for i, ids in zip(texts, enc["input_ids"]):
                arr = np.asarray(ids, dtype=np.int32)
                done[i] = TokenizedDoc(arr, np.ones(len(arr), dtype=bool))
        out.extend(done[i] for i in range(len(chunk)))
    return out


def chat_prompt_and_answer(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], str]:
    """For exact-match eval: the ids of everything before the LAST assistant turn (with the
    template's generation prompt, ``<|im_start|>assistant\\n`` for Qwen2.5) and that turn's
    content, the expected answer."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = tokenizer.apply_chat_template(list(messages[:last]), tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"], messages[last]["content"]
