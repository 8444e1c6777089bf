"""The local DPO job (jobs/local-dpo.toml) end to end from the unpacked code archive, in a venv
holding ONLY the DLC's package set (tests/bare_runtime.py ``DLC_RUNTIME``: no peft, trl or
lm_eval), as a worker runs it: one process (the driver and the worker of training/launch.py
``run_in_process``) storing on the session's moto S3, SIGKILLed from outside once its step-5
checkpoint is complete while the store holds the step-10 upload (tests/outside_fault.py, as the
LoRA run's fault test), a resume from the checkpoint at step 5, and an unfaulted run beside it. The resumed run must equal the unfaulted one bit for bit (losses,
rewards and the export's hash); the run is ACCEPTED on its held-out reward accuracy, run.json
records the objective and the benchmark scores before and after, and the export loads with
``from_pretrained``."""
from __future__ import annotations

import json
import os
import subprocess
import zipfile

import pytest

from bare_runtime import DLC_RUNTIME, _clean_environ, make_runtime
from fixtures_s3 import s3_bucket, s3_server  # noqa: F401  (the session's store)
from outside_fault import download, killed_after_checkpoint

pytestmark = pytest.mark.slow  # three short DPO trainings of the demo model in subprocesses

_RUN = """
import json, sys
from training.config import load_job_config
from training.launch import run_in_process
from training.loop import local_context

local, store, resume = sys.argv[1:4]
job = load_job_config("jobs/local-dpo.toml", ["parallel.num_workers=1", "parallel.workers_per_node=1",
                                              "train.global_batch_size=4", "eval.max_batches=3",
                                              "eval.benchmark_max_questions=4",
                                              f"checkpoint.storage_path={store}", "checkpoint.export_hf=true"])
record = run_in_process(job, local_context(local, run_dir=f"{store}/{job.run_name}"), resume_from=resume)
print(json.dumps({k: record.get(k) for k in ("status", "exports", "error", "verdict", "objective", "benchmarks", "eval")}))
"""


def _run(python, wd, tmp_path, name, s3_server, store, resume="", fault=False):  # noqa: F811
    # one intra-op thread, as Ray sets it for a worker of one CPU (ray 2.58 ``ray/_private/utils.py``
    # ``set_omp_num_threads_if_unset``); torch's default of one per core spins against the
    # other processes of a loaded 2-core machine
    env = {**_clean_environ(), **s3_server.ray_env_vars, "OMP_NUM_THREADS": "1"}
    (tmp_path / name).mkdir(exist_ok=True)
    argv = [str(python), "-c", _RUN, str(tmp_path / name), f"{store}/{name}", resume]
    if fault:  # the step-5 checkpoint complete, the step-10 upload held: then SIGKILL
        return killed_after_checkpoint(argv, store=s3_server.store, run_uri=f"{store}/{name}/local-dpo", saved_step=5,
                                       held=f"/{name}/local-dpo/checkpoint_00000010/", cwd=wd, env=env)
    return subprocess.run(argv, cwd=wd, env=env, capture_output=True, text=True, timeout=1500)


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: r[k] for k in ("loss", "rewards_accuracy", "rewards_margin")}
            for r in rows if r.get("kind") == "train"}


def test_the_dpo_job_runs_from_the_archive_on_the_dlc_packages_resumes_bit_identically_and_exports(
        s3_server, s3_bucket, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    from charts.code_bundle import build_code_bundle
    from test_data_support import ROOT

    with zipfile.ZipFile(build_code_bundle(ROOT, tmp_path / "dist").path) as zf:
        zf.extractall(tmp_path / "wd")
    wd = tmp_path / "wd"
    python = make_runtime(tmp_path / "dlc", DLC_RUNTIME)
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in ('peft', 'trl', 'lm_eval') "
                                              "if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"

    store = f"{s3_bucket}/{tmp_path.name}"
    faulted = _run(python, wd, tmp_path, "a", s3_server, store, fault=True)
    assert faulted.returncode == -9, faulted.stderr[-3000:]  # killed, not ended
    resumed = _run(python, wd, tmp_path, "a", s3_server, store, resume=f"{store}/a/local-dpo/checkpoint_00000005")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    clean = _run(python, wd, tmp_path, "b", s3_server, store)
    assert clean.returncode == 0, clean.stderr[-3000:]
    first, second = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (resumed, clean))

    # bit-identical after the resume: DPO's loss and rewards step by step, and the export
    after, reference = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert {s: after[s] for s in range(6, 11)} == {s: reference[s] for s in range(6, 11)}
    assert first["exports"]["full"]["sha256"] == second["exports"]["full"]["sha256"]

    # the verdict: above chance on the held-out pairs, as [accept] declares
    assert first["verdict"]["verdict"] == "accepted", first["verdict"]
    (criterion,) = [c for c in first["verdict"]["criteria"] if c["criterion"] == "rewards_accuracy_min"]
    assert criterion["measured"] > 0.5 and criterion["required"] == 0.75
    assert first["eval"]["before"]["eval_rewards_accuracy"] == 0.0  # policy = reference: every reward is 0
    assert first["objective"] == {"name": "dpo", "beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0}
    for side in ("before", "after"):  # kept through the resume: the base model's scores are measured once
        assert first["benchmarks"][side]["tasks"]["tiny-arith"]["questions"] == 4
    assert first["benchmarks"] == second["benchmarks"]

    from raytrain_eks.runs.results import s3_client

    model = AutoModelForCausalLM.from_pretrained(download(s3_client(s3_server.ray_env_vars),
                                                          first["exports"]["full"]["uri"], tmp_path / "full"))
    assert model.config.hidden_size == 64
