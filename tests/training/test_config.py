"""The job config schema (training/config.py): overrides, derived values, one-line refusals."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from training.config import JobConfigError, load_job_config

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
name = "unit"
[model]
config = { hidden_size = 64, num_hidden_layers = 2 }
[data]
kind = "synthetic"
[train]
seq_len = 64
micro_batch_size = 2
global_batch_size = 8
max_steps = 20
warmup_steps = 2
[parallel]
strategy = "full_shard"
num_workers = 2
workers_per_node = 2
"""


@pytest.fixture
def job(tmp_path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(GOOD)
    return path


def test_good_config_loads_and_derives(job):
    cfg = load_job_config(job)
    assert cfg.grad_accum_steps == 2  # 8 / (2 workers x 2 micro)
    assert cfg.num_nodes == 1 and cfg.tokens_per_step == 8 * 64
    assert cfg.run_name == "unit" and cfg.is_infrastructure_check


def test_overrides_are_typed_and_validated(job):
    cfg = load_job_config(job, ["parallel.num_workers=4", "train.global_batch_size=16",
                                "checkpoint.storage_path=s3://b/runs", "parallel.use_gpu=true"])
    assert cfg.parallel.num_workers == 4 and cfg.parallel.use_gpu is True
    assert cfg.checkpoint.storage_path == "s3://b/runs"
    assert cfg.grad_accum_steps == 2


BAD = [
    (["parallel.strategy=zero3"], "parallel.strategy: 'zero3' is not allowed (allowed: full_shard, hybrid_shard, no_shard)"),
    (["parallel.strategy=hybrid_shard"], "parallel.strategy: 'hybrid_shard' needs >= 2 nodes"),
    (["train.global_batch_size=6"], "train.global_batch_size: 6 must be divisible by num_workers x micro_batch_size (2 x 2 = 4)"),
    (["train.seq_len=0"], "train.seq_len: 0 must be > 0"),
    (["train.max_steps='ten'"], "train.max_steps: 'ten' is not allowed (expected an integer)"),
    (["train.warmup_steps=20"], "train.warmup_steps: 20 must be < train.max_steps (20)"),
    (["train.lr=-1.0"], "train.lr: -1.0 must be > 0"),
    (["data.kind=parquet"], "data.kind: 'parquet' is not allowed (allowed: synthetic, alpaca, chat, hf, jsonl, preference, sharegpt, text)"),
    (["data.kind=jsonl"], "data.path: '' is empty but data.kind is 'jsonl'"),
    (["data.kind=jsonl", "data.path=/no/such/file.jsonl"], "data.path: '/no/such/file.jsonl' does not exist"),
    (["data.on_bad_record=ignore"], "data.on_bad_record: 'ignore' is not allowed (allowed: error, skip)"),
    (["data.eval_fraction=0.9"], "data.eval_fraction: 0.9 must be between 0 and 0.5"),
    (["parallel.num_workers=3"], "parallel.num_workers: 3 must be a multiple of parallel.workers_per_node (2)"),
    (["checkpoint.on_existing_run=overwrite"], "checkpoint.on_existing_run: 'overwrite' is not allowed (allowed: resume, refuse)"),
    (["checkpoint.storage_path=gs://bucket/x"],
     "checkpoint.storage_path: 'gs://bucket/x' must be s3://bucket/prefix, file:///<path> of a shared file system or a directory"),
    (["checkpoint.storage_path=file://fsx/runs"],
     "checkpoint.storage_path: 'file://fsx/runs' must be file:///<absolute path> (file:// then a path starting with /)"),
    (["evidence.require_transport=infiniband"], "evidence.require_transport: 'infiniband' is not allowed"),
    (["eval.exact_match=true"], "eval.exact_match: True needs conversation data (data.kind 'synthetic' has none)"),
    (["model.max_position_embeddings=32", "train.seq_len=64"], "train.seq_len: 64 exceeds the model's max_position_embeddings (32)"),
    (["train.sequence_length=64"], "train.sequence_length: 'sequence_length' is not a known field (known: "),
    (["modle.path=x"], "modle: 'modle' is not a known field (known: "),
    (["name=Bad_Name"], "name: 'Bad_Name' is not a lower-case DNS label"),
    (["parallel.use_gpu=1"], "parallel.use_gpu: 1 is not allowed (expected true or false)"),
    (["parallel.min_nodes=2"], "parallel.min_nodes: 2 is more than the job's nodes (num_workers 2 / workers_per_node 2 "
                               "= 1); allowed 0 (fixed) or 1..1"),
    (["parallel.num_workers=6", "parallel.min_nodes=2", "train.micro_batch_size=1", "train.global_batch_size=6"],
     "train.global_batch_size: 6 must be divisible by every elastic size x micro_batch_size (parallel.min_nodes 2: "
     "4 workers x 1)"),
    (["parallel.min_nodes=-1"], "parallel.min_nodes: -1 must be >= 0"),
    (["parallel.strategy=no_shard", "parallel.grad_reduce_dtype=bfloat16"],
     "parallel.grad_reduce_dtype: 'bfloat16' with no_shard and 2 micro batches per step would sum the micro batches "
     "in bf16, not fp32 (use float32, or full_shard)"),
]


def test_an_elastic_job_keeps_its_global_batch_at_every_size(job):
    cfg = load_job_config(job, ["parallel.num_workers=6", "parallel.min_nodes=1", "train.micro_batch_size=1",
                                "train.global_batch_size=12"])
    assert cfg.world_sizes == (2, 4, 6) and cfg.elastic
    assert [cfg.accum_steps_at(w) * w for w in cfg.world_sizes] == [12, 12, 12]
    assert load_job_config(job).world_sizes == (2,) and not load_job_config(job).elastic


def test_bf16_reduce_is_accepted_where_fp32_accumulation_holds(job):
    """full_shard casts every micro batch to the fp32 gradient; one micro batch holds nothing back."""
    assert load_job_config(job, ["parallel.grad_reduce_dtype=bfloat16"]).parallel.grad_reduce_dtype == "bfloat16"
    single = load_job_config(job, ["parallel.strategy=no_shard", "parallel.grad_reduce_dtype=bfloat16",
                                   "train.global_batch_size=4"])
    assert single.grad_accum_steps == 1


@pytest.mark.parametrize("overrides,message", BAD, ids=[m for _, m in BAD])
def test_bad_job_config_is_refused_with_one_line(job, overrides, message):
    with pytest.raises(JobConfigError) as err:
        load_job_config(job, overrides)
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(job))
    assert message in text, text


