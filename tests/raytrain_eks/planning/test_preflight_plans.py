"""Preflight refuses the plans that would waste GPU hours and passes the reference 8x L4 plan."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain_eks.cli import main
from raytrain_eks.planning.memory_estimate import GIB, estimate_memory, shapes_for_job, usable_bytes
from raytrain_eks.planning.preflight import run_preflight
from environment import load_environment
from training.config import load_job_config
from training.flops import ModelShapes
from raytrain_eks.planning.measured_plan import MODEL_CONFIGS
from fixtures_s3 import s3_server  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[3]
ENV = str(ROOT / "environment.toml")
JOBS = ROOT / "tests" / "fixtures" / "preflight_jobs"
REFERENCE = str(JOBS / "reference_8xl4.toml")
QWEN2_5_1_5B = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS["Qwen2.5-1.5B"]})
QWEN2_5_7B = ModelShapes.from_hf_config({"model_type": "qwen2", **MODEL_CONFIGS["Qwen2.5-7B"]})
MODELS = {  # where the plans below name a model: its published config.json is put there
    "s3://raytrain-models-111122223333/Qwen2.5-1.5B-Instruct": "Qwen2.5-1.5B",
    "s3://{bucket}/models/Qwen2.5-1.5B-Instruct": "Qwen2.5-1.5B",
    "s3://{bucket}/models/qwen": "Qwen2.5-1.5B",
    "s3://bucket/models/Qwen2.5-7B-Instruct": "Qwen2.5-7B",
    "s3://bucket/Qwen2.5-7B-Instruct": "Qwen2.5-7B",
    **{f"s3://{{bucket}}/models/Qwen2.5-{size}-Instruct": f"Qwen2.5-{size}" for size in ("0.5B", "3B", "7B", "14B")},
}


@pytest.fixture(autouse=True, scope="module")
def models_in_s3(s3_server):  # noqa: F811
    """The models' config.json files (and the shipped jobs' chat and preference data) in moto's S3, where the
    plans name them: the preflight reads a model's shapes from its config.json, nothing else.
    Written once for the module (the session's server keeps them; no test here changes them)."""
    import boto3

    bucket = load_environment(ENV).bucket_name
    client = boto3.client("s3")
    for uri, model in MODELS.items():
        name, _, key = uri.replace("{bucket}", bucket).removeprefix("s3://").partition("/")
        if name not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=name)
        client.put_object(Bucket=name, Key=f"{key}/config.json",
                          Body=json.dumps({"model_type": "qwen2", **MODEL_CONFIGS[model]}).encode())
    chat = "".join(json.dumps({"messages": [{"role": "user", "content": f"question {i} " * 40},
                                            {"role": "assistant", "content": f"answer {i} " * 80}]}) + "\n"
                   for i in range(400))
    client.put_object(Bucket=bucket, Key="data/chat/train.jsonl", Body=chat.encode())
    pairs = "".join(json.dumps({"prompt": f"question {i} " * 40, "chosen": f" answer {i}" * 40,
                                "rejected": f" no {i}" * 30}) + "\n" for i in range(400))
    client.put_object(Bucket=bucket, Key="data/preference/pairs.jsonl", Body=pairs.encode())


