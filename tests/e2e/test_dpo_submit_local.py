"""`raytrain-eks submit jobs/local-dpo.toml --local` with a worker killed mid-run: the local DPO job
from the job file to the verdict on moto's S3 server and a real Ray head on 127.0.0.1 (the
local backend of `submit --local`), its RayJob's own entrypoint and code archive.

The fault is the demo's (`make demo FAULT=1`, devtools/demo.py), from outside the job: the
submit goes to a local head this test started (a warm head, ``RAYTRAIN_LOCAL_HEAD``) over its
own moto store, and once Ray Train has registered the step-5 checkpoint and metrics.jsonl in the
store holds step 6, the test SIGKILLs one Ray Train worker process. Until then the store holds
the step-10 upload (devtools/strike.py), so the run can neither save a newer checkpoint nor end
before the kill, however far it got. Ray Train restarts the workers, the run resumes from the
checkpoint of step 5. The steps trained both before the fault and after the resume must be
bit-identical (DPO's loss and rewards), run.json must record the incident (``worker_lost``: an
outside SIGKILL of a worker on a node that stays up, training/watchdog.py ``classify``), the run
must end ACCEPTED on its held-out reward accuracy (above chance), and the export must load with
``from_pretrained``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ray_session import TEST_ENV

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


SAVED, LOGGED, HELD = 5, 6, 10
"""The checkpoint registered before the kill, the step metrics.jsonl holds by then (so a step is
redone after the resume), and the checkpoint whose upload is held until the kill."""


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    from devtools.slow_store import slow_store
    from devtools.strike import Strike, logged_step, ray_train_workers, registered
    from environment import load_environment
    from raytrain_eks.backends.local import RUNS_DIR
    from raytrain_eks.backends.local_services import LOCAL_CPUS, ray_head
    from raytrain_eks.backends.warm_head import LOCAL_HEAD_ENV, _write_warm
    from raytrain_eks.runs.results import s3_client
    from training.checkpointing.manager import checkpoint_dir_name

    user = tmp_path_factory.mktemp("dpo-user")
    storage = load_environment(ROOT / "environment.toml").storage_uri
    # Ray Train's controller polls fast on the run's head (tests/ray_session.py TEST_ENV)
    # Ray's memory monitor off on this head, as tests/e2e/test_chaos.py NO_HOST_OOM_KILLS says why: it
    # reads the shared machine's memory, and a worker it kills would be a second incident no one injected
    head_env = {**TEST_ENV, "RAY_memory_monitor_refresh_ms": "0"}
    with slow_store(None) as store, ray_head(num_cpus=LOCAL_CPUS, env={**store.client_env, **head_env}) as head:
        _write_warm(user / "head.json", head, store.endpoint_url)
        env = {**os.environ, **TEST_ENV, LOCAL_HEAD_ENV: str(user / "head.json")}
        argv = [sys.executable, "-m", "raytrain_eks.cli", "submit", str(ROOT / "jobs" / "local-dpo.toml"), "--local",
                "--env", str(ROOT / "environment.toml"), "--set", "eval.benchmark_max_questions=4"]
        s3, printed = s3_client(store.client_env), user / "submit.out"

        def run_uri() -> str | None:
            named = re.search(r"^run (\S+): new,", printed.read_text(), re.M)
            return f"{storage}/{named.group(1)}" if named else None

        def ready() -> bool:
            uri = run_uri()
            return bool(uri) and registered(s3, uri) == checkpoint_dir_name(SAVED) and logged_step(s3, uri) >= LOGGED

        def kill() -> int:
            worker = ray_train_workers(head.dashboard_url, head.auth_token)[-1]
            os.kill(worker.pid, signal.SIGKILL)
            return worker.pid

        with printed.open("w") as stdout:
            proc = subprocess.Popen(argv, cwd=user, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
            try:
                with Strike(store, held=f"/{checkpoint_dir_name(HELD)}/", ready=ready, fault=kill,
                            what=f"{checkpoint_dir_name(SAVED)} registered and step {LOGGED} logged"):
                    _, stderr = proc.communicate(timeout=2400)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    proc = subprocess.CompletedProcess(argv, proc.returncode, printed.read_text(), stderr)
    named = re.search(r"^run (\S+): new,", proc.stdout, re.M)
    out = RUNS_DIR / (named.group(1) if named else "the-submit-named-no-run")
    yield out, proc
    shutil.rmtree(out, ignore_errors=True)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_dpo_job_ends_accepted_above_chance(dpo_run):
    out, proc = dpo_run
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "    verdict:   ACCEPTED: " in proc.stdout
    record = json.loads((out / "run.json").read_text())
    (criterion,) = [c for c in record["verdict"]["criteria"] if c["criterion"] == "rewards_accuracy_min"]
    assert criterion["met"] and criterion["measured"] > 0.5
    assert record["objective"]["name"] == "dpo" and record["objective"]["beta"] == 0.1
    assert record["benchmarks"]["before"]["tasks"]["tiny-arith"]["questions"] == 4
    assert "## Benchmarks" in (out / "report" / "report.md").read_text()


def test_the_resume_through_the_fault_is_bit_identical(dpo_run):
    out, proc = dpo_run
    rows = _rows(out)
    summary = [r for r in rows if r.get("kind") == "summary"][-1]
    assert summary["resumed_from"] and summary["steps"] == 10
    by_step: dict[int, list[tuple]] = {}
    for r in rows:
        if r.get("kind") == "train":
            by_step.setdefault(r["step"], []).append((r["loss"], r["rewards_accuracy"], r["rewards_margin"]))
    assert sorted(by_step) == list(range(1, 11))
    redone = {s: v for s, v in by_step.items() if len(v) > 1}
    assert set(range(SAVED + 1, LOGGED + 1)) <= set(redone), by_step  # logged before the kill, and again after
    for step, values in redone.items():
        assert len(set(values)) == 1, f"step {step} differs after the resume: {values}"


def test_the_outside_kill_is_recorded_as_a_lost_worker(dpo_run):
    # a SIGKILLed worker process on a node that stays up: Ray Train sees its actor die
    out, _ = dpo_run
    record = json.loads((out / "run.json").read_text())
    (entry,) = record["incidents"]
    assert entry["kind"] == "worker_lost" and len(entry["ranks"]) == 1, entry
    # the step-5 checkpoint was the newest registered (the step-10 upload was held)
    assert entry["resumed_from_step"] == SAVED and entry["step"] >= LOGGED, entry
    assert entry["steps_lost"] == entry["step"] - SAVED and entry["progress_again_s"] > 0, entry
    assert record["verdict"]["incidents"] == 1


def test_the_export_loads(dpo_run):
    from transformers import AutoModelForCausalLM

    out, _ = dpo_run
    model = AutoModelForCausalLM.from_pretrained(out / "hf")
    assert model.config.hidden_size == 64
