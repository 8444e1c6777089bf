"""lora: low-rank adapters on the model's linear projections (Hu et al. 2021), the job's own
(the DLC ships no ``peft``; tests/training/test_lora_peft.py holds this to peft 0.18.0).

Each target ``nn.Linear`` (by the last part of its name: ``q_proj``, ``down_proj``...) becomes a
:class:`LoraLinear`: ``y = base(x) + lora_B(lora_A(dropout(x))) * alpha / rank``, ``lora_A``
Kaiming-uniform and ``lora_B`` zero so training starts from the base model exactly. Every other
parameter is frozen and cast to ``base_dtype`` (bf16 halves the frozen weights; buffers such as the
rotary ``inv_freq`` keep their dtype); the adapters
stay float32, so AdamW's state for them is float32 too.

FSDP2 (torch 2.13 ``_fsdp_param_group.py`` ``_init_mp_dtypes``) needs one dtype among a unit's
TRAINABLE parameters only (frozen ones are not checked): the adapters are all float32. Mixed
dtypes in one unit's all-gather are gathered as bytes (``_fsdp_collectives.py``
``_get_all_gather_input_metadatas``: uint8); on GPU the mixed-precision policy casts everything
to bf16 first. Checkpoints hold the trainable parameters only (training/checkpointing/state.py).

Options (``[[model.transforms]] name = "lora"``): ``rank`` (8), ``alpha`` (16), ``dropout`` (0.0),
``targets`` (the attention and MLP projections), ``base_dtype`` ("bfloat16" | "float32").
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

from spec_schema import FieldError

DEFAULTS: dict[str, Any] = {
    "rank": 8, "alpha": 16, "dropout": 0.0,
    "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "base_dtype": "bfloat16",
}
BASE_DTYPES = ("bfloat16", "float32")
ADAPTER_PARTS = ("lora_A", "lora_B")
BASE_PART = "base_layer"
PEFT_PREFIX = "base_model.model."
"""peft's key prefix in ``adapter_model.safetensors`` (peft v0.18.0 ``utils/save_and_load.py``
``get_peft_model_state_dict`` :331-352: the PeftModel's names with the adapter name removed)."""


def settings(options: dict[str, Any]) -> dict[str, Any]:
    """The options with the defaults filled in."""
    return {**DEFAULTS, **options}


def check(options: dict[str, Any]) -> None:
    """Judge the options before any worker starts (one FieldError for the first bad one)."""
    for key in options:
        if key not in DEFAULTS:
            raise FieldError(key, options[key], f"is not a lora option (allowed: {', '.join(DEFAULTS)})")
    opts = settings(options)
    if isinstance(opts["rank"], bool) or not isinstance(opts["rank"], int) or opts["rank"] < 1:
        raise FieldError("rank", opts["rank"], "must be an integer >= 1")
    if isinstance(opts["alpha"], bool) or not isinstance(opts["alpha"], (int, float)) or opts["alpha"] <= 0:
        raise FieldError("alpha", opts["alpha"], "must be a number > 0")
    if isinstance(opts["dropout"], bool) or not isinstance(opts["dropout"], (int, float)) or not 0 <= opts["dropout"] < 1:
        raise FieldError("dropout", opts["dropout"], "must be a number in [0, 1)")
    targets = opts["targets"]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise FieldError("targets", targets, "must be a non-empty list of linear module names (e.g. q_proj)")
    if opts["base_dtype"] not in BASE_DTYPES:
        raise FieldError("base_dtype", opts["base_dtype"], f"must be one of {', '.join(BASE_DTYPES)}")


def _layer_class():
    import torch

    class LoraLinear(torch.nn.Module):
        """A frozen ``nn.Linear`` plus its low-rank update (peft 0.18.0 ``tuners/lora/layer.py``
        ``Linear.forward`` :793-807: the input cast to the adapter's dtype, dropout on A's input,
        the sum cast back to the base result's dtype)."""

        def __init__(self, base: torch.nn.Linear, rank: int, alpha: float, dropout: float):
            super().__init__()
            self.base_layer = base
            self.lora_dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
            self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False, dtype=torch.float32)
            self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False, dtype=torch.float32)
            # peft layer.py:203 scaling = alpha / r; :256 A kaiming_uniform(a=sqrt(5)); :261 B zeros.
            self.scaling = alpha / rank
            torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            torch.nn.init.zeros_(self.lora_B.weight)

        disabled = False
        """True inside :func:`adapters_disabled`: the layer is its frozen base alone."""

        def forward(self, x):
            result = self.base_layer(x)
            if self.disabled:  # peft layer.py Linear.forward: ``if self.disable_adapters: base_layer(x)``
                return result
            x = x.to(self.lora_A.weight.dtype)
            return (result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling).to(result.dtype)

        def delta_weight(self):
            """``scaling * B @ A`` (peft layer.py:745 ``get_delta_weight``), in float32."""
            return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling

    return LoraLinear