def preflight(capsys, *extra: str, job: str = REFERENCE, dist: str = "/nonexistent-dist") -> tuple[int, str, str]:
    code = main(["preflight", "--env", ENV, "--job", job, "--dist", dist, *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_reference_8x_l4_plan_passes_with_breakdown_and_cost(capsys):
    code, out, err = preflight(capsys)
    assert code == 0, err
    assert "verdict    OK" in out and err == ""
    for term in ("parameters", "gradients", "optimizer (AdamW fp32)", "FSDP gathered working set",
                 "activations (checkpointed)", "logits + loss", "activations without / with checkpointing"):
        assert term in out
    # 2 x g6.12xlarge while the job runs + the m7i.2xlarge system node; GPU nodes scale from zero
    assert "USD at 9.60 USD/h" in out and "M tokens/hour" in out and "s/step" in out
    assert "11 min of GPU nodes scaling up from zero and idling before removal" in out
    assert "idle             0.40 USD/h with no job" in out
    # the image each GPU node pulls as it scales up: both paths, the spec's marked
    # (environment/image_source.py; the cache is off in this spec)
    assert "image pull   20 GB per GPU node, 2 node(s) start per job" in out
    assert "* public registry via NAT" in out and "  ECR pull-through cache" in out


def test_too_many_gpus_is_refused_in_one_line(capsys):
    code, _, err = preflight(capsys, "--set", "parallel.num_workers=16", "--set", "train.global_batch_size=32")
    assert code == 2
    assert err.count("\n") == 1 and "parallel.num_workers: 16 asks for more GPUs" in err and "has 8" in err


def test_full_shard_that_cannot_fit_on_l4_is_refused(capsys):
    code, out, err = preflight(capsys, "--set", "train.seq_len=8192", "--set", "train.micro_batch_size=2",
                               "--set", "train.global_batch_size=32", "--set", "parallel.activation_checkpointing=false")
    assert code == 2
    assert "full_shard at train.seq_len = 8192 x micro_batch_size = 2" in err
    assert "L4 has 22.3 GiB usable" in err and "activation_checkpointing = true" in err
    assert "FAIL  memory" in out


def test_seq_4096_fits_only_with_activation_checkpointing(capsys):
    assert preflight(capsys, "--set", "train.seq_len=4096")[0] == 0
    code, _, err = preflight(capsys, "--set", "train.seq_len=4096", "--set", "parallel.activation_checkpointing=false")
    assert code == 2 and "seq_len = 4096" in err


def test_ray_version_mismatch_with_the_manifests_is_refused(capsys, tmp_path):
    (tmp_path / "raycluster.yaml").write_text("apiVersion: ray.io/v1\nkind: RayJob\nspec:\n  rayClusterSpec:\n"
                                              "    rayVersion: 2.57.0\n")
    code, _, err = preflight(capsys, dist=str(tmp_path))
    assert code == 2 and "image.ray_version 2.58.0 but rayVersion 2.57.0" in err
    (tmp_path / "raycluster.yaml").write_text('{"spec": {"rayVersion": "2.58.0"}}')
    code, out, _ = preflight(capsys, dist=str(tmp_path))
    assert code == 0 and "= rayVersion in 1 manifest(s)" in out


def test_local_job_checks_the_installed_ray():
    env, job = load_environment(ENV), load_job_config(JOBS / "local_cpu.toml")
    assert run_preflight(env, job, installed_ray="2.58.0").refusal is None
    refusal = run_preflight(env, job, installed_ray="2.49.0").refusal
    assert "installed Ray 2.49.0 vs the image's Ray 2.58.0" in refusal


def test_efa_requested_but_not_possible_is_refused(capsys):
    code, _, err = preflight(capsys, "--set", "parallel.num_workers=4", "--set", "train.global_batch_size=32")
    assert code == 2 and "spans 1 node" in err


def test_unknown_model_without_config_is_refused(capsys):
    code, _, err = preflight(capsys, "--set", "model.path=s3://bucket/SomeOther-7B")
    assert code == 2 and "model.path: 's3://bucket/SomeOther-7B' holds no config.json" in err
    code, _, err = preflight(capsys, "--set", "model.path=Qwen/Qwen2.5-7B-Instruct")  # a hub id: nothing to read here
    assert code == 2 and "no readable config.json here" in err


def test_shapes_come_from_a_local_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}))
    job = load_job_config(REFERENCE, [f"model.path={tmp_path}"])
    shapes, source = shapes_for_job(job)
    assert shapes == QWEN2_5_1_5B and source.endswith("config.json")


def test_memory_terms_by_hand():
    e = estimate_memory(QWEN2_5_1_5B, strategy="full_shard", world_size=8, workers_per_node=4, seq_len=2048,
                        micro_batch_size=1, activation_checkpointing=False)
    n = 1_543_714_304
    assert e.parameters == n * 4 // 8 and e.optimizer == n * 8 // 8   # fp32 master weights, sharded 8 ways
    # bf16 logits and their gradient at (at most) every position + one 512-token fp32 chunk and its gradient
    assert e.logits == 2048 * 151936 * 4 + 512 * 151936 * 8
    assert e.activations == 2048 * 28 * (11 * 1536 + 4 * 8960 + 3 * 256) * 2
    hybrid = estimate_memory(QWEN2_5_1_5B, strategy="hybrid_shard", world_size=8, workers_per_node=4, seq_len=2048,
                             micro_batch_size=1, activation_checkpointing=False)
    assert hybrid.shard_group == 4 and hybrid.optimizer == 2 * e.optimizer
    no_shard = estimate_memory(QWEN2_5_1_5B, strategy="no_shard", world_size=8, workers_per_node=4, seq_len=2048,
                               micro_batch_size=1, activation_checkpointing=False)
    assert no_shard.required > usable_bytes(24) > e.required     # DDP-style does not fit an L4; full shard does
    assert usable_bytes(24) / GIB == pytest.approx(22.32, abs=0.01)
    pure_bf16 = estimate_memory(QWEN2_5_1_5B, strategy="full_shard", world_size=8, workers_per_node=4, seq_len=2048,
                                micro_batch_size=1, activation_checkpointing=False, param_bytes=2)
    assert pure_bf16.parameters == n * 2 // 8 and pure_bf16.required < e.required


def test_sharded_accumulation_costs_nothing_and_kept_gathered_parameters_cost_the_bf16_model():
    n = 1_543_714_304
    common = dict(strategy="full_shard", world_size=8, workers_per_node=4, seq_len=2048, micro_batch_size=1,
                  activation_checkpointing=True)
    one = estimate_memory(QWEN2_5_1_5B, **common)
    eight = estimate_memory(QWEN2_5_1_5B, **common, grad_accum_steps=8)
    kept = estimate_memory(QWEN2_5_1_5B, **common, grad_accum_steps=8, keep_gathered=True)
    # every micro batch reduce-scatters: no unsharded fp32 gradient outlives a block's backward
    assert eight.accumulation == 0 and eight.total == one.total
    # parameters gathered in bf16 for the whole step (~2.9 GiB)
    assert kept.accumulation == n * 2 and kept.total - one.total == n * 2


