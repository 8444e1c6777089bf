"""The optimizer and schedule the job config declares (``[optim]`` + ``[train]``): the defaults
are the optimizer every run had before ``[optim]`` existed, bit for bit; each setting reaches
torch.optim.AdamW; the config refuses exactly what AdamW refuses."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from spec_schema import FieldError
from tiny_qwen import tiny_qwen2_config
from training import optim
from training.config_sections import OptimConfig, TrainConfig


def _hard_coded_build_optimizer(model, train_cfg):
    """training/optim.py ``build_optimizer`` before ``[optim]`` (commit 1e27736), verbatim."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    on_gpu = any(p.is_cuda for p in model.parameters())
    kernel = {"fused": True} if on_gpu else {"foreach": True}
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(0.9, 0.95), eps=1e-8, **kernel)


def _hard_coded_lr_factor(step, *, warmup_steps, max_steps, min_lr_ratio):
    """training/optim.py ``lr_factor`` before ``[optim]`` (commit 1e27736), verbatim."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()), dtype=torch.float32)


def _groups(optimizer):
    """Each group's parameters (by identity) and every hyperparameter."""
    return [([id(p) for p in g["params"]], {k: v for k, v in g.items() if k != "params"}) for g in optimizer.param_groups]


def _one_step(model, build):
    model = copy.deepcopy(model)
    optimizer = build(model)
    for index, param in enumerate(model.parameters()):
        param.grad = torch.full_like(param, 0.01 * (index + 1))
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()], optimizer.state_dict()


def test_the_default_optimizer_is_the_hard_coded_one():
    model = _model()
    train = TrainConfig(lr=3e-4, weight_decay=0.1, max_steps=20, warmup_steps=2)
    new, old = optim.build_optimizer(model, train, OptimConfig()), _hard_coded_build_optimizer(model, train)
    assert _groups(new) == _groups(old)
    assert new.defaults == old.defaults
    assert len(new.param_groups[0]["params"]) and len(new.param_groups[1]["params"])  # both rules in play
    params_new, state_new = _one_step(model, lambda m: optim.build_optimizer(m, train, OptimConfig()))
    params_old, state_old = _one_step(model, lambda m: _hard_coded_build_optimizer(m, train))
    assert all(torch.equal(a, b) for a, b in zip(params_new, params_old, strict=True))
    assert all(torch.equal(state_new["state"][i][k], state_old["state"][i][k])
               for i in state_old["state"] for k in state_old["state"][i])


def test_the_default_schedule_is_the_hard_coded_one():
    train = TrainConfig(max_steps=50, warmup_steps=7, min_lr_ratio=0.1)
    optimizer = optim.build_optimizer(_model(), train, OptimConfig())
    scheduler = optim.build_scheduler(optimizer, train, OptimConfig())
    seen = []
    for _ in range(train.max_steps):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    expected = [train.lr * _hard_coded_lr_factor(s, warmup_steps=7, max_steps=50, min_lr_ratio=0.1) for s in range(50)]
    assert seen == expected  # bit for bit


def test_each_setting_reaches_adamw():
    model = _model()
    train = TrainConfig(weight_decay=0.05)
    settings = OptimConfig(beta1=0.8, beta2=0.999, eps=1e-6, no_decay="none", kernel="for_loop")
    optimizer = optim.build_optimizer(model, train, settings)
    assert optimizer.defaults["betas"] == (0.8, 0.999) and optimizer.defaults["eps"] == 1e-6
    assert optimizer.defaults["foreach"] is False and not optimizer.defaults["fused"]
    assert len(optimizer.param_groups[0]["params"]) == len(list(model.parameters()))
    assert optimizer.param_groups[1]["params"] == []


@pytest.mark.parametrize("kernel,expected", [("auto", {"foreach": True}), ("foreach", {"foreach": True}),
                                             ("fused", {"fused": True}), ("for_loop", {"foreach": False})])
def test_the_kernel_on_cpu(kernel, expected):
    """``auto`` on CPU parameters is foreach (the rule before ``[optim]``); ``fused`` runs on CPU
    too in torch 2.13 (torch/utils/_foreach_utils.py ``_get_fused_kernels_supported_devices``
    lists "cpu")."""
    model = _model()
    assert optim.adamw_kernel(model, kernel) == expected
    params, _ = _one_step(model, lambda m: optim.build_optimizer(m, TrainConfig(), OptimConfig(kernel=kernel)))
    assert all(torch.isfinite(p).all() for p in params)


def test_the_schedule_shapes():
    kw = dict(warmup_steps=2, max_steps=12, min_lr_ratio=0.2)
    linear = [optim.lr_factor(s, schedule="linear", **kw) for s in range(12)]
    assert linear[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert linear[-1] == pytest.approx(0.2)
    assert linear[2:] == pytest.approx([1.0 - 0.8 * k / 9 for k in range(10)])
    assert [optim.lr_factor(s, schedule="constant", **kw) for s in range(12)] == [0.5] + [1.0] * 11


BETAS = [-0.1, 0.0, 0.5, 0.999, 1.0, 1.5]


@pytest.mark.parametrize("name,value", [("beta1", b) for b in BETAS] + [("beta2", b) for b in BETAS]
                         + [("eps", e) for e in (-1e-8, 0.0, 1e-8, 1.0)])
def test_the_config_refuses_what_adamw_refuses(name, value):
    """Oracle: torch 2.13 torch/optim/adam.py ``Adam.__init__`` (lines 60-65: ``0 <= eps``,
    ``0 <= betas[i] < 1``; AdamW passes its arguments there) decides; the config must refuse
    exactly those values before any worker starts."""
    settings = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, name: value}
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], betas=(settings["beta1"], settings["beta2"]),
                          eps=settings["eps"])
        takes = True
    except ValueError:
        takes = False
    try:
        OptimConfig(**{name: value})
        ours = True
    except FieldError:
        ours = False
    assert ours == takes, (name, value)


def test_run_json_records_the_optimizer_settings(tmp_path):
    """The driver's record (training/launch.py ``start_record``) holds the ``[optim]`` section as
    the job ran it, defaults included."""
    from fixture_paths import FIXTURE_JOBS
    from training import launch
    from training.config import load_job_config
    from training.storage.files import read_json

    job = load_job_config(FIXTURE_JOBS / "local.toml", [f"checkpoint.storage_path={tmp_path}", "optim.beta2=0.99",
                                                        "optim.schedule='linear'"])
    recorded = read_json(launch.start_record(job, ["python"]).uri)["job_config"]
    assert recorded["optim"] == {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "no_decay": "1d", "kernel": "auto",
                                 "schedule": "linear"}
    assert {k: recorded["train"][k] for k in ("lr", "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip")} == {
        k: getattr(job.train, k) for k in ("lr", "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip")}
