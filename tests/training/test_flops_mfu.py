"""FLOPs per token from the real shapes, checked against a hand computation for Qwen2.5-1.5B."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from environment.instances import INSTANCE_TYPES
from training import flops
from training.flops import ModelShapes

QWEN_CONFIG_JSON = {  # the fields of Qwen2.5-1.5B's config.json that matter (the published config.json)
    "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
    "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
}
QWEN2_5_1_5B = ModelShapes(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                           num_kv_heads=2, vocab_size=151936, tie_word_embeddings=True, qkv_bias=True)
"""The same shapes, written out by hand: ``from_hf_config`` must give exactly these."""


def test_parameter_count_matches_the_published_model():
    # 1,543,714,304 is the parameter count of Qwen2.5-1.5B (1.54 B; 1.31 B without embeddings).
    assert QWEN2_5_1_5B.num_params() == 1_543_714_304
    assert QWEN2_5_1_5B.num_layers * QWEN2_5_1_5B.layer_matmul_params() == 1_310_195_712


def test_training_flops_per_token_by_hand_at_seq_4096():
    # Per layer: q 1536*1536 + k,v 2*1536*256 + o 1536*1536 + MLP 3*1536*8960 = 46,792,704 weights.
    per_layer = 1536 * 1536 * 2 + 2 * 1536 * 256 + 3 * 1536 * 8960
    assert per_layer == 46_792_704
    matmul_fwd = 2 * (28 * per_layer + 1536 * 151936)      # output layer counted although tied
    attention_fwd = 28 * 2 * 2 * 4096 * 12 * 128           # QK^T and AV, full seq (PaLM)
    assert flops.forward_flops_per_token(QWEN2_5_1_5B, 4096) == matmul_fwd + attention_fwd
    assert flops.training_flops_per_token(QWEN2_5_1_5B, 4096) == 3 * (matmul_fwd + attention_fwd)
    # ~ 11.4 GFLOP per token: 6N (9.26 G) plus attention (2.1 G) at 4096.
    assert flops.training_flops_per_token(QWEN2_5_1_5B, 4096) == pytest.approx(11.375e9, rel=1e-3)
    step = flops.training_flops_per_step(QWEN2_5_1_5B, 4096, tokens_per_step=8 * 4096)
    assert step == 8 * 4096 * flops.training_flops_per_token(QWEN2_5_1_5B, 4096)


def test_attention_grows_with_sequence_length():
    short = flops.training_flops_per_token(QWEN2_5_1_5B, 128)
    long = flops.training_flops_per_token(QWEN2_5_1_5B, 32768)
    assert long - short == 3 * 28 * 4 * (32768 - 128) * 1536


def test_shapes_from_a_config_json_dict_and_a_config_object():
    assert ModelShapes.from_hf_config(QWEN_CONFIG_JSON) == QWEN2_5_1_5B
    # A transformers PretrainedConfig is read by attribute (importing transformers here costs ~5-15 s).
    assert ModelShapes.from_hf_config(SimpleNamespace(**QWEN_CONFIG_JSON)) == QWEN2_5_1_5B
    mha = ModelShapes.from_hf_config(SimpleNamespace(**{**QWEN_CONFIG_JSON, "num_key_value_heads": None}))
    assert mha.num_kv_heads == 12


def test_peak_table_by_device_name():
    from environment.instances import peak_bf16_tflops

    assert peak_bf16_tflops("NVIDIA L4") == 121.0
    assert peak_bf16_tflops("NVIDIA A10G") == 70.0
    assert peak_bf16_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_bf16_tflops("NVIDIA H200") == 989.0
    assert peak_bf16_tflops("NVIDIA L40S") == 362.0   # not mistaken for an L4
    assert peak_bf16_tflops("cpu") is None


def test_the_job_takes_its_peak_from_the_manifest_never_from_a_device_name():
    from training.contract import ENV_PEAK_TFLOPS
    from training.metrics import peak_tflops_from_env

    assert peak_tflops_from_env({ENV_PEAK_TFLOPS: "121"}) == 121.0
    assert peak_tflops_from_env({}) is None and peak_tflops_from_env({ENV_PEAK_TFLOPS: "n/a"}) is None


def test_mfu_round_trip():
    f_tok = flops.training_flops_per_token(QWEN2_5_1_5B, 4096)
    tps = flops.tokens_per_s_at_mfu(0.4, f_tok, 121.0)
    assert flops.mfu(tps, f_tok, 121.0) == pytest.approx(0.4)
    assert flops.mfu(tps, f_tok, None) is None
    assert flops.achieved_tflops(tps, f_tok) == pytest.approx(48.4)


def test_a_lora_step_counts_the_flops_it_executes_by_hand_at_seq_4096():
    """LoRA freezes the base: its backward computes each matmul's input gradient but no weight
    gradient, so the matmuls count 2 x forward (4N), attention 3 x forward (its backward has no
    weights to skip) and the adapters 6 per parameter: the matmuls two thirds of the full 6N."""
    shapes = QWEN2_5_1_5B
    seq, adapters = 4096, 18_464_768
    matmuls = 2 * (shapes.num_layers * shapes.layer_matmul_params() + shapes.hidden_size * shapes.vocab_size)
    attention = shapes.num_layers * 2 * (2 * seq * shapes.num_heads * shapes.attention_head_dim)
    assert flops.lora_training_flops_per_token(shapes, seq, adapters) == 2 * matmuls + 3 * attention + 6 * adapters
    ratio = flops.lora_training_flops_per_token(shapes, seq, adapters) / flops.training_flops_per_token(shapes, seq)
    assert 0.73 < ratio < 0.75  # (4 x 9.26 / 6 + 2.1) / (9.26 + 2.1) G: attention is a fifth of it at 4096