def test_bad_files_and_override_syntax(tmp_path, job):
    with pytest.raises(JobConfigError, match="missing.toml: file not found"):
        load_job_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = ")
    with pytest.raises(JobConfigError, match="broken.toml: not valid TOML"):
        load_job_config(broken)
    with pytest.raises(JobConfigError, match="is not key=value"):
        load_job_config(job, ["train.max_steps"])


def test_job_config_schema_imports_only_the_standard_library():
    """charts/ and the preflight validate job configs with this module: it must not need torch or ray."""
    code = ("import sys; before=set(sys.modules); import training.config;"
            "new={m.split('.')[0] for m in set(sys.modules)-before};"
            "print(','.join(sorted(m for m in new if m not in ('training','spec_schema') and m not in sys.stdlib_module_names and not m.startswith('_'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""


def test_a_worker_count_ray_may_choose_that_does_not_keep_the_global_batch_is_refused(job):
    # Ray 2.58 train/v2/_internal/execution/scaling_policy/elastic.py _count_possible_workers sums
    # floor(free / per-worker) over nodes: any count in [min, max], not whole nodes (a node with
    # one GPU taken gives 2 + 1 = 3 here). Flooring the accumulation would train a smaller batch.
    cfg = load_job_config(job, ["parallel.num_workers=6", "parallel.min_nodes=1", "train.micro_batch_size=1",
                                "train.global_batch_size=12"])
    with pytest.raises(ValueError, match=r"train.global_batch_size: 12 .* 5 workers"):
        cfg.accum_steps_at(5)
