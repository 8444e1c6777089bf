"""The pipeline's Smoke waits in Kueue's queue behind a user's long GPU job, and its deadline
counts from the admission, not from the apply: KubeRay's own deadlines do (``ray-project/kuberay``
``ray-operator/v1.7.0`` ``rayjob_controller.go:887-917``: ``startTime`` is set when the unsuspended
RayJob starts again from New), and Kueue admits by unsuspending (``kubernetes-sigs/kueue``
``v0.19.2`` ``pkg/controller/jobframework/reconciler.go:621-651``).

The Smoke step runs as the buildspec runs it (``python -m raytrain_eks.pipeline smoke``'s
``main``, in this process) against the walk-through's world (walk_env.py: the synthesized
manifests, moto, the pipeline's fake kubectl with the kubectl double's Kueue), on a simulated
clock that moves only when the step sleeps between polls: the waits are counted in polls, never
in this machine's seconds.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from walk_env import make_walk

import raytrain_eks.pipeline.smoke as smoke_module
from raytrain_eks.pipeline.__main__ import main

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "efa-full"
TIMEOUT_POLLS = 8
"""The smoke's deadline (TIMEOUT_SECONDS at one second per poll): ample for the smoke job itself."""
LONG_JOB_POLLS = 3 * TIMEOUT_POLLS
"""How long the user's job holds the GPUs after the smoke is applied: far past that deadline."""


class PollClock:
    """``time`` as the smoke step sees it: the clock moves by what the step sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def walk(tmp_path, aws, registry, monkeypatch):
    w = make_walk(tmp_path, aws, registry, RECORD)
    w.digest = w.push_image(b"image A\n")
    w.scenario(smoke_result="SUCCEEDED")
    for key, value in {**w.environ, "POLL_SECONDS": "1", "TIMEOUT_SECONDS": str(TIMEOUT_POLLS),
                       "QUEUE_TIMEOUT_SECONDS": str(10 * LONG_JOB_POLLS)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(smoke_module, "time", PollClock())
    return w


def _smoke(walk, monkeypatch, run) -> int:
    monkeypatch.chdir(run.dir)
    monkeypatch.setenv("EXECUTION_ID", run.id)
    monkeypatch.setenv("CODEBUILD_BUILD_NUMBER", "1")
    return main(["smoke", "--digest", run.digest])


def _state(walk) -> dict:
    return json.loads((walk.kube / "state.json").read_text())


def test_smoke_queued_behind_a_long_job_longer_than_its_deadline_still_passes(walk, monkeypatch, capsys):
    assert walk.env.queueing.enabled  # the shipped spec queues every RayJob that brings its own cluster
    run = walk.Execution("exec-1", walk.digest)
    run.synth()
    # given a user's fine-tune holding every GPU of the queue (admitted while the queue was empty)
    finetune = walk.submit_gpu_job(run.dir / "dist" / "rayjob-finetune-qwen.k8s.yaml", LONG_JOB_POLLS)
    assert _state(walk)["rayjobs"][finetune]["status"]["jobDeploymentStatus"] == "Running"

    # when the Smoke stage runs its smoke RayJob
    code = _smoke(walk, monkeypatch, run)
    out, err = capsys.readouterr()

    # then it waited in the queue behind the fine-tune, past its own deadline, and passed
    assert code == 0, err
    queued = next(line for line in err.splitlines() if line.startswith("smoke: queued: 1 of 1 in Kueue's queue"))
    assert f"behind {finetune} (admitted)" in queued and "priority short" in queued, queued
    admitted = next(line for line in err.splitlines() if line.startswith("smoke: admitted by Kueue after"))
    waited = int(admitted.split(" after ")[1].split(" s ")[0])
    assert waited > TIMEOUT_POLLS, admitted
    state = _state(walk)
    assert state["rayjobs"][finetune]["status"]["jobDeploymentStatus"] == "Complete"
    assert state["rayjobs"]["smoke"]["status"]["jobDeploymentStatus"] == "Complete"
    assert walk.read_json(out.strip())["image_ran"]["pods"]


def test_smoke_that_is_never_admitted_gives_up_at_the_queue_bound_and_leaves_no_job(walk, monkeypatch, capsys):
    run = walk.Execution("exec-2", walk.digest)
    run.synth()
    finetune = walk.submit_gpu_job(run.dir / "dist" / "rayjob-finetune-qwen.k8s.yaml", 10 ** 6)
    monkeypatch.setenv("QUEUE_TIMEOUT_SECONDS", str(LONG_JOB_POLLS))

    code = _smoke(walk, monkeypatch, run)
    err = capsys.readouterr().err

    assert code == 1
    assert f"was not admitted by Kueue within {LONG_JOB_POLLS} s (QUEUE_TIMEOUT_SECONDS); deleted it" in err, err
    assert f"behind {finetune} (admitted)" in err
    state = _state(walk)
    assert "smoke" not in state["rayjobs"] and state["rayjobs"][finetune]["status"]["jobDeploymentStatus"] == "Running"
    # its Workload went with it (owner reference): nothing of the smoke is left in the queue
    assert [w["metadata"]["ownerReferences"][0]["name"] for w in state["workloads"].values()] == [finetune]
