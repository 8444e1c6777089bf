"""On real text the loop learns: the demo corpus, the real Qwen2.5 tokenizer, the full 151,936 vocab.

The one full-vocabulary training test (the output layer dominates a tiny model's
compute). One plain process runs the same loop the Ray workers run; the 2-worker equivalence is
proven in test_resume_ray.py and test_parallel.py.
"""
from __future__ import annotations

import statistics

import pytest
import torch.distributed as dist

from tiny_qwen import tiny_qwen2_config
from training.config import job_config_from_dict
from training.data.tokenizer import DEFAULT_TOKENIZER_DIR

DEMO_JSONL = "training/assets/demo_corpus/jsonl/notes.jsonl"
STEPS = 10


@pytest.mark.slow
def test_training_loss_falls_and_held_out_loss_improves(tmp_path, monkeypatch):
    # `make test` builds the tokenizer first: its absence is a broken install, not a reason to skip
    assert (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file(), "tokenizer not built: run make install"
    from pathlib import Path

    from training.loop import local_context, train

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("RAYTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    job = job_config_from_dict({
        "name": "text-test",
        "model": {"config": tiny_qwen2_config(vocab_size=151936, pad_token_id=151643, bos_token_id=151643,
                                              eos_token_id=151645),
                  "tokenizer": str(DEFAULT_TOKENIZER_DIR)},
        "data": {"kind": "jsonl", "path": DEMO_JSONL, "eval_fraction": 0.1},
        "train": {"seq_len": 64, "micro_batch_size": 4, "global_batch_size": 4, "max_steps": STEPS,
                  "lr": 5e-3, "warmup_steps": 2, "report_every_n_steps": 100},
        "eval": {"max_batches": 2},
    }, "test")
    try:
        summary = train(job, local_context(str(tmp_path)))
    finally:
        dist.destroy_process_group()
    losses = summary["losses"]
    assert len(losses) == STEPS
    # Then the training loss falls well below where it started (ln 151936 = 11.9 at random init)
    assert statistics.mean(losses[-3:]) < statistics.mean(losses[:3]) - 1.0
    # and the held-out loss after training is below the one before it.
    assert summary["eval_loss_after"] < summary["eval_loss_before"] - 0.5
    assert summary["eval_improved"] is True
