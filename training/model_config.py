"""What can be checked about the model without torch or transformers: the keys of a
``model.config`` table, the model's ``config.json``, and ``seq_len`` against its positions.

Standard library only, so ``python -m training --check``, the preflight and the charts refuse a
bad model section in a fraction of a second, with the same code the job runs.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Mapping

from training.config_checks import JobConfigError

# Keyword arguments transformers' Qwen2Config (5.x) accepts: its own and PretrainedConfig's
# (a test compares this with inspect.signature(Qwen2Config.__init__)). Qwen2Config keeps ANY
# other key as an attribute and builds the model from its defaults, so a typo
# (num_hidden_layer) would silently give a 32-layer model.
QWEN2_CONFIG_KEYS: frozenset[str] = frozenset({
    "architectures", "attention_dropout", "bos_token_id", "chunk_size_feed_forward", "dtype", "eos_token_id",
    "hidden_act", "hidden_size", "id2label", "initializer_range", "intermediate_size", "is_encoder_decoder",
    "label2id", "layer_types", "max_position_embeddings", "max_window_layers", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "output_hidden_states", "pad_token_id", "problem_type",
    "return_dict", "rms_norm_eps", "rope_parameters", "sliding_window", "tie_word_embeddings",
    "transformers_version", "use_cache", "use_sliding_window", "vocab_size",
})
QWEN2_LEGACY_KEYS: frozenset[str] = frozenset({"rope_theta", "rope_scaling", "torch_dtype", "output_attentions"})
"""Older spellings Qwen2Config still converts (rope_theta -> rope_parameters, torch_dtype -> dtype)."""
_POSITIVE_INT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "vocab_size", "max_position_embeddings")


class ModelConfigError(JobConfigError):
    """A user error about the model (one line): bad path, seq_len beyond max positions, bad keys.
    A JobConfigError, so every entry point that refuses a job config refuses these alike."""


CE_CHUNK_TOKENS = 512
"""Target tokens per cross-entropy chunk (training/model.py): one chunk's float32 logits and
their gradient exist at a time, 512 x 151,936 x 4 B = 0.3 GB each for Qwen2.5, instead of
float32 logits for every position of the batch. The memory plan counts the same chunk."""


def check_config_keys(config: Mapping[str, Any], source: str, where: str = "model.config") -> None:
    """Refuse a key Qwen2Config does not know (closest valid name suggested) and shapes that
    cannot build a model (non-positive sizes, heads that do not divide the hidden size)."""
    known = QWEN2_CONFIG_KEYS | QWEN2_LEGACY_KEYS
    for key in config:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(QWEN2_CONFIG_KEYS))}"
            raise ModelConfigError(f"{source}: {where}.{key}: {key!r} is not a Qwen2Config key ({hint})")
    for key in _POSITIVE_INT_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelConfigError(f"{source}: {where}.{key}: {value!r} must be a positive integer")
    hidden, heads, kv = config.get("hidden_size"), config.get("num_attention_heads"), config.get("num_key_value_heads")
    if hidden and heads and hidden % heads:
        raise ModelConfigError(f"{source}: {where}.num_attention_heads: {heads!r} must divide hidden_size ({hidden})")
    if heads and kv and heads % kv:
        raise ModelConfigError(f"{source}: {where}.num_key_value_heads: {kv!r} must divide num_attention_heads ({heads})")


def read_model_config(path: str, source: str = "job config") -> dict[str, Any] | None:
    """The model's config.json as a dict when it can be read without downloading weights.

    Local directories and ``s3://`` prefixes (one small object) are read; a hub id returns None
    (the worker re-validates once the model is loaded).
    """
    where = path.rstrip("/") + "/config.json"
    try:
        if path.startswith("s3://"):
            from training.data.remote import read_bytes

            text = read_bytes(where).decode("utf-8")
        else:
            local = Path(path) / "config.json"
            if not local.is_file():
                if Path(path).exists():
                    raise ModelConfigError(f"{source}: model.path: {path!r} holds no config.json "
                                           "(not a Hugging Face model directory)")
                return None
            text = local.read_text(encoding="utf-8")
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelConfigError(f"{source}: model.path: {where} is not valid JSON "
                               f"(line {err.lineno} column {err.colno}: {err.msg}; truncated?)") from None
    except UnicodeDecodeError as err:
        raise ModelConfigError(f"{source}: model.path: {where} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ModelConfigError(f"{source}: model.path: cannot read {where}: {err}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{source}: model.path: {where} holds a JSON {type(config).__name__}, not an object")
    limit = config.get("max_position_embeddings")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ModelConfigError(f"{source}: model.path: {where}: max_position_embeddings {limit!r} "
                               "is not a positive integer")
    return config


def max_positions(model_config: Mapping[str, Any]) -> int | None:
    """``max_position_embeddings`` from a model's config; never assumed."""
    value = model_config.get("max_position_embeddings")
    return int(value) if value else None


def check_seq_len(seq_len: int, model_config: Mapping[str, Any], source: str = "job config") -> None:
    """Refuse a sequence length beyond the model's own ``max_position_embeddings``."""
    limit = max_positions(model_config)
    if limit is not None and seq_len > limit:
        raise ModelConfigError(
            f"{source}: train.seq_len: {seq_len} exceeds the model's max_position_embeddings ({limit})")


PLACEHOLDER = "{bucket}"


def check_model(job: Any, *, read_s3: bool = True, local_tokenizer: bool = True) -> str:
    """The job's model section against what can be read from here (the tokenizer directory, the
    model's config.json and ``seq_len`` within its positions); returns a one-line note of what
    was read. ``read_s3=False``: an ``s3://`` model is not read (the charts never go online);
    ``local_tokenizer=False``: a local tokenizer directory may be built later (``make install``)
    than the manifests are synthesized."""
    tokenizer = job.model.tokenizer
    if local_tokenizer and tokenizer and "://" not in tokenizer and not Path(tokenizer).is_dir():
        raise ModelConfigError(f"{job.source}: model.tokenizer: {tokenizer!r} is not a directory "
                               "(give a tokenizer directory, an s3:// prefix, or leave it empty)")
    path = job.model.path
    if not path:
        return "model from model.config"
    if PLACEHOLDER in path:
        return f"{path} not read: {PLACEHOLDER} is filled in from environment.toml"
    if path.startswith("s3://") and not read_s3:
        return f"{path} not read (s3)"
    try:
        model_config = read_model_config(path, job.source)
    except ModelConfigError as err:
        if path.startswith("s3://") and "cannot read" in str(err):
            return f"{path} not read: S3 not reachable from here ({str(err).rsplit(': ', 1)[-1][:120]})"
        raise
    if model_config is None:
        return f"{path}: a hub id (checked by the workers once downloaded)"
    check_seq_len(job.train.seq_len, model_config, source=job.source)
    return f"{path}/config.json read (max_position_embeddings {max_positions(model_config)})"
