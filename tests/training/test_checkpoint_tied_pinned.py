"""A tied output layer is stored once and comes back tied; on GPU the checkpoint stages into
pinned host buffers made once for the run (the GPU branch runs on CPU with only the device
injected)."""
from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from tiny_qwen import tiny_qwen2_config


def _tied_model(seed: int):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(Qwen2Config(**tiny_qwen2_config()))


def test_tied_weights_are_saved_once_and_restored_tied(tmp_path):
    from training.checkpointing.state import ModelOptimizerState, tied_names

    model = _tied_model(0)
    assert tied_names(model) == {"lm_head.weight": "model.embed_tokens.weight"}
    state = ModelOptimizerState(model, None)
    assert "lm_head.weight" not in state.state_dict()["model"]
    dcp.save({"app": state}, checkpoint_id=str(tmp_path), no_dist=True)
    metadata = dcp.FileSystemReader(str(tmp_path)).read_metadata()
    stored = [key for key in metadata.state_dict_metadata if key.startswith("app.model.")]
    assert "app.model.model.embed_tokens.weight" in stored and "app.model.lm_head.weight" not in stored

    other = _tied_model(1)
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)
    dcp.load({"app": ModelOptimizerState(other, None)}, checkpoint_id=str(tmp_path), no_dist=True)
    for (name, mine), theirs in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(mine, theirs), name
    assert other.lm_head.weight is other.model.embed_tokens.weight


def test_gpu_checkpoints_stage_through_one_pinned_stager_for_the_run(tmp_path, monkeypatch):
    from training.checkpointing import CheckpointManager, TrainerState
    from training.checkpointing import manager as manager_module

    seen = []
    original = dcp.async_save

    def recording(*args, **kwargs):
        seen.append(kwargs.get("async_stager"))
        return original(*args, **kwargs)

    monkeypatch.setattr(manager_module.dcp, "async_save", recording)
    manager = CheckpointManager(model=torch.nn.Linear(4, 4), optimizer=None, trainer=TrainerState(),
                                local_root=str(tmp_path), run_name="r", every_n_steps=1, report=lambda *a: None,
                                device=torch.device("cuda", 0))  # the device decision, injected
    for step in (1, 2):
        manager.trainer.step = step
        manager.step_end(step, {"loss": 1.0}, max_steps=2)
    manager.finish(2)
    assert len(seen) == 2 and seen[0] is seen[1] is manager._stager
    options = manager._stager._config
    assert options.use_pinned_memory and not options.use_async_staging