def test_shipped_finetune_job_runs_the_plan_the_search_finds_fastest(monkeypatch, capsys):
    """The plan search (not the hand model's strategy ranking at a stated MFU) decides the
    shipped plan: its pick is the job's plan, and the preflight says so."""
    from charts.jobs import plan_job
    from raytrain_eks.planning import plan_search

    monkeypatch.chdir(ROOT)
    env = load_environment(ENV)
    job = plan_job(env, Path("jobs/finetune-qwen2.5-1.5b.toml"), ROOT).config  # sized as the charts size it
    shapes, _ = shapes_for_job(job)
    found = plan_search.search(job, shapes, env.gpu_group(job.parallel.node_group))
    assert found.chosen.candidate == plan_search.current(job) and found.chosen.memory_source == "measured"
    code, out, err = preflight(capsys, job="jobs/finetune-qwen2.5-1.5b.toml")
    assert code == 0 and "the job's plan is the fastest that fits" in out and "NOTE  strategy" not in out


def test_preflight_checks_the_shape_the_charts_synthesize(capsys, tmp_path):
    # Given a GPU job file that asks for 2 workers per node on 4-GPU nodes: the charts size
    # every GPU job to the node's GPUs, so preflight must check 4 per node, not the file's 2.
    job = tmp_path / "two-per-node.toml"
    job.write_text(Path(REFERENCE).read_text().replace("workers_per_node = 4", "workers_per_node = 2"))
    code, out, err = preflight(capsys, job=str(job))
    assert code == 0, err
    assert "parallel.workers_per_node = 4; a g6.12xlarge has 4 GPUs" in out
    # And a user's --set goes through the same sizing: 4 workers = one node of the spec's group.
    code, out, err = preflight(capsys, "--set", "parallel.num_workers=4", "--set", "train.global_batch_size=16", job=str(job))
    assert code == 2 and "require_transport = 'efa' but the job spans 1 node" in err



def test_a_plan_that_does_not_fit_is_told_the_change_that_would(capsys):
    too_big = ("--set", "train.seq_len=8192", "--set", "train.micro_batch_size=2", "--set", "train.global_batch_size=32",
               "--set", "parallel.activation_checkpointing=false")
    code, _, err = preflight(capsys, *too_big)
    assert code == 2 and "set parallel.activation_checkpointing = true (then ~" in err
    # the advised change, applied, passes the memory check
    code, out, err = preflight(capsys, *too_big[:-1], "parallel.activation_checkpointing=true")
    assert "PASS  memory" in out, err


def test_qwen2_5_7b_on_two_l4_nodes_is_told_how_many_nodes_full_shard_needs(capsys):
    code, _, err = preflight(capsys, "--set", "model.path=s3://bucket/models/Qwen2.5-7B-Instruct")
    assert code == 2 and err.count("\n") == 1
    assert "no setting fits 2 node(s) as it trains: " in err and "; else full shard with activation checkpointing needs" in err
    nodes = int(err.split("checkpointing needs ")[1].split(" nodes")[0])
    shapes = QWEN2_5_7B
    assert shapes.num_params() == 7_615_616_512  # Qwen2.5-7B's published parameter count
    wider = estimate_memory(shapes, strategy="full_shard", world_size=nodes * 4, workers_per_node=4, seq_len=2048,
                            micro_batch_size=1, activation_checkpointing=True, grad_accum_steps=2)
    narrower = estimate_memory(shapes, strategy="full_shard", world_size=(nodes - 1) * 4, workers_per_node=4,
                               seq_len=2048, micro_batch_size=1, activation_checkpointing=True, grad_accum_steps=2)
    assert wider.required <= usable_bytes(24) < narrower.required


def test_measured_collectives_become_link_bytes_and_time():
    """Ring collectives: each GPU sends (n-1)/n of an all-gather or reduce-scatter buffer and
    twice that of an all-reduce; hybrid shard's replicate rings (one per GPU of a node) share
    the node's EFA link."""
    from raytrain_eks.planning.measured_plan import PCIE_GBYTES_PER_S, SUSTAINED_FRACTION, Cluster, predict

    gb = 10**9
    result = {"strategy": "hybrid_shard", "global_batch_size": 64, "micro_batch_size": 1,
              "executed_flops_per_micro_batch": int(121e12 * SUSTAINED_FRACTION),  # 1 s per micro batch
              "model_flops_per_micro_batch": int(121e12 * SUSTAINED_FRACTION),
              "collectives": [
                  {"kind": "all_gather", "group_size": 4, "bytes": 8 * 4 * gb, "first_bytes": 4 * gb, "last_bytes": 4 * gb},
                  {"kind": "all_reduce", "group_size": 2, "bytes": 3 * gb, "first_bytes": 0, "last_bytes": 3 * gb}]}
    p = predict(result, Cluster())
    assert p["grad_accum_steps"] == 8 and p["compute_s"] == 8.0
    assert p["pcie_bytes_per_gpu"] == 8 * 3 * gb            # 3/4 of each 4 GB gather
    assert p["efa_bytes_per_node"] == 4 * 3 * gb            # 2 x 1/2 x 3 GB per GPU, 4 GPUs per node
    efa_s = 12 * gb / (40e9 / 8)                             # 2.4 s on the last micro batch
    pcie_s = 3 * gb / (PCIE_GBYTES_PER_S * 1e9)              # 0.25 s per micro batch: hidden
    assert pcie_s < 1.0 and p["exposed_comm_s"] == pytest.approx(efa_s - 1.0, abs=1e-3)
    assert p["mfu"] == pytest.approx(SUSTAINED_FRACTION * 8 / (8 + efa_s - 1.0), abs=1e-3)


