"""A LoRA fine-tune of the demo's tiny model end to end, from the unpacked code archive as a
worker runs it: the demo job (jobs/local.toml) with ``[[model.transforms]] name = "lora"``, one
process (the driver and the worker of training/launch.py ``run_in_process``) storing on the
session's moto S3, SIGKILLed from outside once its step-5 checkpoint is complete while the store
holds the upload of its merged export (tests/outside_fault.py: the run's end waits for it, and it
is large, where a LoRA checkpoint holds the small adapter alone), a resume from the checkpoint at step 5, and
both exports: the merged model loads alone with ``from_pretrained``, the adapter loads with
peft 0.18.0 onto the base model, and run.json names and hashes both. The faulted-and-resumed
run must equal an unfaulted one bit for bit (losses and both exports' hashes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (the session's store)
from outside_fault import download, killed_after_checkpoint

pytestmark = pytest.mark.slow  # three short trainings of the demo model in subprocesses

_RUN = """
import json, sys
from training.config import job_config_from_dict, load_job_config
from training.launch import run_in_process
from training.loop import local_context

local, store, resume, tokenizer = sys.argv[1:5]
job = load_job_config("jobs/local.toml", [f"model.tokenizer={tokenizer}", "parallel.num_workers=1",
                                          "parallel.workers_per_node=1", "train.global_batch_size=4",
                                          f"checkpoint.storage_path={store}", "checkpoint.export_hf=true"]).to_dict()
job["model"]["transforms"] = [{"name": "lora", "options": {"rank": 4, "alpha": 8}}]
job = job_config_from_dict(job, "jobs/local.toml")
record = run_in_process(job, local_context(local, run_dir=f"{store}/{job.run_name}"), resume_from=resume)
print(json.dumps({"status": record["status"], "exports": record["exports"], "error": record["error"]}))
"""


def _run(wd, tmp_path, name, store, resume="", fault=None):
    # one intra-op thread, as Ray sets it for a worker of one CPU (ray 2.58 ``ray/_private/utils.py``
    # ``set_omp_num_threads_if_unset``); torch's default of one per core spins against the
    # other processes of a loaded 2-core machine
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    from test_data_support import qwen_tokenizer_dir

    (tmp_path / name).mkdir(exist_ok=True)
    argv = [sys.executable, "-c", _RUN, str(tmp_path / name), f"{store}/{name}", resume, str(qwen_tokenizer_dir())]
    if fault is not None:  # the step-5 checkpoint complete, the export's upload held: then SIGKILL
        return killed_after_checkpoint(argv, store=fault, run_uri=f"{store}/{name}/local", saved_step=5,
                                       held=f"/{name}/local/hf", cwd=wd, env=env)
    return subprocess.run(argv, cwd=wd, env=env, capture_output=True, text=True, timeout=600)


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


def test_a_lora_run_resumes_bit_identically_after_a_fault_and_both_exports_load(s3_server, s3_bucket, tmp_path):  # noqa: F811
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, Qwen2Config

    from charts.code_bundle import build_code_bundle
    from test_data_support import ROOT
    from training.config import load_job_config

    with zipfile.ZipFile(build_code_bundle(ROOT, tmp_path / "dist").path) as zf:
        zf.extractall(tmp_path / "wd")
    wd = tmp_path / "wd"

    from raytrain_eks.runs.results import s3_client

    store, s3 = f"{s3_bucket}/{tmp_path.name}", s3_client(s3_server.ray_env_vars)
    faulted = _run(wd, tmp_path, "a", store, fault=s3_server.store)
    assert faulted.returncode == -9, faulted.stderr[-3000:]  # killed, not ended
    checkpoint = f"{store}/a/local/checkpoint_00000005"
    resumed = _run(wd, tmp_path, "a", store, resume=checkpoint)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # it went on from step 5, the checkpoint named: the step-10 one (too small for the store to
    # hold) may have been complete before the kill, and a restore taking it would redo nothing
    from training.incidents import NOTE_START, read_notes

    starts = [n for n in read_notes(f"{store}/a/local") if n.get("note") == NOTE_START]
    assert [n["resumed_from_step"] for n in starts] == [0, 5], starts
    clean = _run(wd, tmp_path, "b", store)
    assert clean.returncode == 0, clean.stderr[-3000:]
    first, second = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (resumed, clean))
    assert first["status"] == second["status"] == "succeeded", (first, second)

    # bit-identical: the steps after the resume and both exports' content hashes
    after, reference = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert {s: after[s] for s in range(6, 11)} == {s: reference[s] for s in range(6, 11)}
    assert set(first["exports"]) == {"merged", "peft_adapter"}
    assert {k: v["sha256"] for k, v in first["exports"].items()} == {k: v["sha256"] for k, v in second["exports"].items()}
    from raytrain_eks.runs.results import split_uri

    bucket, key = split_uri(f"{store}/a/local/run.json")
    record = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert record["exports"] == first["exports"]

    # the merged model alone, and the adapter on the base model (built as the job builds it:
    # the job's seed, the demo config, frozen in bf16), give the same logits
    job = load_job_config(ROOT / "jobs/local.toml")
    torch.manual_seed(job.train.seed)
    base = AutoModelForCausalLM.from_config(Qwen2Config(**dict(job.model.config)), dtype=torch.float32)
    base = base.to(torch.bfloat16)
    untrained_q = base.model.layers[0].self_attn.q_proj.weight.clone()
    ids = torch.randint(0, 151936, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(download(s3, first["exports"]["merged"]["uri"],
                                                               tmp_path / "merged")).eval()
        adapted = PeftModel.from_pretrained(base, download(s3, first["exports"]["peft_adapter"]["uri"],
                                                           tmp_path / "adapter")).eval()
        torch.testing.assert_close(adapted(input_ids=ids).logits.float(), merged(input_ids=ids).logits.float(),
                                   rtol=2e-2, atol=2e-2)
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight.bfloat16(), untrained_q)  # trained
