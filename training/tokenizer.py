"""Load the job's tokenizer from a local directory or an ``s3://`` prefix.

``load_tokenizer(path)`` returns a transformers tokenizer. For ``s3://`` the prefix is fetched
once per node into a node-local cache (see :func:`training.data.remote.fetch_prefix`: the first
local process downloads under a file lock, the others wait and reuse it). The local demo uses
the real Qwen2.5 tokenizer built offline by ``python -m devtools.tokenizer_build`` into
``training/assets/qwen2.5-tokenizer``; in production the tokenizer comes with the model.

:func:`document_separator_id` is the id packed between documents: ``<|endoftext|>`` for Qwen
(its pre-training document separator; the chat model's eos is ``<|im_end|>``, which already
closes every chat turn), else the tokenizer's eos.
"""
from __future__ import annotations

from pathlib import Path

from training.data.remote import fetch_prefix, is_s3

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "qwen2.5-tokenizer"
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