def test_the_step_range_is_the_prediction_at_the_ends_of_the_published_rates():
    """measured_plan.predict_range: predict's own formula, the compute at the L4 GEMM table's
    fastest and slowest rate over its peak, the links at the ends of gpu_figures' PCIe and EFA
    ranges (8-12 and 3-5 GB/s), for a compute-bound and a network-bound step alike."""
    from raytrain_eks.planning.gpu_figures import published
    from raytrain_eks.planning.measured_plan import Cluster, predict, predict_range

    gb, rates = 10**9, published("L4", 40)
    for efa_bytes in (0, 30 * gb):
        result = {"strategy": "hybrid_shard", "global_batch_size": 64, "micro_batch_size": 1,
                  "executed_flops_per_micro_batch": int(60e12), "model_flops_per_micro_batch": int(60e12),
                  "collectives": [{"kind": "all_reduce", "group_size": 2, "bytes": efa_bytes, "first_bytes": 0,
                                   "last_bytes": efa_bytes}]}
        fast, slow = predict_range(result, Cluster())
        assert fast == predict(result, Cluster(), sustained=rates.gemm.high / 121, pcie_gbytes_per_s=12,
                               efa_gbytes_per_s=5)["step_s"]
        assert slow == predict(result, Cluster(), sustained=rates.gemm.low / 121, pcie_gbytes_per_s=8,
                               efa_gbytes_per_s=3)["step_s"]
        assert fast < slow
    # network-bound: 8 micro batches of compute, the last one's all-reduce (4 GPUs x 30 GB over
    # the node's 3 GB/s) exposed past that micro batch's compute
    assert slow == pytest.approx(7 * 60 / rates.gemm.low + 4 * 30 / 3, abs=1e-2)


def test_a_plan_with_memory_to_spare_is_told_the_faster_settings_that_still_fit(capsys):
    code, out, _ = preflight(capsys)
    assert code == 0
    note = next(line for line in out.splitlines() if "memory to spare" in line)
    assert "set parallel.activation_checkpointing = false, parallel.keep_params_gathered = true" in note
    # applied, the plan still passes the memory check
    code, out, err = preflight(capsys, "--set", "parallel.activation_checkpointing=false",
                               "--set", "parallel.keep_params_gathered=true")
    assert "PASS  memory" in out and "memory to spare" not in out, err


def test_the_shipped_job_is_checked_with_its_measured_figures_and_only_on_the_measured_cluster(capsys, monkeypatch):
    from dataclasses import replace

    from raytrain_eks.planning import measured_plan

    monkeypatch.chdir(ROOT)
    code, out, err = preflight(capsys, job="jobs/finetune-qwen2.5-1.5b.toml")
    assert code == 0, err
    assert "GiB per GPU (measured)" in out and "predicted step" in out and "executed / model" in out
    job = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct"])
    shapes, _ = shapes_for_job(job)
    assert measured_plan.for_job(job, shapes, "g6.12xlarge") is not None       # 2 nodes: measured
    wider = replace(job, parallel=replace(job.parallel, num_workers=12), train=replace(job.train, global_batch_size=48))
    assert measured_plan.for_job(wider, shapes, "g6.12xlarge") is None         # 3 nodes: not measured


def test_a_measured_figure_applies_only_to_the_plan_measured_uncompiled(monkeypatch):
    """bench/bench_full_size_plan.py measures without torch.compile: a compiled plan has no
    measured figure (and the preflight falls back to the hand model)."""
    from dataclasses import replace

    from raytrain_eks.planning import measured_plan

    monkeypatch.chdir(ROOT)
    job = load_job_config("jobs/finetune-qwen2.5-1.5b.toml", ["parallel.num_workers=8", "parallel.workers_per_node=4",
                                                              "model.path=s3://raytrain-models-111122223333/Qwen2.5-1.5B-Instruct"])
    shapes, _ = shapes_for_job(job)
    assert measured_plan.for_job(job, shapes, "g6.12xlarge") is not None
    compiled = replace(job, parallel=replace(job.parallel, compile=True))
    assert measured_plan.for_job(compiled, shapes, "g6.12xlarge") is None


def test_time_and_cost_use_the_measured_step_where_the_exact_plan_was_measured(capsys, monkeypatch):
    """The shipped job was measured (bench/bench_full_size_plan.py): the step, tokens/hour and
    the run's cost come from its predicted step, the hand model's step is named beside it. An
    unmeasured plan keeps the hand model at the stated MFU."""
    from raytrain_eks.planning import measured_plan

    monkeypatch.chdir(ROOT)
    code, out, err = preflight(capsys, job="jobs/finetune-qwen2.5-1.5b.toml")
    assert code == 0, err
    env = load_environment(ENV)
    from charts.jobs import plan_job

    job = plan_job(env, Path("jobs/finetune-qwen2.5-1.5b.toml"), ROOT).config
    shapes, _ = shapes_for_job(job)
    step_s = measured_plan.for_job(job, shapes, "g6.12xlarge")["prediction"]["step_s"]
    plan = run_preflight(env, job, dist_dir="/nonexistent-dist")
    e = plan.estimate
    assert e["source"] == "measured" and e["step_s"] == step_s and e["hand_step_s"] != step_s
    assert e["run_hours"] == pytest.approx(job.train.max_steps * step_s / 3600)
    assert e["run_usd"] == pytest.approx((e["run_hours"] + e["overhead_h"]) * e["hourly_usd"])
    assert "time and cost from the measured plan" in out
    assert f"would say {e['hand_step_s']:.2f} s/step" in out
    # every predicted step, run time and cost is shown as its range, slow end first: the step
    # model's range of the traced micro batch
    slow, fast = e["step_range"]
    assert (fast, slow) == tuple(plan.measured["range"]["step_s"]) and slow > fast
    (usd_slow, usd_fast) = e["run_usd_range"]
    assert usd_slow == pytest.approx((job.train.max_steps * slow / 3600 + e["overhead_h"]) * e["hourly_usd"])
    assert f"  step             {slow:.2f}-{fast:.2f} s (slow-fast" in out
    assert f"~{usd_slow:.2f}-{usd_fast:.2f} USD at" in out
    # not measured (the reference plan): its range all the same, slow end first (the step model
    # where its micro batch is traced, with the collectives counted; else the hand model from the
    # stated MFU down, assumed)
    code, out, err = preflight(capsys)
    assert code == 0 and "time and cost at MFU 0.30" in out and "measured plan (above)" not in out
    step_line = next(line for line in out.splitlines() if line.startswith("  step             "))
    assert "(slow-fast; limited by " in step_line and ("step model" in step_line or "(ASSUMED)" in step_line)


