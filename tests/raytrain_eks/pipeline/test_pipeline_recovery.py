"""Walk-throughs of how the pipeline recovers, with every stage's own code (walk_env.py: the real
registry, moto, the fake kubectl of KubeRay v1.7.0): a Smoke retried under the same execution
id after its first attempt trained and failed passes; a smoke that waited for busy GPUs is
retried by the watcher on a later tick instead of shelving the digest, up to the bound; an
image failure shelves it; each failure reaches the topic with its reason; Apply waits for the
job running on the long-lived cluster, or defers, and the job finishes untouched.

The smoke record is a fixture run (tests/fixtures/runs/efa-full: what the training writes),
which the fake kubectl "trains" into the bucket: no Ray here (test_pipeline_walkthrough.py runs
the pipeline on a real local run).
"""
from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from walk_env import make_walk

from environment.rules import WEEKDAYS
from infra.lambdas.image_watcher.history import (
    FAILURE_DEFERRED, FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, ROLLED_BACK,
)
from infra.lambdas.image_watcher.watcher import ALREADY_TRIED, START
from raytrain_eks.verify.lock import lock

pytestmark = pytest.mark.slow  # a pipeline run per test (synth, smoke, apply), about 2 minutes each

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "efa-full"


class Ended:
    """The watcher's view of the executions (moto runs no actions): an execution is Failed once
    the test ran it and it failed, InProgress while the test says so."""

    def __init__(self, starter):
        self.starter, self.running = starter, set()

    def start(self, digest, attempt=1):
        return self.starter.start(digest, attempt)

    def status(self, execution_id):
        return "InProgress" if execution_id in self.running else "Failed"


@pytest.fixture
def walk(tmp_path, aws, registry):
    w = make_walk(tmp_path, aws, registry, RECORD, starter_status=Ended)
    # the committed digest, proven and promoted: the long-lived cluster exists and runs it
    w.first = w.push_image(b"image A\n")
    w.committed = w.work / "committed.toml"
    lock(str(w.committed), registry_url="")
    w.scenario(smoke_result="SUCCEEDED")
    run0 = w.Execution("exec-0", "spec").run()
    assert run0.results["promote"].returncode == 0, run0.results["promote"].stderr
    assert w.notifications() == []
    return w


def rollbacks(walk) -> list[dict]:
    return [e for e in walk.history.events() if e["event"] == ROLLED_BACK]


def test_a_retried_smoke_whose_first_attempt_trained_and_failed_passes(walk):
    # given the watcher's execution for a new digest, whose smoke job trains, then fails
    second = walk.push_image(b"image B\n")
    started = walk.watch()
    assert started["action"] == START
    run = walk.Execution(started["execution_id"], second)
    run.synth()
    walk.scenario(smoke_result="TRAINED_FAILED")
    first = run.smoke()
    assert first.returncode == 1 and "AppFailed" in first.stderr
    [failed] = rollbacks(walk)
    assert failed["failure"] == FAILURE_IMAGE and failed["outcome"].startswith("long-lived cluster untouched")
    [note] = walk.notifications()
    assert f"failed for {walk.env.image.repository}@{second}" in note and "Failure: image" in note
    assert "AppFailed" in note and "shelved" in note
    # when a person retries the stage (RetryStageExecution: the SAME execution id, a new build)
    walk.scenario(smoke_result="SUCCEEDED")
    retry = run.smoke()
    # then the retry trains under a run name of its own and passes: gate, apply, promote
    assert retry.returncode == 0, retry.stderr
    assert run.record.split("?versionId=")[0].rsplit("/", 2)[-2].startswith(f"smoke-{run.id}-")
    assert run.gate().returncode == 0 and run.apply().returncode == 0
    assert run.promote().returncode == 0, run.results["promote"].stderr
    assert walk.promoted() == second and walk.live_images() == {second}
    # both attempts' runs are in the bucket, each under its own build's name
    runs = {k.split("/")[1] for k in walk.keys(f"{walk.env.storage.prefix}/smoke-{run.id}-")}
    assert len(runs) == 2


