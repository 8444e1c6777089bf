"""Model FLOPs of a decoder-only transformer from its real shapes, and MFU.

Standard library only: the job (in the DLC), the preflight and the report all use it.

Convention (the PaLM paper's appendix B, also torchtitan's ``get_num_flop_per_token``):

* one multiply-add = 2 FLOPs; a ``(m, k) @ (k, n)`` matmul costs ``2*m*k*n``;
* per token and layer the forward pass does the matmuls of q, k, v, o (GQA: k and v project to
  ``num_kv_heads * head_dim``) and of the gated MLP (gate, up, down: ``3 * hidden * intermediate``),
  plus attention itself: scores ``Q K^T`` and ``softmax(.) V``, each ``2 * seq_len * heads * head_dim``
  FLOPs per token. The full ``seq_len`` is counted (no halving for the causal mask), as PaLM does;
* the output layer (``hidden x vocab``) is a matmul on every token; it is counted even when the
  embeddings are tied (the embedding LOOKUP costs nothing);
* norms, rotary embeddings, biases, softmax and the loss are ignored (< 1 %);
* training = 3 x forward (backward = 2 x forward: gradients w.r.t. activations and weights).
  Activation checkpointing recomputes the forward but is NOT counted: MFU measures useful work.

API::

    shapes = ModelShapes(hidden_size=1536, intermediate_size=8960, num_layers=28,
                         num_heads=12, num_kv_heads=2, vocab_size=151936)
    shapes = ModelShapes.from_hf_config(model.config)        # or a config.json dict
    f_tok = training_flops_per_token(shapes, seq_len=4096)   # FLOPs per trained token
    f_step = training_flops_per_step(shapes, seq_len=4096, tokens_per_step=8 * 4096)
    m = mfu(tokens_per_s_per_device, f_tok, peak_tflops)     # 0..1; None when the peak is None

The peak rate of a device is not known here: the job receives it from its manifest
(``training.contract.ENV_PEAK_TFLOPS``), which takes it from the environment package's GPU table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


HF_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""The ``config.json`` keys :meth:`ModelShapes.from_hf_config` cannot do without (the others have
a default: ``num_key_value_heads`` = the heads, ``head_dim`` = hidden / heads, no tie, no bias)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShapes:
    """The shapes that determine a decoder-only transformer's compute and memory."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equal to ``num_heads`` for plain MHA."""
    vocab_size: int
    head_dim: int = 0
    """0 = ``hidden_size // num_heads``."""
    tie_word_embeddings: bool = False
    """Tied input/output embeddings: one matrix in memory, still one output matmul per token."""
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelShapes.{name}: {getattr(self, name)!r} must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelShapes.num_kv_heads: {self.num_kv_heads} must divide num_heads ({self.num_heads})")

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @classmethod
    def from_hf_config(cls, config: Any) -> "ModelShapes":
        """From a transformers ``PretrainedConfig`` or a ``config.json`` dict (Qwen2/Llama names)."""
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        heads = int(get("num_attention_heads"))
        return cls(
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_layers=int(get("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads", None) or heads),
            vocab_size=int(get("vocab_size")),
            head_dim=int(get("head_dim", None) or 0),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=bool(get("attention_bias", False)) or get("model_type", "") == "qwen2",
        )

    # -- parameter counts ------------------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's matmuls (q, k, v, o, gate, up, down)."""
        h, d = self.hidden_size, self.attention_head_dim
        q_out, kv_out = self.num_heads * d, self.num_kv_heads * d
        attention = h * q_out + 2 * h * kv_out + q_out * h
        mlp = 3 * h * self.intermediate_size
        return attention + mlp

    def num_params(self) -> int:
        """All parameters (embeddings once when tied, q/k/v biases, RMSNorm weights)."""
        h, d = self.hidden_size, self.attention_head_dim
        per_layer = self.layer_matmul_params() + 2 * h  # two RMSNorms
        if self.qkv_bias:
            per_layer += (self.num_heads + 2 * self.num_kv_heads) * d
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h  # + final norm


def forward_flops_per_token(shapes: ModelShapes, seq_len: int) -> int:
    """Forward FLOPs for one token at context ``seq_len`` (see the module docstring)."""
    if seq_len <= 0:
        raise ValueError(f"seq_len: {seq_len!r} must be > 0")
    matmuls = 2 * (shapes.num_layers * shapes.layer_matmul_params() + shapes.hidden_size * shapes.vocab_size)
    attention = shapes.num_layers * 2 * (2 * seq_len * shapes.num_heads * shapes.attention_head_dim)
    return matmuls + attention


def training_flops_per_token(shapes: ModelShapes, seq_len: int) -> int:
    """Forward + backward FLOPs per trained token (3 x forward)."""
    return 3 * forward_flops_per_token(shapes, seq_len)


def objective_factor(objective: str) -> float:
    """Model FLOPs of a trained token under ``train.objective``, as a multiple of next-token
    training's (3 x forward): DPO runs the reference's forward too (no backward), 4 forwards'
    worth, so 4/3. Per token, not per example: a preference pair is two sequences (prompt +
    chosen, prompt + rejected), so an example costs about twice an SFT example's tokens on top."""
    return 4 / 3 if objective == "dpo" else 1.0


def lora_training_flops_per_token(shapes: ModelShapes, seq_len: int, adapter_params: int) -> int:
    """FLOPs per trained token that a LoRA step EXECUTES, the base frozen. The forward is the
    full model's (matmuls 2N + attention A); the backward computes every matmul's input gradient
    (2N) and attention's (2A: its gradients of q, k and v), but no weight gradient of the
    frozen base (the 2N a full fine-tune adds); the adapters (``adapter_params``) run forward
    (2 per parameter) and both backward products (4). So ~4N + 3A + 6 x adapters, not the
    6N + 3A of :func:`training_flops_per_token`: counting 6N would report an MFU half again too
    high for the work the GPU does."""
    matmuls = 2 * (shapes.num_layers * shapes.layer_matmul_params() + shapes.hidden_size * shapes.vocab_size)
    attention = forward_flops_per_token(shapes, seq_len) - matmuls
    return 2 * matmuls + 3 * attention + 6 * adapter_params


def training_flops_per_step(shapes: ModelShapes, seq_len: int, tokens_per_step: int) -> int:
    """FLOPs of one optimizer step over all devices (``tokens_per_step`` = global batch x seq_len)."""
    return training_flops_per_token(shapes, seq_len) * tokens_per_step


def achieved_tflops(tokens_per_s_per_device: float, flops_per_token: float) -> float:
    """Achieved model TFLOP/s of one device."""
    return tokens_per_s_per_device * flops_per_token / 1e12


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1) of one device; None when the peak is unknown (CPU)."""
    if not peak_tflops:
        return None
    return achieved_tflops(tokens_per_s_per_device, flops_per_token) / peak_tflops


def tokens_per_s_at_mfu(mfu_fraction: float, flops_per_token: float, peak_tflops: float) -> float:
    """Tokens/s of ONE device at a stated MFU (for the preflight's time and cost estimate)."""
    return mfu_fraction * peak_tflops * 1e12 / flops_per_token
