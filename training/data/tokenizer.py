"""The job's tokenizer: loading it from a local directory or an ``s3://`` prefix, its chat format,
and what it makes of documents (token ids and the per-token "trained" mask, the last section).

``load_tokenizer(path)`` returns a transformers tokenizer. For ``s3://`` the prefix is fetched
once per node into a node-local cache (see :func:`training.storage.files.fetch_prefix`: the first
local process downloads under a file lock, the others wait and reuse it). The local demo uses
the real Qwen2.5 tokenizer built offline by ``python -m devtools.tokenizer_build`` into
``training/assets/qwen2.5-tokenizer``; in production the tokenizer comes with the model.

:func:`document_separator_id` is the id packed between documents: ``<|endoftext|>`` for Qwen
(its pre-training document separator; the chat model's eos is ``<|im_end|>``, which already
closes every chat turn), else the tokenizer's eos.

Conversations are read in the model's OWN format, from its own files: the chat template from the
tokenizer (``chat_template.jinja`` or ``tokenizer_config.json``: :func:`chat_template_text` reads
it without transformers, as the driver's check must), the end-of-turn token from what that
template writes after an assistant's answer (:func:`chat_format`), and the stop tokens from the
model's generation config (``generation_config.json`` ``eos_token_id``, an id or a list), the
tokenizer's eos and that end-of-turn token. No model family's marker is written in this code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.data.records import DataError, Document
from training.storage.files import fetch_prefix, is_s3

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "assets" / "qwen2.5-tokenizer"
DOCUMENT_SEPARATOR = "<|endoftext|>"


class TokenizerError(ValueError):
    """The tokenizer path is missing or does not hold a tokenizer; one line."""


def tokenizer_location(model_cfg) -> str:
    """Where a job's tokenizer lives: ``model.tokenizer``, else the model's own, else the
    offline-built Qwen2.5 tokenizer (random-init models have no directory of their own)."""
    return model_cfg.tokenizer or model_cfg.path or str(DEFAULT_TOKENIZER_DIR)


def load_tokenizer(path_or_s3: str | Path, *, cache_dir: str | Path | None = None):
    """A ``transformers`` tokenizer from a directory or an ``s3://`` prefix (fetched once per node)."""
    from transformers import AutoTokenizer

    path = str(path_or_s3)
    try:
        local = fetch_prefix(path, cache_dir=cache_dir) if is_s3(path) else Path(path)
    except FileNotFoundError as err:
        raise TokenizerError(f"tokenizer: {err}") from None
    if not (local / "tokenizer.json").is_file() and not (local / "tokenizer_config.json").is_file():
        hint = " (build it: python -m devtools.tokenizer_build)" if Path(path) == DEFAULT_TOKENIZER_DIR else ""
        raise TokenizerError(f"tokenizer: {path}: no tokenizer.json or tokenizer_config.json there{hint}")
    return AutoTokenizer.from_pretrained(str(local))


def document_separator_id(tokenizer) -> int:
    """The token packed between documents (``<|endoftext|>`` where the vocabulary has it)."""
    token_id = tokenizer.convert_tokens_to_ids(DOCUMENT_SEPARATOR)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
        return token_id
    if tokenizer.eos_token_id is None:
        raise TokenizerError("tokenizer: has neither <|endoftext|> nor an eos token to separate documents")
    return tokenizer.eos_token_id


# The template's own files, in the order transformers 5.13 reads them
# (tokenization_utils_base.py:1795-1811: a chat_template.jinja overrides tokenizer_config.json's
# "chat_template"; additional_chat_templates/*.jinja add named ones).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_PROBE_QUESTION, _PROBE_ANSWER = "Q7f3", "A9k2"
"""A probe conversation, rendered once, shows where the template closes an assistant turn."""


def chat_template_text(directory: str | Path) -> str | None:
    """The chat template a tokenizer directory gives, as ``get_chat_template()`` picks it
    (transformers 5.13 tokenization_utils_base.py:3260-3290: named templates are a dict, of which
    the one named ``default``); ``""`` when it has none; ``None`` when ``directory`` is not a
    local directory (``s3://``, a hub id: the workers check once they have the tokenizer).
    Standard library only."""
    local = Path(str(directory))
    if "://" in str(directory) or not local.is_dir():
        return None
    templates: dict[str, str] = {}
    config_file = local / TOKENIZER_CONFIG_FILE
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            config = {}
        value = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(value, str):
            templates["default"] = value
        elif isinstance(value, list):  # [{"name": ..., "template": ...}] (tokenization_utils_base.py:1090)
            templates = {t.get("name"): t.get("template") or "" for t in value if isinstance(t, dict)}
    files = {"default": local / CHAT_TEMPLATE_FILE} if (local / CHAT_TEMPLATE_FILE).is_file() else {}
    files.update({f.name.removesuffix(".jinja"): f for f in sorted((local / CHAT_TEMPLATE_DIR).glob("*.jinja"))})
    if files:
        templates = {name: f.read_text(encoding="utf-8") for name, f in files.items()}
    return templates.get("default", "")


