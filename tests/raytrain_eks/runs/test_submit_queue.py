"""GPU jobs wait in Kueue's queue instead of failing: `raytrain-eks submit`, `status` and `list`
as a user runs them, against the kubectl double with Kueue v0.19.2 in front of KubeRay v1.7.0
(kueue_double.py, kubectl_double.py: suspension, admission against the ClusterQueue the add-on
installs, higher priority first; KubeRay's deadlines count from the unsuspend). The node groups
hold one GPU job at a time (``gpu_capacity``: the groups at max nodes; every GPU job takes them
all), and the finished job's cluster keeps its GPUs for a while (``ttl_after``, KubeRay's
``ttlSecondsAfterFinished``).
"""
from __future__ import annotations

import json

import pytest

from eks_fixtures import FIXTURE_RUN, cluster  # noqa: F401  (cluster: a fixture)
from fixtures_s3 import s3_server  # noqa: F401  (session moto server; sets AWS_ENDPOINT_URL)
from raytrain_eks.cli import main

pytestmark = pytest.mark.subprocess  # the CLI runs the kubectl double (kubectl_double.py) as a process

READY_AFTER = 4
"""Reconciles from a cluster's placement to Ready (its node scales up, the image pulls)."""
PRE_RUNNING_AFTER = READY_AFTER + 3
"""KubeRay's preRunningDeadlineSeconds, in reconciles: enough for a job from its own start, far
less than a job waits while another one runs: counted from creation, the queued job would fail."""


def _submit(tmp_path, run: str, *args: str, job: str = "jobs/smoke.toml") -> int:
    return main(["submit", job, "--name", run, "--poll-seconds", "0", "--out", str(tmp_path / run), *args])


def _history(cluster, run: str) -> list[tuple[int, str]]:
    """``(tick, jobDeploymentStatus)`` of each status change KubeRay wrote to the RayJob."""
    return [(tick, status) for tick, name, status in cluster.state()["history"] if name == run]


def _tick(cluster, run: str, status: str) -> int:
    return next(tick for tick, now in _history(cluster, run) if now == status)


def _verdict_code() -> int:
    from training.verdict import exit_code, of_record

    return exit_code(of_record(json.loads((FIXTURE_RUN / "run.json").read_text())))


def test_two_gpu_jobs_back_to_back_the_second_waits_in_the_queue_and_both_end_with_their_verdicts(
        cluster, tmp_path, capfd):
    cluster.set(cluster_ready_after=READY_AFTER, pre_running_deadline_after=PRE_RUNNING_AFTER, ttl_after=2)
    assert _submit(tmp_path, "gpu-a", "--no-wait") == 0
    capfd.readouterr()

    code = _submit(tmp_path, "gpu-b")
    out = capfd.readouterr().out
    assert code == _verdict_code(), out
    lines = [line.strip() for line in out.splitlines()]
    order = ["RayJob gpu-b: Suspended",
             "queued: 1 of 1 in Kueue's queue (Workload rayjob-gpu-b-", "admitted by Kueue (Workload rayjob-gpu-b-",
             "RayJob gpu-b: Initializing (cluster gpu-b-x7k2p)", "1 pod(s) waiting for a node",
             "RayJob gpu-b: Running", "step 10/20 loss 9.81", "==> gpu-b: Complete / SUCCEEDED", "verdict:   "]
    positions = [next((i for i, line in enumerate(lines) if line.startswith(want)), -1) for want in order]
    assert -1 not in positions and positions == sorted(positions), out
    queued = lines[positions[1]]
    assert "priority short), behind gpu-a (admitted); Kueue: couldn't assign flavors to pod set " in queued, queued
    assert "insufficient unused quota for " in queued and " in flavor gpu-gpu, " in queued and "more needed" in queued

    # admitted when the first ended, not before; its deadlines counted from then, so waiting
    # longer than preRunningDeadlineSeconds in the queue failed nothing
    assert _tick(cluster, "gpu-a", "Complete") < _tick(cluster, "gpu-b", "New") < _tick(cluster, "gpu-b", "Initializing")
    assert _tick(cluster, "gpu-b", "New") - _tick(cluster, "gpu-b", "Suspended") > PRE_RUNNING_AFTER
    assert all(status != "Failed" for _, name, status in cluster.state()["history"])

    # the first run's verdict, from its storage, as after any `submit --no-wait`
    assert main(["report", f"{cluster.storage}/gpu-a", "--out", str(tmp_path / "report-a")]) == _verdict_code()
    assert main(["list"]) == 0
    table = {line.split()[0]: line.split() for line in capfd.readouterr().out.splitlines()[1:]}
    assert table["gpu-a"][2:5] == table["gpu-b"][2:5] == ["Complete", "SUCCEEDED", "-"], table


