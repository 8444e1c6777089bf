"""The job config refuses exactly what the real systems refuse, for the rules it ports from them.

Each test runs the upstream code (the pinned wheels in the venv: transformers 5.13.0, torch 2.13.0,
numpy, huggingface_hub 1.33.0; KubeRay v1.7.0's CRD in charts/crds/) over a battery of values
and holds the schema's verdict to the upstream one, value by value.
"""
from __future__ import annotations

import typing

import pytest
import yaml

from spec_schema import FieldError
from training.config_sections import CheckpointConfig, DataConfig, RayJobConfig, TrainConfig
from training.config_checks import INT32_MAX, TORCH_SEED_RANGE
from training.model_config import (QWEN2_ACTIVATIONS, QWEN2_TYPES, check_config_keys, hub_id_problem)
from cases import ROOT

TINY = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 64}


def _ours(config: dict) -> bool:
    try:
        check_config_keys(config)
    except FieldError:
        return False
    return True


def _upstream(config: dict) -> bool:
    """transformers builds the model and runs one forward pass (the workers' first step)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    try:
        model = AutoModelForCausalLM.from_config(Qwen2Config(**config))
        model(torch.zeros(1, 8, dtype=torch.long))
    except Exception:  # noqa: BLE001  (strict validation, KeyError, shape errors: any is a refusal)
        return False
    return True


MODEL_CONFIGS = [
    {}, {"hidden_size": 68}, {"hidden_size": 72, "num_attention_heads": 8}, {"hidden_size": 96, "num_attention_heads": 12},
    {"num_attention_heads": 3}, {"num_key_value_heads": 3}, {"num_key_value_heads": 4},
    {"rms_norm_eps": 1}, {"rms_norm_eps": 1e-5}, {"initializer_range": 1}, {"attention_dropout": 0},
    {"tie_word_embeddings": 1}, {"tie_word_embeddings": True}, {"use_cache": "yes"}, {"hidden_act": "swiglu"},
    {"hidden_act": "gelu"}, {"hidden_act": 1}, {"rope_parameters": 1}, {"max_window_layers": 1.5},
]


@pytest.mark.parametrize("change", MODEL_CONFIGS, ids=[repr(c) for c in MODEL_CONFIGS])
def test_model_config_is_refused_exactly_when_transformers_cannot_run_it(change):
    pytest.importorskip("transformers")
    config = {**TINY, **change}
    assert _ours(config) == _upstream(config), config


def test_the_type_and_activation_tables_are_transformers_own():
    transformers = pytest.importorskip("transformers")
    from transformers.activations import ACT2CLS

    assert QWEN2_ACTIVATIONS == set(ACT2CLS)
    hints = transformers.Qwen2Config.__annotations__  # the strict dataclass's field types
    for key, types in QWEN2_TYPES.items():
        allowed = set(typing.get_args(hints[key])) or {hints[key]}
        assert set(types) == allowed - {type(None)} - {a for a in allowed if a.__module__.startswith("transformers")}, key


IDS = ["gpt2", "Qwen/Qwen2.5-1.5B", "a/b/c", "/abs/path", "./rel", "~/m", "x--y", "a..b", "repo.git", "caf\u00e9",
       "-lead", "trail-", "a" * 96, "a" * 97, "org/" + "b" * 96, "models/qwen"]


@pytest.mark.parametrize("name", IDS)
def test_a_hub_id_is_what_huggingface_hub_validates(name):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
        valid = True
    except HFValidationError:
        valid = False
    assert (hub_id_problem(name) == "") == valid, name


@pytest.mark.parametrize("seed", [TORCH_SEED_RANGE[0] - 1, TORCH_SEED_RANGE[0], -1, 0, TORCH_SEED_RANGE[1],
                                  TORCH_SEED_RANGE[1] + 1])
def test_train_seed_is_what_torch_manual_seed_takes(seed):
    torch = pytest.importorskip("torch")
    try:
        torch.manual_seed(seed)
        takes = True
    except (RuntimeError, ValueError):
        takes = False
    finally:
        torch.manual_seed(0)
    try:
        TrainConfig(seed=seed)
        ours = True
    except FieldError:
        ours = False
    assert ours == takes


@pytest.mark.parametrize("seed", [-(2**70), -1, 0, 1, 2**70])
def test_data_seed_is_what_numpy_seeds_a_shuffle_with(seed):
    np = pytest.importorskip("numpy")
    try:
        np.random.default_rng([seed, 0])  # training/data/stream.py: the epoch's permutation
        takes = True
    except ValueError:
        takes = False
    try:
        DataConfig(seed=seed)
        ours = True
    except FieldError:
        ours = False
    assert ours == takes


def test_rayjob_fields_fit_the_crd_integer_formats():
    docs = list(yaml.load_all((ROOT / "charts" / "crds" / "kuberay-v1.7.0.yaml").read_text(),
                              Loader=yaml.CSafeLoader))  # libyaml: the 2.3 MB file in pure Python takes seconds
    rayjob = next(d for d in docs if d and d.get("kind") == "CustomResourceDefinition"
                  and d["spec"]["names"]["kind"] == "RayJob")
    props = rayjob["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    limits = {"int32": 2**31 - 1, "int64": 2**63 - 1}
    for field, (ours, scale) in {"activeDeadlineSeconds": ("active_deadline_minutes", 60),
                                 "backoffLimit": ("backoff_limit", 1),
                                 "ttlSecondsAfterFinished": ("ttl_seconds_after_finished", 1)}.items():
        limit = limits[props[field]["format"]]
        assert limit == INT32_MAX
        RayJobConfig(**{ours: limit // scale})  # the largest value that fits is accepted
        with pytest.raises(FieldError):
            RayJobConfig(**{ours: limit // scale + 1})


def test_the_section_defaults_pass_their_own_rules():
    CheckpointConfig(), TrainConfig(), RayJobConfig(), DataConfig()
