"""Bad data in a real run: refused before Ray by the driver, and, where only a worker can see it,
one line from the driver, the run failed at the data stage, and no retry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = '{"text": "a line of training text about nothing in particular"}\n'


def _job(tmp_path: Path, data: Path, **checkpoint) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in checkpoint.items())
    job = tmp_path / "bad-data.toml"
    job.write_text(f"""
name = "bad-data"
[model]
config = {{ hidden_size = 32, num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, intermediate_size = 64, vocab_size = 151936, max_position_embeddings = 256 }}
tokenizer = "training/assets/qwen2.5-tokenizer"
[data]
kind = "jsonl"
path = "{data}"
eval_fraction = 0.1
[train]
seq_len = 16
micro_batch_size = 1
global_batch_size = 2
max_steps = 2
warmup_steps = 0
[parallel]
num_workers = 2
workers_per_node = 2
[checkpoint]
{extra}""")
    return job


def _bad_data(tmp_path: Path) -> Path:
    data = tmp_path / "corpus.jsonl"
    data.write_text(GOOD * 40 + '{"content": "the wrong field name"}\n' + GOOD * 10)
    return data


def test_the_job_entry_point_refuses_bad_data_before_ray_starts(tmp_path):
    job = _job(tmp_path, _bad_data(tmp_path))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "training", "--config", str(job)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert f"{job}: data.path: {tmp_path / 'corpus.jsonl'}, line 41: missing field 'text'" in out.stderr
    assert "found: content" in out.stderr
    print(f"refused in {elapsed:.2f} s")


# A driver of its own (its output is what is under test) on the session's Ray cluster
# (tests/conftest.py ``ray_cluster``): a second cluster would cost its start-up again.
WORKER_RUN = """
import sys
import ray
from training.config import load_job_config
from training.launch import run
ray.init(address=sys.argv[2], log_to_driver=True)
sys.exit(run(load_job_config(sys.argv[1])))
"""


@pytest.mark.slow  # starts 2 Ray Train workers
def test_a_data_error_seen_by_the_workers_is_one_line_and_not_retried(tmp_path, ray_cluster):
    # given bad data that the driver's check does not see (the check is bypassed: launch.run is
    # called directly) and a job allowing 2 worker failures
    storage = tmp_path / "runs"
    job = _job(tmp_path, _bad_data(tmp_path), storage_path=str(storage), max_failures=2, export_hf=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAYTRAIN_CACHE_DIR": str(tmp_path / "cache"),
           "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    start = time.perf_counter()
    address = ray_cluster.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, "-c", WORKER_RUN, str(job), address], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env=env)  # a bound on a hang only
    elapsed = time.perf_counter() - start
    text = out.stdout + out.stderr
    # then the driver prints ONE error line (what, where, which rank) and exits 2
    assert out.returncode == 2, text[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith("error: DataError on rank 0")
    assert "corpus.jsonl, line 41: missing field 'text'" in errors[0]
    # and no traceback of ours (Ray itself may log one about its dashboard on a loaded machine)
    assert not any('File "' in line and f"{ROOT}/training/" in line for line in text.splitlines()), text[-3000:]
    assert sum("DataError" in line for line in text.splitlines()) == 1, text[-3000:]
    assert "RETRY" not in text, text[-3000:]
    # and the record says where it failed
    record = json.loads((storage / "bad-data" / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_code"] == 2
    assert record["failure"]["stage"] == "data" and record["failure"]["rank"] == 0
    # and no worker ran twice: one marker per rank, from this one attempt
    markers = sorted(p.name for p in (storage / "bad-data").glob("data-error-*"))
    assert len(markers) == 2 and len({m.split("-rank-")[0] for m in markers}) == 1, markers
    print(f"failed in {elapsed:.1f} s with the driver's start-up; {record['duration_s']:.1f} s from the run's start "
          "(Ray up, before the workers) to its one line")