# Priorities ordering the queue (a short job submitted later admitted before a queued
# experiment) are proven against the real Kueue: tests/cluster/test_cli.py
# test_a_short_job_submitted_later_is_admitted_before_a_queued_experiment.


def test_without_kueue_the_second_gpu_job_fails_on_its_pre_running_deadline(cluster, tmp_path, capfd):
    """The failure the queue removes (issue 40): with ``queueing.enabled = false`` no RayJob is
    suspended, the second one's cluster waits for GPUs the first one holds, and KubeRay fails it
    once ``preRunningDeadlineSeconds`` has passed since ITS creation (rayjob_controller.go:1247-1262).
    Also proves the double's deadline would catch a queued job whose clock ran in the queue."""
    from raytrain_eks.runs.manifest import ROOT

    spec = (ROOT / "environment.toml").read_text(encoding="utf-8")
    line = "enabled = true               # false: a job that finds the GPUs busy"
    assert spec.count(line) == 1
    unqueued = tmp_path / "environment.toml"
    unqueued.write_text(spec.replace(line, line.replace("true ", "false")))
    cluster.set(cluster_ready_after=READY_AFTER, pre_running_deadline_after=PRE_RUNNING_AFTER, kueue=None)
    assert _submit(tmp_path, "free-a", "--no-wait", "--env", str(unqueued)) == 0
    assert _submit(tmp_path, "free-b", "--env", str(unqueued)) == 1
    out = capfd.readouterr().out
    assert "RayJob free-b: Failed (cluster free-b-x7k2p)" in out and "PreRunningDeadlineExceeded:" in out, out
    assert "queued" not in out
    assert "suspend" not in cluster.state()["rayjobs"]["free-a"]["spec"]


def _long_lived_raycluster() -> dict:
    """The long-lived RayCluster as its chart writes it for the shipped environment.toml."""
    import cdk8s

    from charts.ray_charts import RayClusterChart
    from environment import load_environment
    from raytrain_eks.runs.manifest import ROOT

    (doc,) = RayClusterChart(cdk8s.App(), "raycluster", env=load_environment(ROOT / "environment.toml")).to_json()
    return doc


def test_a_gpu_job_waits_while_the_long_lived_clusters_workers_hold_the_gpus(cluster, tmp_path, capfd):
    """The long-lived RayCluster is a queued elastic workload (environment/queueing.py): while
    Ray's autoscaler holds every GPU worker for an ``-on-cluster`` job, a GPU RayJob waits in the
    queue behind it (not admitted onto nodes it cannot get, where its pre-running deadline would
    fail it), and is admitted once the autoscaler has scaled the workers back to 0."""
    doc = _long_lived_raycluster()
    at_max = {g["groupName"]: g["maxReplicas"] for g in doc["spec"]["workerGroupSpecs"]}
    cluster.set(cluster_ready_after=READY_AFTER, pre_running_deadline_after=PRE_RUNNING_AFTER,
                long_lived={"raycluster": doc, "replicas": at_max})
    assert _submit(tmp_path, "busy-b", "--no-wait", "--set", "name=exp") == 0
    for _ in range(PRE_RUNNING_AFTER + 2):  # longer than its pre-running deadline
        assert main(["status", "busy-b"]) == 0
    out = capfd.readouterr().out
    assert "queued: 1 of 1 in Kueue's queue" in out and f"behind RayCluster {doc['metadata']['name']} (admitted)" in out, out
    assert [status for _, status in _history(cluster, "busy-b")] == ["Suspended"]

    cluster.set(long_lived={**cluster.state()["long_lived"], "replicas": {g: 0 for g in at_max}})  # idle: scaled down
    for _ in range(4 * PRE_RUNNING_AFTER):
        main(["status", "busy-b"])
        if cluster.state()["rayjobs"]["busy-b"]["status"].get("jobDeploymentStatus") in ("Complete", "Failed"):
            break
    assert [status for _, status in _history(cluster, "busy-b")][-1] == "Complete"
    assert all(status != "Failed" for _, name, status in cluster.state()["history"])

    # the autoscaler asks for the workers again while the job's cluster holds the GPUs: the
    # cluster's new slice waits, its workers stay gated (they hold no node)
    assert _submit(tmp_path, "busy-c", "--no-wait", "--set", "name=exp") == 0
    assert main(["status", "busy-c"]) == 0
    cluster.set(long_lived={**cluster.state()["long_lived"], "replicas": at_max})
    assert main(["status", "busy-c"]) == 0
    slices = [w for w in cluster.state()["workloads"].values() if w["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"]
    pending = [w for w in slices if any(c["type"] == "QuotaReserved" and c["status"] == "False"
                                        for c in w["status"].get("conditions", []))]
    assert len(pending) == 1 and "insufficient unused quota for" in pending[0]["status"]["conditions"][-1]["message"]
