"""The loop under Ray Train: 2 workers (FSDP2 full_shard on gloo) through the real TorchTrainer.

One fit, compared with the same loop in one plain process (same global batch): equal losses,
metrics.jsonl in the run directory with every per-step field, and the before/after eval.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import tiny_qwen2_config
from training.config import job_config_from_dict

STEPS = 6


def _job(storage: str, *, workers: int, micro: int, **train):
    return job_config_from_dict({
        "name": "loop-test",
        "model": {"config": tiny_qwen2_config()},
        "data": {"kind": "synthetic"},
        "train": {"seq_len": 32, "micro_batch_size": micro, "global_batch_size": 4, "max_steps": STEPS,
                  "lr": 1e-3, "warmup_steps": 1, "report_every_n_steps": 2, **train},
        "parallel": {"strategy": "full_shard", "num_workers": workers},
        "checkpoint": {"storage_path": storage},
        "eval": {"max_batches": 1},
    }, "test")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ray_fit(ray_cluster, tmp_path_factory):
    from training.launch import build_trainer, run_dir

    storage = str(tmp_path_factory.mktemp("storage"))
    job = _job(storage, workers=2, micro=1)
    result = build_trainer(job, argv=["python", "-m", "training", "--config", "test"]).fit()
    return job, result, Path(run_dir(job))


@pytest.fixture(scope="module")
def single_process():
    from training.loop import local_context, train

    with tempfile.TemporaryDirectory() as tmp:
        job = _job(tmp, workers=1, micro=4)
        try:
            return train(job, local_context(tmp))
        finally:
            dist.destroy_process_group()


@pytest.mark.slow
def test_two_ray_workers_match_one_process(ray_fit, single_process):
    # Given 2 Ray workers (micro batch 1, accumulation 2) and one process (micro batch 4),
    # when both train on the same global batches, then every step's loss is the same.
    _, result, run = ray_fit
    records = _read_jsonl(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in train] == pytest.approx(single_process["losses"], abs=1e-4)
    assert result.error is None


@pytest.mark.slow
def test_metrics_jsonl_holds_every_figure(ray_fit):
    job, _, run = ray_fit
    records = _read_jsonl(run / "metrics.jsonl")
    step = next(r for r in records if r["kind"] == "train")
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_device", "tflops_per_device",
                "step_time_s", "compute_s", "peak_memory_gib", "tokens_seen"):
        assert isinstance(step[key], float | int), key
    assert step["mfu"] is None  # CPU: no peak to compare with
    assert step["tokens_per_s_per_device"] == pytest.approx(step["tokens_per_s"] / 2)
    assert step["tokens_seen"] == job.tokens_per_step
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, STEPS]
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["eval_loss_before"] == evals[0]["eval_loss"]
    assert summary["eval_loss_after"] == evals[-1]["eval_loss"]
