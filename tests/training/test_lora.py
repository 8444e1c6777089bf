"""LoRA (training/model_transforms/lora.py) through the job's own path: the job config checks its
options, build_model applies it, FSDP2 shards the mixed frozen-bf16 / trainable-fp32 units,
checkpoints hold the adapters and their AdamW state only, and a resume is bit-identical.
One process, a gloo group of one (tiny Qwen2)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tiny_qwen import tiny_qwen2_config
from training import model_transforms
from training.config import JobConfigError, job_config_from_dict

STEPS, EVERY = 4, 2


def _job(options=None):
    return job_config_from_dict({
        "name": "lora-test", "model": {"config": tiny_qwen2_config(),
                                       "transforms": [{"name": "lora", "options": options or {}}]},
        "train": {"seq_len": 16, "micro_batch_size": 2, "global_batch_size": 2, "max_steps": STEPS,
                  "warmup_steps": 1, "lr": 1e-2},
    }, "jobs/t.toml")


def test_lora_ships_and_bad_options_are_one_line():
    assert "lora" in model_transforms.transform_names()
    assert _job({"rank": 4, "alpha": 8}).model.transforms[0].options == {"rank": 4, "alpha": 8}
    cases = [({"rank": 0}, "options.rank: 0 must be an integer >= 1"),
             ({"dropout": 1.0}, "options.dropout: 1.0 must be a number in [0, 1)"),
             ({"targets": []}, "options.targets: [] must be a non-empty list of linear module names (e.g. q_proj)"),
             ({"base_dtype": "float16"}, "options.base_dtype: 'float16' must be one of bfloat16, float32"),
             ({"ranks": 8}, "options.ranks: 8 is not a lora option (allowed: rank, alpha, dropout, targets, base_dtype)")]
    for options, message in cases:
        with pytest.raises(JobConfigError) as err:
            _job(options)
        assert str(err.value) == f"jobs/t.toml: model.transforms[0].{message}"


def test_base_frozen_in_bf16_adapters_trainable_in_fp32_and_the_start_is_the_base_model():
    from training.model import build_model

    job = _job()
    torch.manual_seed(0)
    model = build_model(job.model, seq_len=16, on_gpu=False)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    # 2 layers x 7 projections x (A, B)
    assert len(trainable) == 28 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {p.dtype for p in trainable.values()} == {torch.float32}
    assert {p.dtype for p in frozen.values()} == {torch.bfloat16}
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" in frozen
    torch.manual_seed(0)
    base = build_model(job_config_from_dict({**job.to_dict(), "model": {"config": tiny_qwen2_config()}},
                                            "jobs/t.toml").model, seq_len=16, on_gpu=False)
    for param in base.parameters():  # bf16 weights, fp32 rotary frequencies: as a bf16 export loads
        param.data = param.data.to(torch.bfloat16)
    ids = torch.randint(0, 500, (1, 16))
    with torch.no_grad():  # B = 0: the adapted model starts as the base model, exactly
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)


def _train(job, workdir, *, resume_from="", phase="train", base_seed=0):
    from training.checkpointing import CheckpointManager, TrainerState, copy_report, restore
    from training.model import build_model, loss_sum
    from training.optim import build_optimizer, build_scheduler
    from training.parallel import build_mesh, parallelize

    from training.model_transforms.lora import lora_base_problem

    torch.manual_seed(base_seed)
    model = build_model(job.model, seq_len=16, on_gpu=False)
    torch.manual_seed(0)
    # activation checkpointing as the shipped jobs run: recomputed blocks see the same dropout masks
    parallelize(model, build_mesh("full_shard", 1, on_gpu=False), strategy="full_shard", on_gpu=False,
                activation_checkpointing=True)
    optimizer = build_optimizer(model, job.train, job.optim)
    scheduler = build_scheduler(optimizer, job.train, job.optim)
    trainer = TrainerState(scheduler=scheduler)
    restore(model=model, optimizer=optimizer, trainer=trainer, local_root=f"{workdir}/node", resume_from=resume_from)
    if problem := lora_base_problem(model, trainer):  # as training/loop.py does after the restore
        return problem, None
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=f"{workdir}/node",
                                run_name=phase, every_n_steps=EVERY, report=copy_report(f"{workdir}/storage/{phase}"),
                                model_config=model.config.to_dict())
    losses = {}
    for step in range(trainer.step + 1, STEPS + 1):
        ids = torch.randint(0, 500, (2, 16))  # the global RNG: restored by the resume
        loss = loss_sum(model, {"input_ids": ids, "labels": ids})
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        trainer.step = step
        losses[step] = loss.item()
        manager.step_end(step, {"loss": losses[step]}, max_steps=STEPS)
    manager.finish(trainer.step, {})
    adapters = {n: p.full_tensor().clone() for n, p in model.named_parameters() if p.requires_grad}
    return losses, adapters


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    yield
    dist.destroy_process_group()


def test_fsdp2_trains_only_the_adapters_checkpoints_hold_only_them_and_resume_is_bit_identical(group, tmp_path):
    job = _job({"rank": 4, "alpha": 8, "dropout": 0.1})
    losses, adapters = _train(job, tmp_path)
    checkpoint = tmp_path / "storage" / "train" / f"checkpoint_{EVERY:08d}"
    keys = set(dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata)
    model_keys = {k for k in keys if k.startswith("app.model.")}
    optim_keys = {k for k in keys if k.startswith("app.optim.state.")}
    assert model_keys == {f"app.model.{n}" for n in adapters}  # no frozen base weight
    assert optim_keys == {f"app.optim.state.{n}.{s}" for n in adapters for s in ("step", "exp_avg", "exp_avg_sq")}
    meta = dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    assert {meta[f"app.optim.state.{n}.exp_avg"].properties.dtype for n in adapters} == {torch.float32}

    from training.checkpointing import export_local

    with pytest.raises(RuntimeError, match="a LoRA checkpoint holds the adapters only"):
        export_local(checkpoint, tmp_path / "offline")  # no base weights to consolidate

    resumed, resumed_adapters = _train(job, tmp_path, resume_from=str(checkpoint), phase="resume")
    assert sorted(resumed) == [3, 4]
    assert resumed == {s: losses[s] for s in (3, 4)}  # bit-identical floats
    assert all(torch.equal(adapters[n], resumed_adapters[n]) for n in adapters)

    # the same run resumed on ANOTHER base (other weights, same shapes): refused before a step
    problem, _ = _train(job, tmp_path, resume_from=str(checkpoint), phase="other-base", base_seed=1)
    assert problem.startswith("resume refused: the frozen base model differs from the one this LoRA run started with")
    assert "\n" not in problem


def test_the_bf16_base_keeps_its_rotary_frequencies_in_fp32():
    """Oracle: transformers 5.13 ``models/qwen2/modeling_qwen2.py`` ``Qwen2RotaryEmbedding``
    (:65-68 ``inv_freq``/``original_inv_freq`` buffers from ``compute_default_rope_parameters``
    :71-98, computed in float32; ``forward`` :103-108 multiplies them by the positions in float32).
    A base loaded in fp32 (``dtype = "auto"``) and frozen in bf16 must keep those buffers as
    computed: ``model.to(bfloat16)`` cast them too (relative error up to 3.6e-3), while a server
    loading the exported model recomputes them in fp32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    from training.model_transforms import lora

    config = Qwen2Config(**tiny_qwen2_config())
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)  # float32, as "auto" loads an fp32 checkpoint
    lora.apply(model, {"base_dtype": "bfloat16"})
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    exact, _ = Qwen2RotaryEmbedding.compute_default_rope_parameters(config, device=None)
    rotary = model.model.rotary_emb
    for name in ("inv_freq", "original_inv_freq"):
        buffer = getattr(rotary, name)
        assert buffer.dtype == torch.float32, f"{name} cast to {buffer.dtype}"
        assert torch.equal(buffer, exact.float()), f"{name} differs from the fp32 frequencies"
    positions = torch.tensor([[2047]])
    cos, _ = rotary(torch.zeros(1, 1, config.hidden_size), positions)
    angle = positions.float()[..., None] * exact.float()
    assert torch.equal(cos[0, 0, : exact.numel()], torch.cos(angle)[0, 0])