def test_the_readmes_model_path_passes_with_its_config_json_in_the_bucket(capsys):
    """README, "Your own data and model": ``model.path = "s3://{bucket}/models/qwen"``. The
    folder's name says nothing about the model: its config.json in the bucket gives the shapes."""
    code, out, err = preflight(capsys, "--set", 'model.path="s3://{bucket}/models/qwen"')
    assert code == 0, err
    bucket = load_environment(ENV).bucket_name
    assert f"shapes from s3://{bucket}/models/qwen/config.json" in out and "PASS  memory" in out


def test_no_table_of_model_names_is_left():
    """One source of shapes: the model's config.json (or the job's inline config)."""
    from raytrain_eks.planning import memory_estimate
    from training import flops

    assert not hasattr(memory_estimate, "KNOWN_MODELS") and not hasattr(memory_estimate, "PUBLISHED_CONFIGS")
    assert not [name for name, value in vars(flops).items() if isinstance(value, flops.ModelShapes)]


def test_a_model_in_an_s3_that_does_not_answer_is_a_note_not_a_refusal(capsys, monkeypatch):
    """No endpoint and no credentials here (pyarrow cannot resolve the bucket's host): the
    memory cannot be checked from this machine, which says nothing against the plan."""
    from fixtures_s3 import SESSION_S3_VARIABLES

    for name in SESSION_S3_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    code, out, err = preflight(capsys)
    assert code == 0, err
    assert "NOTE  memory            not checked: " in out and "cannot read s3://" in out


