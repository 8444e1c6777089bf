"""What can be checked about the model without torch or transformers: the keys of a
``model.config`` table, the model's ``config.json``, and ``seq_len`` against its positions.

Standard library only, so ``python -m training --check``, the preflight and the charts refuse a
bad model section in a fraction of a second, with the same code the job runs.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from spec_schema import FieldError, unknown
from training.config_checks import JobConfigError
from training.contract import BUCKET_PLACEHOLDER
from training.storage import S3_SCHEME

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
QWEN2_TYPES: dict[str, tuple[type, ...]] = {
    "vocab_size": (int,), "hidden_size": (int,), "intermediate_size": (int,), "num_hidden_layers": (int,),
    "num_attention_heads": (int,), "num_key_value_heads": (int,), "hidden_act": (str,),
    "max_position_embeddings": (int,), "initializer_range": (float,), "rms_norm_eps": (float,),
    "use_cache": (bool,), "tie_word_embeddings": (bool,), "use_sliding_window": (bool,), "sliding_window": (int,),
    "max_window_layers": (int,), "attention_dropout": (float, int), "rope_parameters": (dict,),
}
"""The scalar fields of transformers 5.13's Qwen2Config, a ``@strict`` dataclass
(models/qwen2/configuration_qwen2.py; huggingface_hub's dataclasses.py ``_validate_simple_type``:
``isinstance`` exactly, a bool is no int and an int is no float): another type fails the model's
construction in the workers, so it is refused here (a test compares the table with the class)."""
QWEN2_ACTIVATIONS: frozenset[str] = frozenset({
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh",
    "gelu_accurate", "hardswish", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6",
    "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "prelu", "xielu",
})
"""``hidden_act`` values: the keys of transformers 5.13's ``ACT2CLS`` (activations.py); another
name is a KeyError when the workers build the MLP (a test compares the set with the table)."""
QWEN2_DEFAULTS = {"hidden_size": 4096, "num_attention_heads": 32}
"""Qwen2Config's defaults for the keys a shape check needs when the table leaves them out."""


class ModelConfigError(JobConfigError):
    """A user error about the model (one line): bad path, seq_len beyond max positions, bad keys.
    A JobConfigError, so every entry point that refuses a job config refuses these alike."""


CE_CHUNK_TOKENS = 512
"""Target tokens per cross-entropy chunk (training/model.py): one chunk's float32 logits and
their gradient exist at a time, 512 x 151,936 x 4 B = 0.3 GB each for Qwen2.5, instead of
float32 logits for every position of the batch. The memory plan counts the same chunk."""


def check_config_keys(config: Mapping[str, Any]) -> None:
    """Refuse a key Qwen2Config does not know (closest valid name suggested) and shapes that
    cannot build a model (non-positive sizes, heads that do not divide the hidden size), as a
    :class:`FieldError` of the ``[model]`` section (``config.<key>``)."""
    known = QWEN2_CONFIG_KEYS | QWEN2_LEGACY_KEYS
    for key in config:
        if key not in known:
            raise FieldError(f"config.{key}", key, unknown(key, known, "Qwen2Config key").allowed)
    for key in _POSITIVE_INT_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31):
            raise FieldError(f"config.{key}", value, "must be a positive integer (below 2**31)")
    for key, types in QWEN2_TYPES.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
            names = " or ".join({int: "an integer", float: "a number with a decimal point (e.g. 1.0)", bool: "true or false",
                                 str: "a string", dict: "a table"}[t] for t in types)
            raise FieldError(f"config.{key}", value, f"is not allowed (Qwen2Config takes {names})")
    if "hidden_act" in config and config["hidden_act"] not in QWEN2_ACTIVATIONS:
        raise FieldError("config.hidden_act", config["hidden_act"],
                         f"is not an activation transformers knows (known: {', '.join(sorted(QWEN2_ACTIVATIONS))})")
    # The model is built from the table over Qwen2Config's defaults: judge the shape it will have.
    hidden = config.get("hidden_size", QWEN2_DEFAULTS["hidden_size"])
    heads = config.get("num_attention_heads", QWEN2_DEFAULTS["num_attention_heads"])
    kv = config.get("num_key_value_heads", heads)
    if hidden % heads:
        raise FieldError("config.num_attention_heads", heads, f"must divide hidden_size ({hidden})")
    if heads % kv:
        raise FieldError("config.num_key_value_heads", kv, f"must divide num_attention_heads ({heads})")
    if (hidden // heads) % 2:
        # Rotary embeddings rotate pairs of channels (modeling_qwen2.py: inv_freq over
        # arange(0, head_dim, 2)); an odd head size fails the first forward pass.
        raise FieldError("config.num_attention_heads", heads,
                         f"gives an odd head size ({hidden} / {heads} = {hidden // heads}); rotary embeddings need an even one")


def read_model_config(path: str, source: str = "job config") -> dict[str, Any] | None:
    """The model's config.json as a dict when it can be read without downloading weights.

    Local directories and ``s3://`` prefixes (one small object) are read; a hub id returns None
    (the worker re-validates once the model is loaded).
    """
    where = path.rstrip("/") + "/config.json"
    try:
        if path.startswith(S3_SCHEME):
            from training.storage.files import read_bytes

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
    except FileNotFoundError:  # S3 answered: there is no such object (unreachable S3 is another OSError)
        raise ModelConfigError(f"{source}: model.path: {path!r} holds no config.json "
                               "(not a Hugging Face model folder, or not uploaded yet)") from None
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


def seq_len_problem(seq_len: int, limit: int | None) -> str | None:
    """The rule "seq_len <= the model's max positions", in its one text: why ``seq_len`` is
    refused by a model of ``limit`` positions (None: unknown, nothing to check), or None."""
    if limit is not None and seq_len > limit:
        return f"exceeds the model's max_position_embeddings ({limit})"
    return None


def check_seq_len(seq_len: int, model_config: Mapping[str, Any], source: str = "job config") -> None:
    """Refuse a sequence length beyond the model's own ``max_position_embeddings`` (the worker's
    check, once the model's config is loaded; the job config applies the same rule first)."""
    if problem := seq_len_problem(seq_len, max_positions(model_config)):
        raise ModelConfigError(f"{source}: train.seq_len: {seq_len} {problem}")


_HUB_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)


