"""The oracle for the job's LoRA (training/model_transforms/lora.py): peft 0.18.0 (a test-only
dependency; the DLC has none), on a tiny Qwen2.

The rules ported from peft v0.18.0 ``src/peft/tuners/lora/layer.py``: ``scaling = lora_alpha / r``
(:203), ``lora_A`` Kaiming-uniform with ``a=sqrt(5)`` (:256) and ``lora_B`` zero (:261), and
``Linear.forward`` (:793-807): ``result + lora_B(lora_A(dropout(x))) * scaling`` with the input cast
to the adapter's dtype. Same rank, alpha, dropout, targets and initial weights must give the same
losses and adapter gradients step by step; the adapter the job exports, loaded by
``PeftModel.from_pretrained``, and the merged export, loaded alone by ``from_pretrained``, must
give the job model's logits.
"""
from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch

from tiny_qwen import tiny_qwen2_config

if importlib.util.find_spec("peft") is None:  # the dev extra pins it (pyproject.toml)
    pytest.skip("peft is not installed: the dev extra pins it", allow_module_level=True)
# peft is imported by the tests that use it, not here: every pytest-xdist worker collects this
# module and one runs it, and importing peft takes seconds (it imports transformers' trainer side)

RANK, ALPHA, DROPOUT = 4, 8, 0.1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _base():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()), dtype=torch.float32)


def _pair():
    """(ours, peft's) on the same float32 base, peft's adapters set to ours, B made non-zero
    so the first step's gradients reach A too."""
    import peft

    from training.model_transforms import lora

    ours, theirs = _base(), _base()
    lora.apply(ours, {"rank": RANK, "alpha": ALPHA, "dropout": DROPOUT, "base_dtype": "float32"})
    theirs = peft.get_peft_model(theirs, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT,
                                                         target_modules=TARGETS, bias="none"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, module in ours.named_modules():
            if name.endswith("lora_B"):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.01)
        peers = dict(theirs.named_parameters())
        for name, param in ours.named_parameters():
            if param.requires_grad:  # model.layers.0.self_attn.q_proj.lora_A.weight
                peers[_peft_name(name)].copy_(param)
    return ours, theirs


def _peft_name(name: str) -> str:
    """Our adapter parameter's name in a PeftModel (adapter name ``default``, peft's ModuleDict)."""
    return "base_model.model." + name.replace(".weight", ".default.weight")


def test_same_losses_and_adapter_gradients_as_peft_over_steps():
    ours, theirs = _pair()
    assert theirs.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"] == ALPHA / RANK
    trainable = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert {_peft_name(n) for n in trainable} == {n for n, p in theirs.named_parameters() if p.requires_grad}
    opt_ours = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], lr=1e-2)
    opt_theirs = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], lr=1e-2)
    ours.train(), theirs.train()
    for step in range(3):
        ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(step))
        torch.manual_seed(100 + step)  # the same dropout masks: both draw them in the same order
        loss_ours = ours(input_ids=ids, labels=ids).loss
        loss_ours.backward()
        torch.manual_seed(100 + step)
        loss_theirs = theirs(input_ids=ids, labels=ids).loss
        loss_theirs.backward()
        torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-6, atol=1e-6)
        grads = dict(theirs.named_parameters())
        for name, param in ours.named_parameters():
            if param.requires_grad:
                assert param.grad is not None and param.grad.abs().sum() > 0, name
                torch.testing.assert_close(param.grad, grads[_peft_name(name)].grad, rtol=1e-5, atol=1e-7)
        opt_ours.step(), opt_theirs.step()
        opt_ours.zero_grad(), opt_theirs.zero_grad()