def apply(model: Any, options: dict[str, Any]) -> None:
    """Freeze the model (cast to ``base_dtype``), then wrap every target linear in adapters."""
    import torch

    opts = settings(options)
    LoraLinear = _layer_class()
    base_dtype = getattr(torch, opts["base_dtype"])
    for param in model.parameters():
        param.requires_grad_(False)
    # Parameters only: ``model.to(dtype)`` casts floating BUFFERS too, and the rotary ``inv_freq``
    # in bf16 is off by up to 3.6e-3 relative (2.4 rad of angle at distance 2047 for Qwen2.5)
    # while a server loading the export recomputes it in fp32 (transformers 5.13 Qwen2RotaryEmbedding).
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != base_dtype:  # a base loaded in it stays as it is
            param.data = param.data.to(base_dtype)
    targets = set(opts["targets"])
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    if not found:
        raise ValueError(f"lora: no linear layer named {sorted(targets)} in {type(model).__name__}")
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoraLinear(module, opts["rank"], float(opts["alpha"]), float(opts["dropout"])))
    model._raytrain_lora = {**opts, "target_names": sorted({n.rsplit(".", 1)[-1] for n, _ in found}),
                            "base_hash": base_hash(model)}


def base_hash(model: Any) -> str:
    """sha256 over the frozen base's parameters (names, dtypes, shapes, bytes) as the adapters
    see them: a resume whose base differs from the one the run started with would train the
    adapters against another model (training/loop.py refuses it)."""
    import hashlib

    import torch
    from torch._subclasses.fake_tensor import is_fake

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad:
            continue
        if is_fake(param) or param.is_meta:
            # A model of shapes only (the preflight's memory measurement under fake tensors, a
            # meta-device build) has no bytes to hash: no hash, so no resume check, is the answer.
            return ""
        tensor = param.detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """The model without its adapters: every LoRA layer computes its frozen base alone (peft
    0.18.0 ``tuners/lora/layer.py`` ``Linear.forward``, its ``disable_adapters`` branch). DPO's
    reference for a LoRA run is the same model inside this block: no second copy."""
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    for layer in layers:
        layer.disabled = True
    try:
        yield
    finally:
        for layer in layers:
            layer.disabled = False


def lora_settings(model: Any) -> dict[str, Any] | None:
    """The options LoRA was applied with (and the module names it found), or None: no LoRA."""
    return getattr(model, "_raytrain_lora", None)


def merge_unties(tied: dict[str, str]) -> bool:
    """Whether the merge changes one weight of a tied pair (``tied``: ``{alias: name}`` of the
    model's tied parameters, :func:`training.checkpointing.state.tied_names`; ``lm_head``
    targeted on a model whose output layer IS its embedding): the merged export is then written with
    ``tie_word_embeddings = False``, or ``from_pretrained`` would tie them again (transformers 5.13
    ``modeling_utils.py`` ``get_expanded_tied_weights_keys`` :2638 reads that flag alone)."""
    return any(BASE_PART in name.split(".") for pair in tied.items() for name in pair)


def split_state(full: dict[str, Any], scaling: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """A full state dict of a LoRA model as ``(merged, adapter)``: ``merged`` under the base
    model's own names with ``W + scaling * B @ A`` (float32, cast by the caller), ``adapter``
    under peft's names (``base_model.model.<module>.lora_A.weight``)."""
    merged: dict[str, Any] = {}
    adapter: dict[str, Any] = {}
    for key, value in full.items():
        module, _, leaf = key.rpartition(".")
        owner, _, part = module.rpartition(".")
        if part in ADAPTER_PARTS:
            adapter[f"{PEFT_PREFIX}{owner}.{part}.{leaf}"] = value.float().contiguous()
        elif part == BASE_PART:
            merged[f"{owner}.{leaf}"] = value
        else:
            merged[key] = value
    for key in [k for k in adapter if k.endswith(".lora_A.weight")]:
        owner = key[len(PEFT_PREFIX):-len(".lora_A.weight")]
        delta = (adapter[f"{PEFT_PREFIX}{owner}.lora_B.weight"] @ adapter[key]) * scaling
        merged[f"{owner}.weight"] = (merged[f"{owner}.weight"].float() + delta)
    return merged, adapter


def peft_adapter_config(opts: dict[str, Any], base_model: str) -> dict[str, Any]:
    """``adapter_config.json`` as peft 0.18.0 reads it (``LoraConfig`` fields; ``peft_type``
    selects the class in ``config.py`` ``PeftConfigMixin.from_pretrained``)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": opts["rank"], "lora_alpha": opts["alpha"], "lora_dropout": opts["dropout"],
            "target_modules": opts["target_names"], "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True}


LORA_BASE_HASH = "lora_base_hash"
"""The trainer state's record of the frozen base a LoRA run started with (lora.base_hash)."""


def lora_base_problem(model: Any, trainer: Any) -> str | None:
    """Why a LoRA run may not continue on this base: a resume whose frozen base differs from the
    one its adapters were trained against (the checkpoints hold the adapters only). Records the
    base's hash in the trainer state (saved with every checkpoint) otherwise."""
    current = (lora_settings(model) or {}).get("base_hash")
    if not current:
        return None
    started = trainer.extra.get(LORA_BASE_HASH)
    if trainer.restored_from and started and started != current:
        return (f"resume refused: the frozen base model differs from the one this LoRA run started with (sha256 "
                f"{started[:12]}, now {current[:12]}); resume with the same model.path, or start a new run")
    trainer.extra[LORA_BASE_HASH] = current
    return None