def hub_id_problem(name: str) -> str:
    """Why ``name`` cannot be a Hugging Face hub repo id ("" if it can): huggingface_hub 1.33's
    ``validate_repo_id`` (utils/_validators.py), the check ``from_pretrained`` applies before it
    asks the hub. A path that does not exist (``/x``, ``./x``, ``a/b/c``) is no repo id either."""
    if name.count("/") > 1:
        return "a hub id is repo_name or namespace/repo_name"
    if not _HUB_ID.fullmatch(name):
        return "a hub id holds only letters, digits, '-', '_' and '.', not at the start or end of a part, at most 96"
    if "--" in name or ".." in name:
        return "a hub id holds no '--' or '..'"
    if name.endswith(".git"):
        return "a hub id does not end in '.git'"
    return ""


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
    if BUCKET_PLACEHOLDER in path:
        return f"{path} not read: {BUCKET_PLACEHOLDER} is filled in from environment.toml"
    if path.startswith(S3_SCHEME) and not read_s3:
        return f"{path} not read (s3)"
    try:
        model_config = read_model_config(path, job.source)
    except ModelConfigError as err:
        if path.startswith(S3_SCHEME) and "cannot read" in str(err):
            return f"{path} not read: S3 not reachable from here ({str(err).rsplit(': ', 1)[-1][:120]})"
        raise
    if model_config is None:
        if problem := hub_id_problem(path):
            raise ModelConfigError(f"{job.source}: model.path: {path!r} does not exist here and is not a Hugging Face "
                                   f"hub id ({problem}): give a model directory, an s3:// prefix or a hub id (org/name)")
        return f"{path}: a hub id (checked by the workers once downloaded)"
    check_seq_len(job.train.seq_len, model_config, source=job.source)
    if "://" not in path and (missing := missing_model_files(Path(path), tokenizer_here=not tokenizer)):
        raise ModelConfigError(f"{job.source}: model.path: {path!r} holds config.json but no {' and no '.join(missing)}: "
                               "give the folder save_pretrained wrote (weights, config, tokenizer), or set "
                               "model.tokenizer to a tokenizer directory")
    return f"{path}/config.json read (max_position_embeddings {max_positions(model_config)})"


WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")
"""What ``from_pretrained`` loads weights from (transformers 5.13 ``modeling_utils.py``: the
safetensors file or its index, else the PyTorch pickles)."""
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))
"""What ``AutoTokenizer.from_pretrained`` builds a tokenizer from: the fast tokenizer's file, a
BPE's vocabulary and merges, or a SentencePiece model."""


def missing_model_files(folder: Path, *, tokenizer_here: bool) -> list[str]:
    """What a local model folder lacks for the job to load it (weights; the tokenizer when the job
    takes it from the model folder): the run would fail only after its workers started."""
    missing = []
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        missing.append(f"weights ({', '.join(WEIGHT_PATTERNS)})")
    if tokenizer_here and not any(all((folder / name).is_file() for name in files) for files in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model)")
    return missing
