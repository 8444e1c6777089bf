"""End to end, as `make demo FAULT=1` runs it: the local RayJob's own entrypoint and runtime env,
read from the synthesized manifest, submitted with `ray job submit` to a real local Ray head, with
moto's S3 server as checkpoint storage; one worker is killed mid-run from outside (the demo's
SIGKILL once a checkpoint is registered, the next upload held) and the run resumes.

One demo run (a few minutes on 2 cores) backs every assertion below. The CloudFormation synth is
skipped here (tests/infra covers it); everything else is the demo's own path. Its manifests go to
a folder of the test's own (``--dist``): a test run leaves the checkout's dist/ alone.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from left_running import left_running
from ray_session import TEST_ENV
from training.config import load_job_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    dist = tmp_path_factory.mktemp("demo-dist")
    # Ray Train's controller polls fast on the demo's head (tests/ray_session.py TEST_ENV)
    proc = subprocess.run([sys.executable, "-m", "devtools.demo", "--skip-cdk", "--fault", "--out", str(out),
                           "--dist", str(dist)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **TEST_ENV})
    (out / "demo.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return out, proc.stdout, dist


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_command_that_ran_is_the_manifests_entrypoint(demo):
    out, _, dist = demo
    ran = json.loads((out / "ray_job.json").read_text())
    manifest = yaml.safe_load_all((dist / "rayjob-local.k8s.yaml").read_text())
    [rayjob] = [d for d in manifest if d and d["kind"] == "RayJob"]
    assert ran["status"] == "SUCCEEDED"
    # byte-identical: what Ray ran, what the manifest says, and what the job saw as its argv
    assert ran["entrypoint"] == ran["manifest_entrypoint"] == rayjob["spec"]["entrypoint"]
    assert ran["manifest_runtime_env_yaml"] == rayjob["spec"]["runtimeEnvYAML"]
    record = json.loads((out / "run.json").read_text())
    assert shlex.split(rayjob["spec"]["entrypoint"])[1:] == record["command"][1:]


def test_run_record_holds_the_evidence(demo):
    out, _, dist = demo
    record = json.loads((out / "run.json").read_text())
    manifest = next(d for d in yaml.safe_load_all((dist / "rayjob-local.k8s.yaml").read_text())
                    if d and d["kind"] == "RayJob")
    labels = manifest["metadata"]["labels"]
    assert record["status"] == "succeeded" and record["exit_code"] == 0 and not record["error"]
    # the code that ran (hashed by the job itself) is the code the manifest names
    assert record["code_hash"] == {"manifest": labels["raytrain.io/code-hash"], "ran": labels["raytrain.io/code-hash"]}
    assert record["spec_hash"] == labels["raytrain.io/spec-hash"]
    assert record["job_config_hash"]["manifest"] == labels["raytrain.io/job-config-hash"]
    assert record["job_config_hash"]["ran"].removeprefix("sha256:").startswith(labels["raytrain.io/job-config-hash"])
    assert record["image"] == manifest["metadata"]["annotations"]["raytrain.io/image"]
    assert record["job_config"]["name"] == "local" and record["is_infrastructure_check"] is False
    assert record["cluster"]["world_size"] == 2
    assert record["transport"]["transport"] == "single-node"
    assert record["versions"]["ray"] == "2.58.0" and record["versions"]["torch"].startswith("2.13.0")
    assert record["throughput"]["tokens_per_s"] > 0
    assert record["checkpoints"] and all(c["stall_s"] >= 0 for c in record["checkpoints"])
    before, after = record["eval"]["before"]["eval_loss"], record["eval"]["after"]["eval_loss"]
    assert after < before
    assert record["start_time"] and record["end_time"] and record["hosts"]


def test_resume_after_the_outside_fault_is_continuous(demo):
    from devtools.demo import fault_step

    out, stdout, _ = demo
    job = load_job_config(ROOT / "jobs" / "local.toml")
    train = [m for m in _metrics(out) if m.get("kind") == "train"]
    summaries = [m for m in _metrics(out) if m.get("kind") == "summary"]
    assert "FAULT" in stdout
    assert summaries and summaries[-1]["steps"] == job.train.max_steps
    assert summaries[-1]["resumed_from"], "the run did not resume from a checkpoint after the fault"
    by_step: dict[int, list[float]] = {}
    for m in train:
        by_step.setdefault(m["step"], []).append(m["loss"])
    assert sorted(by_step) == list(range(1, job.train.max_steps + 1))  # no step skipped
    redone = {s: losses for s, losses in by_step.items() if len(losses) > 1}
    assert redone, "no step was logged both before the fault and after the resume"
    # a step trained before the fault and again after the resume saw the same data and weights
    for step, losses in redone.items():
        assert len(set(losses)) == 1, f"step {step} differs after resume: {losses}"
    # the demo's SIGKILL of a worker process (devtools/demo.py ``_strike``), once the step-5
    # checkpoint was registered and the step-10 upload held: a worker lost on a node that stays up
    # (training/watchdog.py ``classify``), resumed from exactly step 5
    first = json.loads((out / "run.json").read_text())["incidents"][0]
    assert first["kind"] == "worker_lost" and len(first["ranks"]) == 1, first
    assert first["resumed_from_step"] == job.checkpoint.every_n_steps and first["step"] >= fault_step(job), first
    assert first["steps_lost"] == first["step"] - first["resumed_from_step"], first
    assert "FAULT: SIGKILL to worker pid" in stdout


def test_report_and_plots_exist(demo):
    out, stdout, _ = demo
    report = out / "report" / "report.md"
    assert report.is_file() and (out / "report" / "loss.png").stat().st_size > 1000
    assert "held-out loss before" in stdout and "command that ran == manifest entrypoint: True" in stdout


def test_the_jobs_metrics_were_scraped_and_agree_with_metrics_jsonl(demo):
    # the node's metrics endpoint served every rank's per-step gauges during the run (MFU is n/a
    # on CPU), and rank 0's last scraped step and loss are ones metrics.jsonl holds.
    # The evaluation and checkpoint gauges live from their event until the worker exits, which
    # a scrape every 2 s may miss: tests/training/test_metrics_export.py waits for those.
    from training import contract

    out, stdout, _ = demo
    scraped = json.loads((out / "metrics-scrape.json").read_text())
    from devtools.metrics_scrape import EVERY_STEP

    exported = set(contract.PROMETHEUS_METRICS) - {contract.METRIC_MFU}
    assert set(scraped) == {"0", "1"}
    for rank, series in scraped.items():
        assert EVERY_STEP <= set(series) <= exported, (rank, sorted(series))
    step = int(scraped["0"][contract.METRIC_STEP]["value"])
    # a loss metrics.jsonl logged: a scrape is not a transaction, and the last whole one may mix
    # two exports, steps apart (tests/training/test_metrics_export.py says why, and checks the
    # held last step whole and equal)
    losses = [m["loss"] for m in _metrics(out) if m.get("kind") == "train"]
    assert any(m["step"] == step for m in _metrics(out) if m.get("kind") == "train")
    assert any(scraped["0"][contract.METRIC_LOSS]["value"] == pytest.approx(loss, rel=1e-9) for loss in losses)
    assert "Prometheus metrics" in stdout
    assert "Reporting training result" not in stdout  # in Ray Train's log files only


def test_nothing_is_left_running(demo):
    out, _, _ = demo
    assert left_running(out) == {}


def test_the_resumed_runs_report_reads_by_step_and_marks_the_resume(demo):
    # metrics.jsonl holds the steps after the first checkpoint twice (before and after the
    # fault); the report shows each step once, its last write, and names the resume
    from devtools.demo import fault_step
    from raytrain_eks.runs.report import load_run

    out, _, _ = demo
    job = load_job_config(ROOT / "jobs" / "local.toml")
    run = load_run(str(out))
    steps = [r["step"] for r in run.train]
    assert steps == sorted(set(steps)) and run.resumes, run.resumes
    assert all(job.checkpoint.every_n_steps < step <= fault_step(job) + 1 for step in run.resumes), run.resumes
    # the count is what the metrics show (a worker lost to load besides the injected fault is a
    # second, equally valid resume); the note names every one of them
    report = (out / "report" / "report.md").read_text()
    assert f"resumed {len(run.resumes)} time(s), logging again from step {', '.join(map(str, run.resumes))}" in report


def test_the_exported_model_loads_and_generates(demo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _, _ = demo
    model = AutoModelForCausalLM.from_pretrained(out / "hf")
    tokenizer = AutoTokenizer.from_pretrained(out / "hf")
    ids = tokenizer("Checkpoints land in", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3