def test_a_smoke_waiting_for_busy_gpus_is_retried_later_instead_of_shelving_the_digest(walk):
    second = walk.push_image(b"image B\n")
    attempts = []
    walk.scenario(smoke_result="NO_CAPACITY")
    for attempt in range(1, walk.env.pipeline.max_attempts + 1):
        # the watcher starts it (again: the failure was not the image's)
        started = walk.watch()
        assert started["action"] == START and started.get("attempt", "1") == str(attempt), started
        run = walk.Execution(started["execution_id"], second)
        run.synth()
        attempts.append(run.smoke())
        # KubeRay failed the RayJob at preRunningDeadlineSeconds: its pods never ran
        assert attempts[-1].returncode == 1 and "PreRunningDeadlineExceeded" in attempts[-1].stderr
        failed = rollbacks(walk)[0]
        assert failed["failure"] == FAILURE_INFRASTRUCTURE and failed["digest"] == second
        [note] = walk.notifications()
        assert "Failure: infrastructure" in note and "PreRunningDeadlineExceeded" in note
        assert "starts the digest again on a later tick" in note
        # while its execution still runs, the watcher waits for it
        walk.starter.running.add(started["execution_id"])
        assert walk.watch()["action"] == ALREADY_TRIED
        walk.starter.running.clear()
    # the bound (pipeline.max_attempts): no more starts, and the watcher says why
    bounded = walk.watch()
    assert bounded["action"] == ALREADY_TRIED and "pipeline.max_attempts" in bounded["why"]
    assert walk.promoted() == walk.first and walk.live_images() == {walk.first}


def test_a_retry_after_busy_gpus_passes_when_the_gpus_are_free(walk):
    second = walk.push_image(b"image B\n")
    walk.scenario(smoke_result="NO_CAPACITY")
    busy = walk.watch()
    run = walk.Execution(busy["execution_id"], second)
    run.synth()
    assert run.smoke().returncode == 1
    walk.scenario(smoke_result="SUCCEEDED")
    later = walk.watch()
    assert later["action"] == START and later["attempt"] == "2"
    run2 = walk.Execution(later["execution_id"], second).run()
    assert run2.results["promote"].returncode == 0, run2.results["promote"].stderr
    assert walk.promoted() == second


def test_apply_waits_for_the_job_running_on_the_long_lived_cluster_which_finishes_untouched(walk):
    # given a user's job on the long-lived cluster, ending after a few polls
    walk.start_cluster_job("finetune-on-cluster", polls=3)
    second = walk.push_image(b"image B\n")
    run = walk.Execution(walk.watch()["execution_id"], second).run()
    # then Apply waited for it, said so, and only then recreated the cluster
    assert run.results["promote"].returncode == 0, run.results["apply"].stderr
    assert "waited" in run.results["apply"].stderr and "finetune-on-cluster" in run.results["apply"].stderr
    assert walk.cluster_job("finetune-on-cluster")["jobDeploymentStatus"] == "Complete"
    last = walk.applied()[-1]
    assert last["recreated"] and last["killed"] == [] and walk.live_images() == {second}


def test_apply_defers_while_a_job_runs_past_the_bound_and_leaves_it_running(walk):
    committed = walk.committed
    committed.write_text(committed.read_text().replace("apply_wait_minutes = 120", "apply_wait_minutes = 0"))
    walk.start_cluster_job("long-on-cluster", polls=None)
    applies = len(walk.applied())
    second = walk.push_image(b"image B\n")
    run = walk.Execution(walk.watch()["execution_id"], second).run()
    assert run.results["apply"].returncode == 1 and "promote" not in run.results
    assert "long-on-cluster still running" in run.results["apply"].stderr
    failed = rollbacks(walk)[0]
    assert failed["failure"] == FAILURE_DEFERRED and failed["outcome"].startswith("long-lived cluster untouched")
    assert len(walk.applied()) == applies and walk.live_images() == {walk.first}
    assert walk.cluster_job("long-on-cluster")["jobDeploymentStatus"] == "Running"
    [note] = walk.notifications()
    assert "Failure: deferred" in note
    # deferred is not the image's fault: the watcher starts it again on a later tick
    assert walk.watch()["action"] == START


def test_apply_outside_the_maintenance_window_defers_without_touching_the_cluster(walk):
    # a window three days from today: closed now, whatever the time of day
    day = WEEKDAYS[(datetime.datetime.now(datetime.timezone.utc).weekday() + 3) % 7]
    committed = walk.committed
    committed.write_text(committed.read_text().replace('maintenance_window = ""', f'maintenance_window = "{day} 02:00-04:00"'))
    second = walk.push_image(b"image B\n")
    run = walk.Execution(walk.watch()["execution_id"], second).run()
    assert run.results["apply"].returncode == 1 and "outside the maintenance window" in run.results["apply"].stderr
    assert rollbacks(walk)[0]["failure"] == FAILURE_DEFERRED and walk.live_images() == {walk.first}