def chat_template_problem(tokenizer: Any) -> str:
    """Why conversations cannot be rendered with ``tokenizer`` ("" if they can)."""
    try:
        tokenizer.get_chat_template()
    except ValueError:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        return (f"the tokenizer {name} has no chat template ({CHAT_TEMPLATE_FILE} or {TOKENIZER_CONFIG_FILE} "
                "\"chat_template\") to render conversations with: give model.tokenizer a tokenizer that has one")
    return ""


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """How the model's own chat template ends an assistant turn, and what stops generation."""
    end_of_turn: str
    """The end-of-turn token's text (``<|im_end|>`` for Qwen2.5, ``<|eot_id|>`` for Llama 3):
    trained as the answer's last target, so the model learns to stop."""
    end_of_turn_id: int
    stop_ids: frozenset[int]
    """Generation stops at any of these: the generation config's ``eos_token_id`` (what
    ``generate()`` stops on), the tokenizer's eos, and the end-of-turn token."""


def generation_eos_ids(generation_config: Any) -> set[int]:
    """``eos_token_id`` of a GenerationConfig: an int, a list of ints or None (transformers 5.13
    generation/utils.py:2044-2057 makes a 1-D tensor of it; EosTokenCriteria stops at any)."""
    value = getattr(generation_config, "eos_token_id", None)
    if value is None:
        return set()
    return {int(value)} if isinstance(value, int) else {int(v) for v in value}


def chat_format(tokenizer: Any, generation_config: Any = None) -> ChatFormat:
    """Read the end-of-turn token off the template: render a probe conversation with and without
    its answer; the first token after the answer that is a stop token (the generation config's or
    the tokenizer's eos), else the first special token there, is the end of the turn. A template
    that writes neither after an answer cannot teach the model to stop: refused (one line)."""
    if problem := chat_template_problem(tokenizer):
        raise DataError(problem)
    question = [{"role": "user", "content": _PROBE_QUESTION}]
    before = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    after = tokenizer.apply_chat_template(question + [{"role": "assistant", "content": _PROBE_ANSWER}], tokenize=False)
    at = after.find(_PROBE_ANSWER, len(before))
    tail = after[at + len(_PROBE_ANSWER):] if at >= 0 else ""
    stops = generation_eos_ids(generation_config) | ({tokenizer.eos_token_id} - {None})
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    end = next((i for i in ids if i in stops), None)
    end = next((i for i in ids if i in special), None) if end is None else end
    if end is None:
        raise DataError(f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'} closes an "
                        f"assistant turn with {tail!r}: no stop or special token, so the model could not learn to stop")
    return ChatFormat(end_of_turn=tokenizer.decode([end]), end_of_turn_id=int(end),
                      stop_ids=frozenset(stops | {int(end)}))


# --- Documents -> token ids and the trained mask ----------------------------------------------
# Documents -> token ids and a per-token "trained" mask.
#
# Text documents are trained on every token. Chat documents are rendered with the tokenizer's
# own chat template and trained ONLY on assistant tokens: the assistant's content and the
# end-of-turn token that closes its turn (so the model learns to stop: ``<|im_end|>`` for Qwen2.5,
# ``<|eot_id|>`` for Llama 3, read off the template by :func:`training.data.tokenizer.chat_format`),
# not the system/user turns, not the assistant header the generation prompt writes and not what
# the template writes after the end-of-turn token (Qwen's newline).
#
# The assistant spans are found on the rendered TEXT, by rendering growing prefixes of the
# conversation: ``render(messages[:i], add_generation_prompt=True)`` ends where assistant
# message ``i`` begins and ``render(messages[:i+1])`` ends just after it (the prefix diff
# transformers 5.13's own ``encode_message_with_chat_template`` does, tokenization_utils_base.py
# :3178-3236, on text). Its ``return_assistant_tokens_mask`` (:3146-3162) needs a template with
# ``{% generation %}`` blocks, which neither Qwen2.5's nor Llama 3's has (chat_template_utils.py
# :508 warns and marks nothing), so it is not used. The full text is then tokenized once (so ids
# equal what ``apply_chat_template(..., tokenize=True)`` gives) and a token is trained when its
# first character lies inside an assistant span.


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
