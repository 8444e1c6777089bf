"""Fast checks of the loop's parts: schedule, throughput figures, entry-point validation."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tiny_qwen import tiny_qwen2_config
from training import evaluation, metrics, optim
from training.__main__ import main


def test_warmup_then_cosine_to_the_floor():
    f = [optim.lr_factor(s, warmup_steps=4, max_steps=20, min_lr_ratio=0.1) for s in range(20)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[4:], f[5:]))  # never rises after the warmup
    assert f[-1] == pytest.approx(0.1)
    assert optim.lr_factor(0, warmup_steps=0, max_steps=10, min_lr_ratio=0.0) == pytest.approx(1.0)


def test_throughput_figures_and_mfu_only_with_a_known_peak():
    config = tiny_qwen2_config()
    cpu = metrics.ThroughputModel.for_model(config, seq_len=32, tokens_per_step=128, world_size=2, device="cpu")
    figures = cpu.figures(step_time_s=0.5)
    assert figures["tokens_per_s"] == pytest.approx(256)
    assert figures["tokens_per_s_per_device"] == pytest.approx(128)
    assert figures["mfu"] is None
    # The peak comes from the manifest (RAYTRAIN_PEAK_BF16_TFLOPS), never from the device name.
    l4 = metrics.ThroughputModel.for_model(config, seq_len=32, tokens_per_step=128, world_size=2, device="NVIDIA L4",
                                           environ={"RAYTRAIN_PEAK_BF16_TFLOPS": "121"})
    gpu = l4.figures(step_time_s=0.5)
    assert gpu["mfu"] == pytest.approx(gpu["tflops_per_device"] / 121.0)
    unstated = metrics.ThroughputModel.for_model(config, seq_len=32, tokens_per_step=128, world_size=2,
                                                 device="NVIDIA L4", environ={})
    assert unstated.figures(step_time_s=0.5)["mfu"] is None
    assert gpu["tflops_per_device"] == pytest.approx(128 * l4.flops_per_token / 1e12)


def test_progress_line_and_eval_line():
    line = metrics.progress_line({"step": 3, "loss": 2.5, "lr": 1e-4, "grad_norm": 0.5, "tokens_per_s": 12345.6,
                                  "mfu": None}, 10, eta_s=75)
    assert line == "step 3/10 | loss 2.5000 | lr 1.00e-04 | gnorm 0.500 | 12,346 tok/s | mfu n/a | eta 1m15s"
    before = {"eval_loss": 3.0, "eval_perplexity": math.exp(3.0)}
    after = {"eval_loss": 2.0, "eval_perplexity": math.exp(2.0)}
    figures = evaluation.before_after(before, after)
    assert figures["eval_improved"] is True
    assert evaluation.eval_line(figures) == "eval: loss 3.0000 -> 2.0000 | ppl 20.1 -> 7.4"
    assert evaluation.before_after(None, after)["eval_improved"] is None


def _write_job(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(body))
    return str(path)


TINY_JOB = """
name = "units"
[model.config]
vocab_size = 512
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 256
pad_token_id = 511
[train]
seq_len = 64
global_batch_size = 4
max_steps = 4
warmup_steps = 1
[parallel]
num_workers = 2
"""


def test_entry_point_accepts_a_good_job(tmp_path, capsys):
    assert main(["--config", _write_job(tmp_path, TINY_JOB), "--check"]) == 0
    assert "ok (2 workers, full_shard, 4 steps of 256 tokens)" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, expected", [
    (["train.seq_len=512"], "train.seq_len: 512 exceeds the model's max_position_embeddings (256)"),
    (["parallel.strategy=zero3"], "parallel.strategy: 'zero3' is not allowed"),
    (["train.global_batch_size=5"], "train.global_batch_size: 5 must be divisible by num_workers x micro_batch_size"),
    (["parallel.strategy=hybrid_shard", "parallel.workers_per_node=2"], "needs >= 2 nodes"),
    (["train.max_steps"], "is not key=value"),
    (["data.kind=text"], "data.path: '' is empty but data.kind is 'text'"),
    (["model.tokenizer=/nonexistent/tok"], "model.tokenizer: '/nonexistent/tok' is not a directory"),
])
def test_entry_point_refuses_bad_jobs_in_one_line(tmp_path, capsys, overrides, expected):
    args = ["--config", _write_job(tmp_path, TINY_JOB)]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def test_entry_point_reads_max_positions_from_the_model_directory(tmp_path, capsys):
    # Given a model directory whose config.json says 128 positions (never assumed)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 128}))
    (model_dir / "model.safetensors").write_bytes(b"")  # the check looks for the weights' file, not into it
    (model_dir / "tokenizer.json").write_text("{}")
    job = _write_job(tmp_path, TINY_JOB.replace("[model.config]", f'[model]\npath = "{model_dir}"\n[model.config]'))
    assert main(["--config", job, "--check"]) == 0  # seq_len 64 fits
    assert main(["--config", job, "--check", "--set", "train.seq_len=256"]) == 2
    assert "exceeds the model's max_position_embeddings (128)" in capsys.readouterr().err
    (model_dir / "config.json").unlink()
    assert main(["--config", job, "--check"]) == 2
    assert "holds no config.json" in capsys.readouterr().err


class _ScriptedLM(torch.nn.Module):
    """Stands in for the LM (not for the code under test): after a prompt of length p it
    predicts ``script[len - p]``, so the generated text is known exactly."""

    def __init__(self, prompt_len: int, script: list[int], vocab: int = 16):
        super().__init__()
        self.prompt_len, self.script, self.vocab = prompt_len, script, vocab

    def forward(self, input_ids):
        logits = torch.zeros(1, input_ids.shape[1], self.vocab)
        logits[0, -1, self.script[input_ids.shape[1] - self.prompt_len]] = 1.0
        return SimpleNamespace(logits=logits)


def test_exact_match_counts_whole_answers_and_stops_at_the_stop_token(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    try:
        prompts = [SimpleNamespace(prompt_ids=[1, 2], answer=" 5 6 "), SimpleNamespace(prompt_ids=[1, 2], answer="5")]
        figures = evaluation.exact_match(_ScriptedLM(2, [5, 6, 9, 7]), prompts, device=torch.device("cpu"),
                                         stop_ids={9}, decode=lambda ids: " ".join(map(str, ids)))
    finally:
        dist.destroy_process_group()
    # "5 6" then the stop token: the first answer matches (whitespace-insensitive), the second not.
    assert figures["exact_match"] == pytest.approx(0.5)
    assert figures["exact_match_prompts"] == 2
    assert figures["exact_match_samples"][1] == {"answer": "5", "generated": "5 6"}
