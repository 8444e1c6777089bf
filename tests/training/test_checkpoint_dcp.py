"""Sharded checkpoints with 2 gloo processes (FSDP2, tiny Qwen2), no Ray: save, complete, skip,
resume bit-identically, export.

One spawn of 2 processes trains 6 steps with a checkpoint every 2 (async DCP, copied into a
storage folder the way Ray Train merges rank folders), then resumes from checkpoint 6 after a
shard of it was altered (same size): it must skip it with a warning naming it, load checkpoint 4
and reproduce steps 5-6 exactly (loss, data position, tokens).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow  # trains in 2 spawned processes

WORLD = 2
STEPS = 6
EVERY = 2


def tiny_config(vocab_size: int = 128) -> dict:
    return dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=1)


class CountingStream:
    """A deterministic per-rank token stream whose position is its state."""

    def __init__(self, rank: int):
        self.rank, self.position = rank, 0

    def next_batch(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1000 * self.rank + self.position)
        self.position += 1
        return torch.randint(2, 128, (4, 16), generator=generator)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def build(rank: int, vocab_size: int = 128):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_config(vocab_size)))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler, CountingStream(rank)


def train_step(model, optimizer, scheduler, stream) -> float:
    batch = stream.next_batch()
    keep = torch.randperm(batch.shape[0])[:2]  # global torch RNG: its state must survive a resume
    ids = batch[keep]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    return loss.item()


def probe_logits(model) -> torch.Tensor:
    ids = torch.arange(2, 18).unsqueeze(0)
    with torch.no_grad():  # FSDP2 gathers the full parameters: the logits are a plain tensor
        return model(input_ids=ids).logits


def _phase(rank: int, workdir: str, phase: str, resume_from: str) -> dict:
    from training.checkpointing import CheckpointManager, TrainerState, copy_report, restore

    model, optimizer, scheduler, stream = build(rank)
    trainer = TrainerState(data=stream, scheduler=scheduler)
    run = f"{workdir}/storage/run"
    restored = restore(model=model, optimizer=optimizer, trainer=trainer, local_root=f"{workdir}/node",
                       resume_from=resume_from)
    manager = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer,
                                local_root=f"{workdir}/node", run_name=phase, every_n_steps=EVERY,
                                report=copy_report(run if phase == "train" else f"{workdir}/storage/{phase}"),
                                model_config=tiny_config())
    record = {"restored": restored, "start": trainer.step, "steps": {}}
    for step in range(trainer.step + 1, STEPS + 1):
        loss = train_step(model, optimizer, scheduler, stream)
        trainer.step, trainer.tokens_seen = step, trainer.tokens_seen + 2 * 16 * WORLD
        record["steps"][str(step)] = {"loss": loss, "position": stream.position, "tokens": trainer.tokens_seen}
        if step == 4 and phase == "train":
            logits = probe_logits(model)  # a collective: every rank runs the forward
            if rank == 0:
                torch.save(logits, f"{workdir}/logits_step4.pt")
        manager.step_end(step, {"loss": loss}, max_steps=STEPS)
    manager.finish(trainer.step, {})
    record["stall_s"] = [t.stall_s for t in manager.timings]
    if phase == "resume":  # what this rank would fetch to restore checkpoint 4 (DCP's own plan)
        from training.checkpointing.restore import byte_ranges, fetch_plan
        from training.checkpointing.state import checkpoint_state

        folder = Path(run) / "checkpoint_00000004"
        state = checkpoint_state(model, optimizer, trainer, rank)
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        whole, partial = fetch_plan(state, folder, sizes)
        spans = byte_ranges(state, folder)
        record["reads"] = {"whole": whole, "partial_bytes": sum(n for s in partial.values() for _, n in s),
                           "largest_partial_item": max((n for s in partial.values() for _, n in s), default=0),
                           "sizes": sizes, "read_bytes": {k: sum(n for _, n in v) for k, v in spans.items()}}
    return record


def _corrupt_keeping_size(shard: Path) -> None:
    """Same size, different bytes: only the sha256 check after download can tell."""
    data = shard.read_bytes()
    shard.write_bytes(bytes(b ^ 0xFF for b in data[:64]) + data[64:])


def _worker(rank: int, workdir: str) -> None:
    """Both phases in the same 2 processes (a spawn costs ~10-40 s of imports on a busy box)."""
    import torch.distributed as dist

    logging.basicConfig(level=logging.WARNING, filename=f"{workdir}/rank{rank}.log")
    # a file store: a port picked beforehand could be taken before the ranks bind it
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=WORLD)
    first = _phase(rank, workdir, "train", "")
    Path(f"{workdir}/train.rank{rank}.json").write_text(json.dumps(first))
    dist.barrier()
    run = Path(workdir) / "storage" / "run"
    if rank == 0:
        shutil.copytree(run, Path(workdir) / "pristine")
        _corrupt_keeping_size(run / "checkpoint_00000006" / "__0_0.distcp")
    dist.barrier()
    resumed = _phase(rank, workdir, "resume", str(run / "checkpoint_00000006"))
    Path(f"{workdir}/resume.rank{rank}.json").write_text(json.dumps(resumed))
    dist.barrier()
    if rank == 0:  # put the pristine copy back for the other tests
        shutil.rmtree(run)
        shutil.move(Path(workdir) / "pristine", run)
    dist.destroy_process_group()


def _records(workdir: Path, phase: str) -> list[dict]:
    return [json.loads((workdir / f"{phase}.rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dcp")
    mp.spawn(_worker, args=(str(workdir),), nprocs=WORLD, join=True)
    return workdir, _records(workdir, "train")


def test_every_checkpoint_is_complete_in_storage(trained):
    from training.checkpointing import find_latest_complete, is_complete, list_checkpoints

    workdir, records = trained
    run = str(workdir / "storage" / "run")
    assert [c.step for c in list_checkpoints(run)] == [6, 4, 2]
    for checkpoint in list_checkpoints(run):
        assert is_complete(checkpoint.uri), checkpoint.uri
        marker = json.loads((Path(checkpoint.uri) / "COMPLETE.json").read_text())
        assert marker["step"] == checkpoint.step and marker["world_size"] == WORLD and marker["shards"] == WORLD
    assert find_latest_complete(run).step == 6
    assert records[0]["start"] == 0 and len(records[0]["steps"]) == STEPS


def test_truncated_shard_and_missing_marker_are_skipped(trained, caplog):
    from training.checkpointing import find_latest_complete, is_complete

    workdir, _ = trained
    run = workdir / "storage" / "run"
    scratch = workdir / "scratch-run"
    shutil.copytree(run, scratch)
    shard = scratch / "checkpoint_00000006" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (scratch / "checkpoint_00000004" / "COMPLETE.json").unlink()
    assert not is_complete(scratch / "checkpoint_00000006")
    with caplog.at_level(logging.WARNING):
        found = find_latest_complete(str(scratch))
    assert found.step == 2
    assert "checkpoint_00000006" in caplog.text and "__1_0.distcp" in caplog.text
    assert "checkpoint_00000004" in caplog.text and "COMPLETE.json" in caplog.text


def test_resume_skips_a_corrupt_checkpoint_and_is_bit_identical(trained):
    workdir, first = trained
    resumed = _records(workdir, "resume")
    log_text = (workdir / "rank0.log").read_text()
    assert "checkpoint_00000006" in log_text and "sha256" in log_text
    for rank in range(WORLD):
        assert resumed[rank]["restored"].endswith("checkpoint_00000004")
        assert resumed[rank]["start"] == 4
        for step in ("5", "6"):
            assert resumed[rank]["steps"][step] == first[rank]["steps"][step]  # loss, position, tokens: exact


def test_each_rank_fetches_only_its_own_shard(trained):
    workdir, _ = trained
    for rank, record in enumerate(_records(workdir, "resume")):
        reads = record["reads"]
        own = f"__{rank}_0.distcp"
        assert reads["whole"] == [own]  # fetched whole, hash-checked
        others = sum(size for name, size in reads["sizes"].items() if name.endswith(".distcp") and name != own)
        # of the other rank's file only byte ranges, and only small ones: the replicated scalars
        # (AdamW's step counters) DCP's de-duplication stored there, never a shard
        assert reads["partial_bytes"] < 0.25 * others and reads["largest_partial_item"] < 4096, reads


def test_another_world_size_reshards_through_dcp(trained, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.checkpointing import TrainerState, restore

    workdir, first = trained
    # written by 2 ranks, restored by ONE process without FSDP
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_config()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = TrainerState(data=CountingStream(0))
    source = restore(model=model, optimizer=optimizer, trainer=trainer, local_root=str(tmp_path),
                     resume_from=str(workdir / "storage" / "run" / "checkpoint_00000004"))
    assert source.endswith("checkpoint_00000004") and trainer.step == 4
    assert trainer.data.position == first[0]["steps"]["4"]["position"]  # rank 0's trainer state
    assert torch.allclose(probe_logits(model), torch.load(workdir / "logits_step4.pt"), rtol=0, atol=1e-6)


def test_export_loads_with_from_pretrained_and_gives_the_same_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    from training.checkpointing import export_local

    workdir, _ = trained
    out = export_local(workdir / "storage" / "run" / "checkpoint_00000004", tmp_path / "hf")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        logits = model(input_ids=torch.arange(2, 18).unsqueeze(0)).logits
    expected = torch.load(workdir / "logits_step4.pt")
    assert torch.allclose(logits, expected, rtol=0, atol=1e-6), (logits - expected).abs().max()
