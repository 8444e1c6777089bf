"""`raytrain-eks submit jobs/local.toml --local`: one command from a job file to the verdict, the
report and a model that loads.

The local backend is the demo's: moto's S3 server and a real Ray head on 127.0.0.1 with token
auth; the RayJob is synthesized for this run (its own name, the user's --set in its entrypoint),
its entrypoint and runtimeEnvYAML submitted with `ray job submit`, as KubeRay's submitter does.
The session's one local run (``local_run`` in tests/conftest.py: the local job shortened with
--set) backs every assertion below.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from shared_run import LOCAL_RUN_SETS
from left_running import left_running

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("local_run")]


@pytest.fixture
def submitted(local_run):
    return local_run


def test_one_command_ends_in_the_verdict_and_its_exit_code(submitted):
    out, proc = submitted
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    run = re.search(r"^run (local-\d{4}-\d{6}): new, job local", proc.stdout, re.M)
    assert run, proc.stdout[:2000]
    assert "    verdict:   ACCEPTED: " in proc.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["verdict"]["verdict"] == "accepted"
    # a clean run on Ray records no incident, and its checkpoints at every 5 steps (the last one's
    # included); tests/e2e/test_chaos.py's uninterrupted reference (no Ray) relies on this proof
    assert record["incidents"] == [], record["incidents"]
    assert [c["step"] for c in record["checkpoints"]] == [5, 10], record["checkpoints"]
    # the run is named uniquely: its storage directory and its RayJob carry the name
    assert record["job_config"]["checkpoint"]["run_name"] == run.group(1)
    assert record["run_dir"].endswith(f"/{run.group(1)}")
    manifest = next(d for d in yaml.safe_load_all((out / "manifests" / f"rayjob-{run.group(1)}.k8s.yaml").read_text()) if d)
    assert manifest["metadata"]["name"] == run.group(1)
    # the user's --set travel in the entrypoint, in order, before the environment's overrides
    argv = shlex.split(manifest["spec"]["entrypoint"])
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    assert sets[:len(LOCAL_RUN_SETS)] == list(LOCAL_RUN_SETS) and len(sets) > len(LOCAL_RUN_SETS), sets
    assert record["job_config"]["train"]["report_every_n_steps"] == 3
    assert record["job_config"]["train"]["max_steps"] == 10
    ran = json.loads((out / "ray_job.json").read_text())
    assert ran["status"] == "SUCCEEDED" and ran["entrypoint"] == manifest["spec"]["entrypoint"]


def test_the_report_is_rendered(submitted):
    out, proc = submitted
    report = out / "report" / "report.md"
    assert report.is_file() and (out / "report" / "loss.png").stat().st_size > 1000
    assert "ACCEPTED" in report.read_text().upper()
    assert f"report:    {report}" in proc.stdout


def test_the_exported_model_loads_and_generates(submitted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, proc = submitted
    model_dir = out / "hf"
    assert f"model:     {model_dir}" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("The cluster", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == ids.shape[1] + 4
    assert model.config.hidden_size == 64 and model.config.vocab_size == 151936


def test_the_tensorboard_events_come_with_the_run_and_hold_metrics_jsonl(submitted):
    """Rank 0's event file (mirrored to S3 by the Ray worker) and the driver's verdict file,
    copied out by submit, read with TensorBoard's own reader (tests/tracking_venv.py)."""
    from tracking_venv import expected_scalars, last_by_step, read_events

    from training.contract import TENSORBOARD_DIR
    from training.metric_sinks.tensorboard import ACCEPTED_TAG, TEXT_SUFFIX, VERDICT_TAG

    out, _ = submitted
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = read_events(out / TENSORBOARD_DIR)
    scalars = {tag: last_by_step(points) for tag, points in events["scalars"].items() if tag != ACCEPTED_TAG}
    assert scalars == expected_scalars(rows) and [s for s, _ in scalars["train/loss"]] == list(range(1, 11))
    assert events["text"][VERDICT_TAG + TEXT_SUFFIX][0][1].startswith("ACCEPTED")


def test_the_driver_and_worker_logs_reach_storage(submitted):
    out, _ = submitted
    index = json.loads((out / "logs" / "index.json").read_text())
    assert (out / "logs" / "driver.log").is_file(), index
    assert "verdict" in (out / "logs" / "driver.log").read_text()
    assert any(Path(name).name.startswith("worker-") for name in index["copied"]), index


def test_every_run_prints_no_preemption_watcher_error(submitted):
    _, proc = submitted
    assert "PreemptionWatcher" not in proc.stdout + proc.stderr


def test_nothing_is_left_running(submitted):
    out, _ = submitted
    assert left_running(out) == {}
