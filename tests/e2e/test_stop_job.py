"""A stop through Ray's job API keeps the final checkpoint, when that checkpoint takes longer than
the job supervisor's default wait.

The path is KubeRay's: ``raytrain-eks stop`` deletes the RayJob, KubeRay calls StopJob, and
Ray's job supervisor (ray 2.58.0, ``dashboard/modules/job/job_supervisor.py`` ``run()``) sends the
driver SIGTERM and SIGKILLs it after ``RAY_JOB_STOP_WAIT_TIME_S`` (default
``DEFAULT_RAY_JOB_STOP_WAIT_TIME_S = 3``), read from the supervisor actor's environment, which
is the job's runtime env (``job_manager.py`` ``_get_supervisor_runtime_env``). Here: the local
job's RayJob, synthesized as ``submit`` writes it, submitted with ``ray job submit`` to a real
local Ray head (token auth, as on EKS), its storage moto's S3 reading checkpoint uploads at
8 MiB/s (devtools/slow_store.py), stopped with ``JobSubmissionClient.stop_job`` while it trains.
Then the same run is submitted again and continues from that checkpoint.

While that resumed job writes the run (the store holds its last checkpoint's upload, so it
cannot end before), a second trainer on the same run (a second ``submit --resume X`` with a
``--set`` of its own that would prune down to one checkpoint) refuses in one line naming the
first (the run's lease, training/checkpointing/lease.py), and no checkpoint of the run is touched.
One Ray job backs both proofs: the resumed job is the first trainer (so a failure in the stop or
the resume leaves the refusal unchecked until it is fixed).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from ray_session import TEST_ENV
from devtools.slow_store import slow_store
from devtools.strike import HOLD
from training.checkpointing.manager import checkpoint_dir_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STORE_BYTES_PER_S = 8 * 2**20
"""The store's upload bandwidth per request while a test needs it slow: the local job's
checkpoint (a rank's shard of the full-vocabulary tiny Qwen2 with its AdamW state, ~58 MB) then
takes over 3 s, Ray's default stop wait, to store; the test checks that premise on the checkpoint
itself. Slowed around the stop only: the resumed run's last checkpoint is held (:data:`HOLD`)
until the second trainer is refused, then stored at moto's speed."""
UNSLOWED = 2**40
"""The store's rate outside :meth:`SlowStore.slowed` blocks: moto's own speed."""
DEFAULT_STOP_WAIT_S = 3
"""ray 2.58.0 job_supervisor.py ``DEFAULT_RAY_JOB_STOP_WAIT_TIME_S``."""
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def _wait(predicate, bound_s: float, what: str):
    """Poll ``predicate`` until it returns something truthy; the bound only ends a hung wait."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def _manifests(tmp: Path, run: str, sets: list[str]):
    from environment import load_environment
    from raytrain_eks.runs.manifest import synth_run

    spec = ROOT / "environment.toml"
    return synth_run(load_environment(spec), ROOT / "jobs" / "local.toml", run=run, overrides=sets,
                     outdir=tmp, spec_text=spec.read_text(encoding="utf-8"))


def _submit(head, manifests, submission_id: str) -> None:
    from charts.main import read_rayjob
    from raytrain_eks.backends.local import submit

    job = read_rayjob(manifests.rayjob)
    submit(head.dashboard_url, submission_id, job.entrypoint, job.runtime_env_yaml, auth_env=head.client_env)


def _status(client, submission_id: str) -> str:
    return str(getattr(client.get_job_status(submission_id), "value", client.get_job_status(submission_id)))


def _run_json(s3, run_uri: str) -> dict:
    from raytrain_eks.runs.results import split_uri

    bucket, key = split_uri(f"{run_uri}/run.json")
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


@pytest.fixture(scope="module")
def head_and_store():
    """A local Ray head whose storage is the slowed store."""
    from raytrain_eks.backends.local_services import ray_head

    with slow_store(UNSLOWED) as store:
        with ray_head(num_cpus=4, env={**store.client_env, **TEST_ENV}) as head:  # tests/ray_session.py
            yield head, store


def test_stop_job_keeps_the_final_checkpoint_and_the_run_resumes_from_it(head_and_store, tmp_path, monkeypatch):
    from raytrain_eks.backends.local import job_client
    from raytrain_eks.runs.results import s3_client, upload_if_missing
    from training.checkpointing import find_latest_complete

    head, store = head_and_store
    for key, value in store.client_env.items():
        monkeypatch.setenv(key, value)  # this process reads the run's storage too
    s3 = s3_client(store.client_env)
    client = job_client(head.dashboard_url, head.client_env)
    run = "stop-test"
    # No periodic checkpoint and no evaluation: the only checkpoint is the one the stop asks for.
    # The grace is 300 s (the supervisor waits it + 30 s before its SIGKILL; local.toml's 30 s
    # gave 60 s), so a loaded machine's slow step plus the slowed upload ends within it; the
    # run's own time limit (the RayJob's deadline less that wait) stays far beyond the test's
    # waits. The premise below (Ray's default 3 s could not have stored it) does not depend on it.
    first = _manifests(tmp_path / "first", run, ["train.max_steps=100000", "checkpoint.every_n_steps=0",
                                                 "eval.every_n_steps=0", "checkpoint.sigterm_grace_seconds=300"])
    upload_if_missing(s3, first.code_path, first.code_uri, create_bucket=True)
    with store.slowed(STORE_BYTES_PER_S):
        _submit(head, first, "stop-test-1")
        _wait(lambda: re.search(r"\bstep [2-9]\d*/100000 \|", client.get_job_logs("stop-test-1"))
              or _status(client, "stop-test-1") in TERMINAL, 900, "the job's second logged step")
        assert _status(client, "stop-test-1") == "RUNNING", client.get_job_logs("stop-test-1")[-4000:]

        client.stop_job("stop-test-1")  # what KubeRay's StopJob calls
        _wait(lambda: _status(client, "stop-test-1") in TERMINAL, 900, "the stopped job to end")

    logs = client.get_job_logs("stop-test-1")
    latest = find_latest_complete(first.run_uri)
    assert latest is not None, f"no complete checkpoint in {first.run_uri}:\n{logs[-4000:]}"
    record = _run_json(s3, first.run_uri)
    assert record["status"] == "stopped", record.get("status")
    last_logged = int(re.findall(r"\bstep (\d+)/100000 \|", logs)[-1])
    assert latest.step >= last_logged and latest.marker["world_size"] == 2
    # the premise: this checkpoint cannot be stored within Ray's default wait
    assert max(entry["size"] for entry in latest.marker["files"]) / STORE_BYTES_PER_S > DEFAULT_STOP_WAIT_S

    assert _lease(first.run_uri) is None  # the stopped trainer released the run at its end

    # `submit --resume`: the same run, a few steps further; it continues from the stop's checkpoint.
    more = latest.step + 2
    second = _manifests(tmp_path / "second", run, [f"train.max_steps={more}", "checkpoint.every_n_steps=0",
                                                   "eval.every_n_steps=0", "checkpoint.export_hf=false"])
    # Its last checkpoint's upload is held until a second trainer has tried the run (HOLD: bytes
    # keep flowing, the ~58 MB shard cannot be stored meanwhile): the resumed job cannot end before.
    with store.slowed(HOLD, only=f"/{run}/{checkpoint_dir_name(more)}/"):
        _submit(head, second, "stop-test-2")
        _wait(lambda: any(checkpoint_dir_name(more) in path for path in store.uploading())
              or _status(client, "stop-test-2") in TERMINAL, 900, "the resumed job's last checkpoint upload")
        assert _status(client, "stop-test-2") == "RUNNING", client.get_job_logs("stop-test-2")[-4000:]
        _second_trainer_refuses(head, client, tmp_path, run, first.run_uri, holder="stop-test-2")
    _wait(lambda: _status(client, "stop-test-2") in TERMINAL, 900, "the resumed job to end")
    logs = client.get_job_logs("stop-test-2")
    # (its verdict may reject a 5-step model: the job's [accept] criteria are not this test's)
    assert _run_json(s3, first.run_uri)["status"] == "succeeded", logs[-4000:]
    assert f"resuming {run} from step {latest.step}: {latest.uri}" in logs
    held = find_latest_complete(first.run_uri)
    assert held.step == more
    # the hold's premise: the held shard is far over what the sockets buffer (a few MB), so it
    # was not sent whole before the refusal
    assert max(entry["size"] for entry in held.marker["files"]) > 16 * 2**20
    assert re.findall(r"\bstep (\d+)/\d+ \|", logs)[-1] == str(more)
    assert _lease(first.run_uri) is None  # released at its end


def _complete(run_uri: str) -> dict[str, dict]:
    from training.checkpointing.markers import list_checkpoints, read_remote_marker, remote_problem

    return {c.uri: read_remote_marker(c.uri) for c in list_checkpoints(run_uri) if remote_problem(c.uri) is None}


def _lease(run_uri: str):
    from training.checkpointing.lease import Lease

    return Lease(run=run_uri, attempt="", holder="").read()


def _second_trainer_refuses(head, client, tmp_path: Path, run: str, run_uri: str, holder: str) -> None:
    """A second trainer on ``run`` while Ray job ``holder`` writes it: a user's ``--set`` of its
    own (a checkpoint every step, keep one: it would prune every other checkpoint) refuses in one
    line naming the holder, before any step, and every complete checkpoint of the run is untouched."""
    before = _complete(run_uri)
    assert before, f"no complete checkpoint in {run_uri} to guard"
    second = _manifests(tmp_path / "refused", run, ["train.max_steps=100000", "checkpoint.every_n_steps=1",
                                                    "checkpoint.keep_last=1", "eval.every_n_steps=0"])
    _submit(head, second, "two-trainers")
    # (a second trainer let in would train on for 100000 steps: its driver's "resuming" line,
    # printed once it holds the lease, ends the wait, and the test fails)
    _wait(lambda: _status(client, "two-trainers") in TERMINAL or "resuming" in client.get_job_logs("two-trainers"),
          900, "the second trainer to end")
    logs = client.get_job_logs("two-trainers")
    refusal = [line for line in logs.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1, logs[-4000:]
    assert f"run {run_uri} is being written by another trainer: Ray job {holder} on " in refusal[0]
    assert _status(client, "two-trainers") == "FAILED" and "resuming" not in logs and "step 1/" not in logs
    after = _complete(run_uri)
    assert {uri: after.get(uri) for uri in before} == before  # every checkpoint of the run, untouched
