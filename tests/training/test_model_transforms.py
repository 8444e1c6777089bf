"""The model-transform registry (training/model_transforms/): LoRA ships (tests/training/test_lora.py);
the transform here is defined by the test, as one file added to the folder. The
job config names it and checks its options in one line; build_model applies it before FSDP2
shards the model, and a training step under FSDP2 sees it."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

from tiny_qwen import tiny_qwen2_config
from training import model_transforms
from training.config import JobConfigError, job_config_from_dict

FREEZE = '''
"""freeze: parameters whose name starts with one of options["prefixes"] are not trained."""
from spec_schema import FieldError


def check(options):
    prefixes = options.get("prefixes")
    if not isinstance(prefixes, list) or not prefixes or not all(isinstance(p, str) for p in prefixes):
        raise FieldError("prefixes", prefixes, "must be a non-empty list of parameter name prefixes")


def apply(model, options):
    for name, param in model.named_parameters():
        if name.startswith(tuple(options["prefixes"])):
            param.requires_grad_(False)
'''


def _job(*transforms):
    return job_config_from_dict({
        "name": "transform-test", "model": {"config": tiny_qwen2_config(), "transforms": list(transforms)},
        "train": {"seq_len": 16, "micro_batch_size": 2, "global_batch_size": 2, "max_steps": 4, "warmup_steps": 1,
                  "lr": 1e-2},
    }, "jobs/t.toml")


@pytest.fixture
def freeze(tmp_path, monkeypatch):
    """The registry with one more file: ``freeze.py`` in a folder of the package's search path."""
    (tmp_path / "freeze.py").write_text(FREEZE)
    monkeypatch.setattr(model_transforms, "__path__", [*model_transforms.__path__, str(tmp_path)])
    yield
    sys.modules.pop("training.model_transforms.freeze", None)


def test_an_unknown_transform_is_one_line():
    assert model_transforms.transform_names() == ("lora",)  # the one that ships (tests/training/test_lora.py)
    with pytest.raises(JobConfigError) as err:
        _job({"name": "qlora"})
    assert str(err.value) == ("jobs/t.toml: model.transforms[0].name: 'qlora' is not a model transform (known: lora; "
                              "each is a file in training/model_transforms/)")


def test_a_transform_file_is_named_and_its_options_checked_by_the_job_config(freeze):
    assert model_transforms.transform_names() == ("freeze", "lora")
    job = _job({"name": "freeze", "options": {"prefixes": ["model.embed_tokens"]}})
    assert [(t.name, dict(t.options)) for t in job.model.transforms] == [("freeze", {"prefixes": ["model.embed_tokens"]})]
    with pytest.raises(JobConfigError) as err:
        _job({"name": "freeze", "options": {"prefixes": "model.embed_tokens"}})
    assert str(err.value) == ("jobs/t.toml: model.transforms[0].options.prefixes: 'model.embed_tokens' must be a "
                              "non-empty list of parameter name prefixes")
    # the driver hands the config to the workers as a table (training/launch.py: job.to_dict())
    assert job_config_from_dict(job.to_dict(), "jobs/t.toml") == job
    with pytest.raises(JobConfigError, match=r"model\.transforms\[1\]\.name: 'frieze' is not a model transform \(known: freeze, lora;"):
        _job({"name": "freeze", "options": {"prefixes": ["x"]}}, {"name": "frieze"})


def test_the_transform_runs_before_fsdp_shards_the_model(freeze, tmp_path):
    from training.model import build_model, loss_sum
    from training.optim import build_optimizer
    from training.parallel import build_mesh, parallelize

    job = _job({"name": "freeze", "options": {"prefixes": ["model.embed_tokens"]}})
    torch.manual_seed(0)
    model = build_model(job.model, seq_len=job.train.seq_len, on_gpu=False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"model.embed_tokens.weight"}  # tied: the output layer is the same tensor

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False)
        optimizer = build_optimizer(model, job.train, job.optim)
        before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        ids = torch.randint(0, 500, (2, job.train.seq_len))
        loss_sum(model, {"input_ids": ids, "labels": ids}).backward()
        optimizer.step()
        after = {n: p.full_tensor() for n, p in model.named_parameters()}
    finally:
        if started:
            dist.destroy_process_group()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert "model.embed_tokens.weight" not in changed
    assert changed == set(before) - frozen  # every other parameter trained
