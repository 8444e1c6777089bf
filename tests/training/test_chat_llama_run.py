"""Any causal LM from its own files, run as the job runs: ``python -m training --config FILE``
(its checks, then the Ray Train fit) fine-tunes a tiny random Llama (tests/tiny_llama.py: its
config.json, generation_config.json, a byte-level tokenizer with Meta's Llama 3 chat template,
all in one model directory, as a model from the hub arrives) on chat data. The answers are
trained with their ``<|eot_id|>`` and nothing else; the held-out exact match stops at that
token, which only the template and the generation config name (the tokenizer's eos is
``<|end_of_text|>``), so the answers match exactly once trained. A copy of the model without a
chat template is refused by the entry point's checks in one line, before Ray starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_llama import build_model_dir

ROOT = Path(__file__).resolve().parents[2]
STEPS, SEQ, EVAL_FRACTION = 30, 64, 0.2


def _job(tmp_path: Path, model: Path) -> Path:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say ok, {i}."},
                                                    {"role": "assistant", "content": "ok"}]}) + "\n"
                            for i in range(60)))
    job = tmp_path / "llama-chat.toml"
    job.write_text(f"""
name = "llama-chat"
[model]
path = "{model}"
[data]
kind = "chat"
path = "{data}"
eval_fraction = {EVAL_FRACTION}
[train]
seq_len = {SEQ}
micro_batch_size = 4
global_batch_size = 4
max_steps = {STEPS}
lr = 1e-2
warmup_steps = 2
report_every_n_steps = 10
[checkpoint]
storage_path = "{tmp_path / 'runs'}"
export_hf = false
[eval]
max_batches = 2
exact_match = true
""")
    return job


def _entry_point(job: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training", "--config", str(job)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.mark.subprocess
def test_a_tokenizer_without_a_chat_template_is_refused_before_ray_starts(tmp_path):
    model = build_model_dir(tmp_path / "model", chat_template=None)
    out = _entry_point(_job(tmp_path, model), {})
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: {tmp_path / 'llama-chat.toml'}: model.path: {model}: the tokenizer has no "
                                 "chat template"), out.stderr
    assert "data.kind 'chat' holds conversations" in out.stderr


@pytest.mark.slow  # one Ray Train fit (1 worker) on the session's Ray cluster
def test_a_tiny_llama_learns_its_answers_and_the_eval_stops_at_its_eot(tmp_path, ray_cluster):
    model = build_model_dir(tmp_path / "model")
    out = _entry_point(_job(tmp_path, model), {"RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
                                                "RAYTRAIN_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    record = json.loads((tmp_path / "runs" / "llama-chat" / "run.json").read_text())
    data = record["data"]
    # assistant-only: each training conversation holds exactly 3 targets, "o", "k" and <|eot_id|>
    assert data["kind"] == "chat" and data["tokens_dropped"] == 0
    assert round(data["target_fraction"] * data["blocks"] * SEQ) == 3 * data["train_documents"]
    before, after = record["eval"]["before"], record["eval"]["after"]
    assert after["eval_tokens"] == 3 * after["eval_batches_per_rank"] * 4  # one held-out conversation per row
    # the eval stopped at <|eot_id|>: the generated text is the answer, nothing after it
    assert after["exact_match"] == 1.0, after["exact_match_samples"]
    assert all(s["generated"] == "ok" for s in after["exact_match_samples"])
    assert after["eval_loss"] < before["eval_loss"]