def test_the_exported_adapter_loads_in_peft_and_the_merged_export_loads_alone(tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    from training.checkpointing.export import export_model
    from training.model import export_config

    ours, _ = _pair()
    ours.eval()
    ours.published_dtype = "float32"
    written = export_model(ours, str(tmp_path / "hf"), model_config=export_config(ours))
    assert set(written) == {"merged", "peft_adapter"}
    assert written["peft_adapter"]["uri"] == str(tmp_path / "hf-adapter")
    config = json.loads((tmp_path / "hf-adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (RANK, ALPHA, sorted(TARGETS))

    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = ours(input_ids=ids).logits
        loaded = peft.PeftModel.from_pretrained(_base(), str(tmp_path / "hf-adapter")).eval()
        # every adapter tensor arrived (a key peft does not know would be left at its init)
        sent = dict(ours.named_parameters())
        for name, param in loaded.named_parameters():
            if ".lora_" in name:
                assert torch.equal(param, sent[name.removeprefix("base_model.model.").replace(".default", "")]), name
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
    assert written["merged"]["sha256"] != written["peft_adapter"]["sha256"]


def test_peft_is_test_only():
    """Never a dependency of the job: not in the train extra, not imported by training/."""
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith("peft") for d in extras["train"])
    assert any(d.startswith("peft==") for d in extras["dev"])
    imports = re.compile(r"^\s*(import peft|from peft[ .])", re.MULTILINE)
    assert not [p for p in (root / "training").rglob("*.py") if imports.search(p.read_text())]


def test_a_tied_output_layer_targeted_exports_a_merged_model_that_keeps_the_embedding(tmp_path):
    """``targets`` with ``lm_head`` on a tied model (tiny Qwen2, as Qwen2.5-0.5B to 3B): the
    merge changes the output weight only, so the merged model cannot stay tied. transformers
    5.13 ``modeling_utils.py`` ``PreTrainedModel.tie_weights`` re-ties ``lm_head`` to
    ``embed_tokens`` at ``from_pretrained`` whenever ``tie_word_embeddings`` is set, dropping
    one of the two, and ``load_state_dict`` into a tied skeleton writes both keys into ONE
    tensor; peft 0.18.0 keeps the adapter beside the tied base weight (its logits are the oracle)."""
    import peft
    from transformers import AutoModelForCausalLM

    from training.checkpointing.export import export_model
    from training.model import export_config
    from training.model_transforms import lora

    ours = _base()
    lora.apply(ours, {"rank": RANK, "alpha": ALPHA, "targets": ["q_proj", "lm_head"], "base_dtype": "float32"})
    assert ours.lm_head.base_layer.weight is ours.model.embed_tokens.weight  # tied, as built
    with torch.no_grad():
        for name, module in ours.named_modules():
            if name.endswith("lora_B"):
                module.weight.copy_(torch.randn(module.weight.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    ours.eval()
    ours.published_dtype = "float32"
    export_model(ours, str(tmp_path / "hf"), model_config=export_config(ours))
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = ours(input_ids=ids).logits
        loaded = peft.PeftModel.from_pretrained(_base(), str(tmp_path / "hf-adapter")).eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
        torch.testing.assert_close(merged.model.embed_tokens.weight, _base().model.embed_tokens.weight)
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_the_adapter_submit_copies_back_loads_in_peft(tmp_path):
    """What a user gets: submit copies the run's folders out of its storage
    (raytrain_eks/runs/results.py ``download_run``); the adapter must come with its weights (a copy
    holding only ``adapter_config.json`` made ``PeftModel.from_pretrained`` fail, and a local
    run's bucket is gone when submit ends)."""
    import peft

    from raytrain_eks.runs.results import download_run
    from training.checkpointing.export import export_model
    from training.model import export_config
    from training.storage import RunStorage

    ours, _ = _pair()
    ours.eval()
    ours.published_dtype = "float32"
    run = RunStorage(f"file://{tmp_path / 'runs'}").run("lora-run")
    export_model(ours, f"{run}/hf", model_config=export_config(ours))
    copied = download_run(None, run, tmp_path / "out")
    assert "hf-adapter/adapter_model.safetensors" in copied, copied
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        loaded = peft.PeftModel.from_pretrained(_base(), str(tmp_path / "out" / "hf-adapter")).eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, ours(input_ids=ids).logits)