def test_the_preflight_shows_the_step_range_and_what_is_assumed(capsys):
    # the GPU step's time as a range from raytrain_eks/planning/step_model.py, each assumed figure named
    code, out, _ = preflight(capsys, job=str(ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml"))
    assert code == 0
    assert "step range" in out and "issue 120" in out
    assert "assumed        gemm, memory, kernel_floor_us, pcie, efa" in out
    assert "USD over this range" in out


HYBRID_PLAN = ("parallel.strategy=\"hybrid_shard\"", "parallel.grad_reduce_dtype=\"float32\"",
               "parallel.activation_checkpointing=false", "parallel.checkpoint_every=1", "train.micro_batch_size=1")
"""The shipped finetune's plan before the plan search picked full shard (its measured variants)."""


@pytest.mark.parametrize("settings, trace", [
    ((), "(chat, micro batch 1, checkpointing off, documents"),
    (("parallel.activation_checkpointing=true",), "(chat, micro batch 1, checkpointing on, documents"),
    (("train.micro_batch_size=2", "parallel.activation_checkpointing=true"),
     "(chat, micro batch 2, checkpointing on, documents"),
])
def test_the_step_range_comes_from_the_trace_of_the_job_s_own_micro_batch(capsys, settings, trace):
    """A checkpointed micro batch runs every layer's forward again in backward; a micro batch of
    2 rows moves twice the bytes: each job's range is predicted from the trace of its own key."""
    job = str(ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml")
    code, out, _ = preflight(capsys, *[a for s in (*HYBRID_PLAN, *settings) for a in ("--set", s)], job=job)
    assert code == 0 and "step range       " in out and f"trace          bench/bench_step_model.py --trace {trace}" in out


def test_micro_batch_2_is_judged_by_its_own_measured_plan(capsys):
    """bench/bench_full_size_plan.py measured the finetune at micro batch 2 (the same tokens per
    step in half the micro batches): without checkpointing its measured peak does not fit an L4,
    with checkpointing it does, and the preflight says which from the measurement."""
    job = str(ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml")
    two = (*[a for s in HYBRID_PLAN for a in ("--set", s)], "--set", "train.micro_batch_size=2")
    code, out, _ = preflight(capsys, *two, job=job)
    assert code != 0 and "FAIL  memory" in out and "x micro_batch_size = 2 needs ~" in out and "(measured)" in out
    code, out, _ = preflight(capsys, *two, "--set", "parallel.activation_checkpointing=true", job=job)
    assert code == 0 and "PASS  memory" in out and "(measured)" in out
    assert "(chat, micro batch 2, checkpointing on, documents" in out


def test_a_measured_plan_without_a_trace_of_its_micro_batch_gets_one_line_not_a_range(capsys, monkeypatch, tmp_path):
    """The step range of a checkpointed job never comes from the uncheckpointed trace: where only
    that one exists, the preflight says so in one line and prices no range."""
    from raytrain_eks.planning import step_model

    job, on = str(ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml"), "parallel.activation_checkpointing=true"
    plain = [t for t in step_model.load_traces() if not t["activation_checkpointing"]]
    (tmp_path / "step_trace.json").write_text(json.dumps({"traces": plain}))
    monkeypatch.setattr(step_model, "TRACES", tmp_path / "step_trace.json")
    code, out, _ = preflight(capsys, "--set", on, "--set", "parallel.checkpoint_every=1", job=job)
    assert code == 0 and "measured   bench/bench_full_size_plan.py" in out
    assert [line for line in out.splitlines() if "step range" in line] == [
        "  step range       none: step_trace.json has no trace of Qwen2.5-1.5B chat seq_len = 2048, micro_batch_size = 2, "
        "activation_checkpointing = true; `.venv/bin/python bench/bench_step_model.py --trace` records the micro "
        "batches of its PLANS"]
    assert "USD over this range" not in out


def test_a_bad_calibration_stops_the_preflight_in_one_line(capsys, monkeypatch, tmp_path):
    from raytrain_eks.planning import gpu_figures

    bad = tmp_path / "gpu_calibration.json"
    bad.write_text('{"gpu": "L4", "gemm": [], "memory_gbytes_per_s": 250}')
    monkeypatch.setattr(gpu_figures, "CALIBRATION", bad)
    code, _, err = preflight(capsys, job=str(ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml"))
    assert code == 2
    assert err == f"error: {bad}: gemm = []: must be a non-empty list of {{m, n, k, tflops}}\n"


def test_submit_hands_the_shipped_finetune_its_predicted_exposed_communication():
    """``submit``'s prediction for the run (``_inputs/<run>.json``, recorded in run.json as
    ``exposed_comm``): the preflight's step range's collective terms, labelled ``predicted``;
    a CPU job has no step range and gets none."""
    from charts.jobs import plan_job
    from raytrain_eks.runs.submit import step_prediction
    from raytrain_eks.planning.step_model import exposed_comm

    env = load_environment(ENV)
    job = plan_job(env, ROOT / "jobs" / "finetune-qwen2.5-1.5b.toml", ROOT).config
    plan = run_preflight(env, job, dist_dir="/nonexistent-dist")
    handed = step_prediction(plan)
    assert handed == exposed_comm(plan.measured["range"]) and handed["label"] == "predicted"
    assert 0 < handed["share"][0] <= handed["share"][1] < 1
    local = plan_job(env, ROOT / "jobs" / "local.toml", ROOT).config
    assert step_prediction(run_preflight(env, local, dist_dir="/nonexistent-dist")) is None


SEVEN_B = ("--set", "model.path=s3://bucket/models/Qwen2.5-7B-Instruct")


def test_a_full_fine_tune_that_does_not_fit_is_told_offload_or_lora_and_each_then_passes(capsys):
    code, _, err = preflight(capsys, *SEVEN_B)
    assert code == 2, err
    assert "set parallel.cpu_offload = true (~" in err and "GiB host memory per node)" in err, err
    assert 'add [[model.transforms]] name = "lora" (adapters only; ~' in err, err
    code, out, err = preflight(capsys, *SEVEN_B, "--set", 'model.transforms=[{name = "lora"}]')
    assert code == 0 and "PASS  memory" in out and "host memory" not in out, err
    # 200 offloaded steps take ~250 min at the slow end (71 s/step): past the default deadline,
    # which the deadline check refuses on its own (test_a_run_its_deadline_cannot_hold_...)
    code, out, err = preflight(capsys, *SEVEN_B, "--set", "parallel.cpu_offload=true",
                               "--set", "rayjob.active_deadline_minutes=300")
    assert code == 0 and "PASS  memory" in out, err
    assert "PASS  host memory       parallel.cpu_offload keeps parameters, gradients and AdamW state in host memory" in out
    assert "per node (4 workers) of the 160 GiB one worker pod may use (g6.12xlarge); it saves ~" in out


def test_the_offload_measurement_is_found_for_offload_jobs_only():
    """The published 7B full-shard plan (bench/bench_offload_transfer.py --publish) has a row with
    ``cpu_offload``: its GPU share and host memory are what the preflight sizes the job with."""
    from raytrain_eks.planning.measured_plan import PCIE_GBYTES_PER_S, for_job, offload_copy_bytes

    job = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct"])
    offload = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct", "parallel.cpu_offload=true"])
    plain, moved = for_job(job, QWEN2_5_7B, "g6.12xlarge"), for_job(offload, QWEN2_5_7B, "g6.12xlarge")
    assert "offload" not in plain and plain["host_bytes_per_gpu"] == 0
    o = moved["offload"]
    assert moved["required_bytes"] < usable_bytes(24) < plain["required_bytes"]
    staged_and_rounded = o["checkpoint_staging_bytes"] + o["pinned_rounding_bytes"]
    assert moved["host_bytes_per_gpu"] == o["host_peak_bytes"] + staged_and_rounded
    p = moved["prediction"]
    assert p["offload_copy_s"] == pytest.approx(offload_copy_bytes(moved, p["grad_accum_steps"]) / (PCIE_GBYTES_PER_S * 1e9),
                                                abs=1e-3)
    lora = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct", 'model.transforms=[{name = "lora"}]'])
    assert for_job(lora, QWEN2_5_7B, "g6.12xlarge") is None  # measured training the whole model


def test_offload_moves_the_sharded_terms_to_the_host_by_hand():
    """The hand model where no measurement exists: parameters, gradients and AdamW state leave the
    GPU; the host holds them, the foreach step's temporary, a checkpoint's staged copy and the
    pinned allocator's rounding (tests/raytrain_eks/planning/test_offload_host_memory.py)."""
    from raytrain_eks.planning.memory_estimate import _offloaded_shards, pinned_rounding

    kw = dict(strategy="full_shard", world_size=8, workers_per_node=4, seq_len=2048, micro_batch_size=1,
              activation_checkpointing=True, grad_accum_steps=8)
    on, off = estimate_memory(QWEN2_5_7B, cpu_offload=True, **kw), estimate_memory(QWEN2_5_7B, **kw)
    n = QWEN2_5_7B.num_params()
    assert on.parameters == on.gradients == on.optimizer == 0 and off.host == 0
    assert on.total == off.total - off.parameters - off.gradients - off.optimizer
    rounding = pinned_rounding(_offloaded_shards(QWEN2_5_7B, 8, 4, full=True))
    assert abs(on.host - (4 + 4 + 8 + 4 + 4 + 8) * n / 8 - rounding) < 8  # 3 terms, the temporary, the staged copy


@pytest.mark.parametrize("options", [{}, {"rank": 4, "targets": ["q_proj", "v_proj", "down_proj"]}])
def test_the_lora_hand_count_is_what_the_jobs_transform_trains(options):
    """Oracle: the job's own transform (training/model_transforms/lora.py) on a tiny Qwen2 with
    GQA and a head size other than hidden / heads; its trainable parameters are the count the
    planner sizes LoRA with."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from raytrain_eks.planning.memory_estimate import lora_adapter_params
    from training.model_transforms import lora

    config = dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=torch.float32)
    lora.apply(model, options)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_adapter_params(ModelShapes.from_hf_config(config), options) == trained


FAMILY = sorted((ROOT / "jobs" / "family").glob("*.toml"))


@pytest.mark.parametrize("job", FAMILY, ids=[p.stem for p in FAMILY])
def test_each_family_job_fits_two_g6_12xlarge_as_shipped(capsys, job):
    """The Qwen2.5 family's shipped jobs (jobs/family/), each with its model's published
    config.json where the job names it: the preflight passes on the spec's 2 x g6.12xlarge, its
    memory and host-memory checks included, with nothing set from outside the file. (The 14B
    LoRA job with ``model.dtype = "auto"`` failed here: every worker loads the model in fp32
    before the transform casts it, 4 x 55 GiB of host memory.)"""
    code, out, err = preflight(capsys, job=str(job))
    assert code == 0, err
    assert "PASS  memory" in out and "verdict    OK" in out, out
    # sized by its own measured plan (bench/bench_full_size_plan.py --jobs), not the hand formula
    assert "GiB per GPU (measured)" in out and "measured   bench/bench_full_size_plan.py" in out, out
    # each takes the planner's own advice; the offload job's full shard too: hybrid shard would be
    # faster on the GPU but hold each node's state over 4 GPUs, twice the host memory, past the pod's
    assert "NOTE  strategy" not in out, out
    assert "PASS  deadline" in out, out


def test_a_run_its_deadline_cannot_hold_at_the_slow_end_is_refused_with_the_fix(capsys):
    """The 7B offload job as it first shipped (1000 steps of 86-150 s): the steps alone are 24-42 h
    against its 600-minute deadline, which KubeRay never retries (v1.7.0 rayjob_controller.go
    ``checkBackoffLimitAndUpdateStatusIfNeeded``). The preflight said OK; now it refuses in one
    line and names the three fixes, computed from the slow end."""
    job = str(ROOT / "jobs" / "family" / "finetune-qwen2.5-7b-offload.toml")
    code, out, err = preflight(capsys, "--set", "train.max_steps=1000", job=job)
    assert code == 2 and "FAIL  deadline" in out and "verdict    REFUSED" in out, out
    line = err.strip().splitlines()[-1]
    # the plan search's range of the job's own plan: the offload copies and AdamW on the host's
    # threads included (raytrain_eks/planning/plan_search.py host_terms)
    assert "at the slow end of its predicted step (150.27 s/step" in line, line
    assert "set train.max_steps <= " in line and "rayjob.active_deadline_minutes >= " in line and "chain" in line
    most = int(line.split("set train.max_steps <= ")[1].split(",")[0])
    code, out, _ = preflight(capsys, "--set", f"train.max_steps={most}", job=job)
    assert code == 0 and "PASS  deadline" in out, out  # the named fix is enough
    code, out, _ = preflight(capsys, "--set", f"train.max_steps={most + 5}", job=job)
    assert code == 2 and "FAIL  deadline" in out, out  # and it is the most that fits


def test_a_lora_measurement_is_found_only_for_the_same_lora_settings():
    """bench/bench_full_size_plan.py --jobs records ``lora_key`` of the options it measured with;
    a job finds that row only with the same rank, targets, dropout and base dtype (alpha only
    scales), and a full fine-tune never finds it."""
    from raytrain_eks.planning.measured_plan import lookup, lora_key

    plan = dict(model="Qwen2.5-7B", strategy="hybrid_shard", seq_len=2048, micro_batch_size=1,
                activation_checkpointing=True)
    row = {"code": "after", "reduce_dtype": "float32", "keep_gathered": False, **plan,
           "lora": lora_key({"rank": 16, "alpha": 32, "dropout": 0.05})}
    assert lookup([row], **plan, lora=lora_key({"rank": 16, "alpha": 8, "dropout": 0.05})) is row
    assert lookup([row], **plan, lora=lora_key({"rank": 8, "dropout": 0.05})) is None
    assert lookup([row], **plan, lora=lora_key({"rank": 16, "dropout": 0.05, "targets": ["q_proj"]})) is None
    assert lookup([row], **plan) is None


def test_the_7b_lora_dpo_job_fits_with_the_lora_jobs_memory_and_a_third_more_compute(capsys, monkeypatch):
    """DPO through LoRA keeps no second copy (its reference is the model with the adapters off)
    and saves no reference activations (no_grad): the LoRA job's measured memory. Its step runs
    the reference's forward too: 4/3 the model FLOPs per trained token, in both the hand model and
    the traced range."""
    from raytrain_eks.planning.memory_estimate import estimate_for_job
    from raytrain_eks.planning.step_model import estimate_time

    monkeypatch.chdir(ROOT)
    code, out, err = preflight(capsys, job="jobs/family/dpo-lora-qwen2.5-7b.toml")
    assert code == 0, err
    assert "verdict    OK" in out and "GiB per GPU (measured)" in out, out
    from training.config import WorldSize

    env = load_environment(ENV)
    world = WorldSize(num_workers=8, workers_per_node=4)  # as the charts size them on 2 x g6.12xlarge
    dpo = load_job_config("jobs/family/dpo-lora-qwen2.5-7b.toml", world=world)
    sft = load_job_config("jobs/family/lora-qwen2.5-7b.toml", world=world)
    assert estimate_for_job(dpo, QWEN2_5_7B).total == estimate_for_job(sft, QWEN2_5_7B).total
    ratio = estimate_time(env, dpo, QWEN2_5_7B, 0.4)["compute_s"] / estimate_time(env, sft, QWEN2_5_7B, 0.4)["compute_s"]
    assert ratio == pytest.approx(4 / 3)
    full = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct", "train.objective=dpo",
                                       "data.kind=preference", "data.path=training/assets/demo_corpus/preference"])
    plain = load_job_config(REFERENCE, ["model.path=s3://bucket/Qwen2.5-7B-Instruct"])
    # a full fine-tune's DPO keeps a frozen copy, sharded like the parameters
    assert estimate_for_job(full, QWEN2_5_7B).reference == estimate_for_job(plain, QWEN2_5_7B).parameters > 0


def test_an_elastic_job_is_planned_at_every_size_between_its_bounds(capsys):
    # min_nodes 1 of 2: the plan at 1 node (4 GPUs, twice the micro batches) and at 2, each
    # with its memory per GPU and its step; the global batch is the same at both
    code, out, err = preflight(capsys, "--set", "parallel.min_nodes=1")
    assert code == 0, err
    sizes = [line for line in out.splitlines() if "elastic size" in line]
    assert len(sizes) == 2
    assert "1 node(s), 4 GPUs, 8 micro batches per GPU" in sizes[0] and "2 node(s), 8 GPUs, 4 micro batches" in sizes[1]
    memory = [float(line.split(": ~")[1].split(" GiB")[0]) for line in sizes]
    assert memory[0] > memory[1]  # half the shards: more per GPU


def test_an_elastic_size_that_does_not_fit_refuses_the_job_in_one_line(capsys):
    # Qwen2.5-3B full shard at seq 8192 fits 8 L4s (~18.6 GiB each), not 4 (~24.9): after a
    # lost node the run could not go on at 1 node
    fits_at_two = ("--set", "model.path=s3://{bucket}/models/Qwen2.5-3B-Instruct", "--set",
                   "parallel.activation_checkpointing=true", "--set", "train.seq_len=8192")
    code, out, err = preflight(capsys, *fits_at_two)
    assert code == 0, err
    code, out, err = preflight(capsys, *fits_at_two, "--set", "parallel.min_nodes=1")
    assert code == 2 and err.count("\n") == 1
    assert "parallel.min_nodes = 1 allows 1 node(s), 4 GPUs" in err and "raise parallel.min_nodes above 1" in err


def test_on_a_spot_group_the_preflight_says_whether_the_checkpoint_fits_the_notice(capsys, tmp_path):
    import tomllib

    from toml_writer import toml_text

    raw = tomllib.loads(Path(ENV).read_text())
    raw["gpu_node_groups"][0].update(capacity="spot", instance_types=["g5.12xlarge"])
    spot = tmp_path / "environment.toml"
    spot.write_text(toml_text(raw))
    code = main(["preflight", "--env", str(spot), "--job", REFERENCE, "--dist", "/nonexistent-dist"])
    out = capsys.readouterr().out
    assert code == 0
    [line] = [line for line in out.splitlines() if "spot notice" in line]
    # Qwen2.5-1.5B full shard over 2 nodes: 1.54 B x 12 bytes / 2 = 9.3 GB per node
    assert "~9.3 GB per node takes ~46-9 s" in line and "the notice leaves 90 s: it fits" in line
    # the on-demand spec says nothing of a notice
    main(["preflight", "--env", ENV, "--job", REFERENCE, "--dist", "/nonexistent-dist"])
    assert "spot notice" not in capsys.readouterr().out
