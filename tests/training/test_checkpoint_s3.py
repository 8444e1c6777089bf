"""Checkpoints in S3 (moto's server on 127.0.0.1), one process: listing, completeness, the
existing-run policy, restore from a URI, SIGTERM -> final checkpoint, export to ``<run>/hf``."""
from __future__ import annotations

import logging
import os
import signal

import pyarrow.fs as pafs
import pytest
import torch

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (one server per session)


def tiny_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(model_type="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                  tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)), config


class Stream:
    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def one_step(model, optimizer, stream):
    ids = torch.randint(2, 64, (2, 8))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    stream.position += 1
    return loss.item()


def write_run(run: str, tmp_path, steps: int, every: int):
    from training.checkpointing import CheckpointManager, TrainerState, copy_report

    model, config = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stream = Stream()
    trainer = TrainerState(data=stream)
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=str(tmp_path / "local"),
                                run_name="r", every_n_steps=every, report=copy_report(run), model_config=config)
    for step in range(1, steps + 1):
        one_step(model, optimizer, stream)
        trainer.step = step
        manager.step_end(step, {}, max_steps=steps)
    manager.finish(steps, {})
    return model, optimizer, stream, manager


@pytest.fixture
def run(s3_bucket, tmp_path):  # noqa: F811
    return f"{s3_bucket}/{tmp_path.name}/run"


def _s3(uri: str):
    return pafs.FileSystem.from_uri(uri)


def test_s3_listing_skips_missing_marker_and_truncated_shard(run, tmp_path, caplog):
    from training.checkpointing import find_latest_complete, list_checkpoints

    write_run(run, tmp_path, steps=6, every=2)
    assert [c.step for c in list_checkpoints(run)] == [6, 4, 2]
    fs, path = _s3(run)
    fs.delete_file(f"{path}/checkpoint_00000006/COMPLETE.json")
    shard = f"{path}/checkpoint_00000004/__0_0.distcp"
    with fs.open_input_stream(shard) as handle:
        data = handle.read()
    with fs.open_output_stream(shard) as handle:
        handle.write(data[:-10])
    with caplog.at_level(logging.WARNING):
        found = find_latest_complete(run)
    assert found.step == 2 and found.uri.endswith("checkpoint_00000002")
    assert "checkpoint_00000006: no readable COMPLETE.json" in caplog.text
    assert "checkpoint_00000004: __0_0.distcp has" in caplog.text


def test_existing_run_policy(run, tmp_path):
    from training.checkpointing import ExistingRunError, plan_resume

    fresh = plan_resume(storage_path=run.rsplit("/", 1)[0], run_name="never-ran", on_existing_run="refuse",
                        max_steps=10)
    assert not fresh.existed and fresh.resume_from == ""
    write_run(run, tmp_path, steps=4, every=2)
    storage, name = run.rsplit("/", 1)
    plan = plan_resume(storage_path=storage, run_name=name, on_existing_run="resume", max_steps=10)
    assert plan.existed and plan.resume_step == 4 and plan.resume_from.endswith("checkpoint_00000004")
    with pytest.raises(ExistingRunError, match=r"on_existing_run: 'refuse' and run 'run' already exists") as err:
        plan_resume(storage_path=storage, run_name=name, on_existing_run="refuse", max_steps=10, source="job.toml")
    assert "\n" not in str(err.value) and str(err.value).startswith("job.toml: ")
    # another world size resumes: the workers reshard through DCP
    other = plan_resume(storage_path=storage, run_name=name, on_existing_run="resume", max_steps=10, world_size=2)
    assert other.resume_step == 4
    with pytest.raises(ExistingRunError, match=r"train.max_steps: 4 already reached.*step 4"):
        plan_resume(storage_path=storage, run_name=name, on_existing_run="resume", max_steps=4)


def test_restore_from_s3_uri_in_one_process(run, tmp_path):
    from training.checkpointing import TrainerState, restore

    model, optimizer, stream, _ = write_run(run, tmp_path, steps=3, every=0)
    probe = torch.arange(2, 10).unsqueeze(0)
    expected = model(input_ids=probe).logits
    rng_after = torch.rand(3)  # the save captured the RNG just before this draw

    fresh, _ = tiny_model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    trainer = TrainerState(data=Stream())
    torch.manual_seed(123)
    source = restore(model=fresh, optimizer=fresh_optimizer, trainer=trainer, local_root=str(tmp_path / "node"),
                     resume_from=f"{run}/checkpoint_00000003")
    assert source.endswith("checkpoint_00000003") and trainer.step == 3 and trainer.data.position == 3
    assert torch.equal(fresh(input_ids=probe).logits, expected)
    assert torch.equal(torch.rand(3), rng_after)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert not (tmp_path / "node" / "restore" / "checkpoint_00000003").exists()  # the copy is cleaned up


def test_sigterm_sets_the_flag_and_the_next_step_writes_a_final_checkpoint(run, tmp_path):
    from training.checkpointing import (CheckpointManager, TrainerState, copy_report, find_latest_complete,
                                        signals)

    previous = signal.getsignal(signal.SIGTERM)
    signals.reset()
    try:
        signals.install_handler(grace_seconds=60)
        model, config = tiny_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        trainer = TrainerState(data=Stream())
        manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer, local_root=str(tmp_path / "l"),
                                    run_name="r", every_n_steps=0, report=copy_report(run), model_config=config)
        stopped_at = None
        for step in range(1, 100):
            one_step(model, optimizer, trainer.data)
            trainer.step = step
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            if manager.step_end(step, {}, max_steps=100):
                stopped_at = step
                break
        assert stopped_at == 3 and manager.stopped_by_signal
        # the grace-period watchdog is disarmed once the final checkpoint is written: it must
        # not kill a worker (or this test process) after a clean stop
        assert signals._overrun_timer == []
        found = find_latest_complete(run)
        assert found is not None and found.step == 3 and found.marker["step"] == 3
    finally:
        signal.signal(signal.SIGTERM, previous)
        signals.reset()


def test_export_to_s3_loads_with_from_pretrained(run, tmp_path):
    from transformers import AutoModelForCausalLM

    from training.checkpointing import export_latest
    from training.storage.files import download

    model, _, _, _ = write_run(run, tmp_path, steps=2, every=0)
    out = export_latest(run)
    assert out == f"{run}/hf"
    local = download(out, tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(local)
    probe = torch.arange(2, 10).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(exported(input_ids=probe).logits, model(input_ids=probe).logits)
