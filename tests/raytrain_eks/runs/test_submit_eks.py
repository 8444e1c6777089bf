"""`raytrain-eks submit/status/logs/stop/list` on EKS, against a kubectl double whose RayJobs
move as KubeRay v1.7.0's controller moves them (tests/raytrain_eks/kubectl_double.py cites
``ray-project/kuberay`` tag ``ray-operator/v1.7.0``, ``rayjob_controller.go``): New ->
Initializing (pods wait for a node, then for the image) -> Running (PENDING -> RUNNING) ->
Complete/Failed, terminal only once the submitter has finished. The bucket is moto's.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from eks_fixtures import DRIVER_LOG, FIXTURE_RUN, ROOT, cluster, submit  # noqa: F401  (cluster: a fixture)
from fixtures_s3 import s3_server  # noqa: F401  (session moto server; sets AWS_ENDPOINT_URL)
from raytrain_eks.cli import main

pytestmark = pytest.mark.subprocess  # the CLI runs the kubectl double (kubectl_double.py) as a process


def test_submit_follows_the_rayjob_through_kuberays_states_to_the_verdict(cluster, tmp_path, capfd):
    from training.verdict import exit_code, of_record

    code = submit(tmp_path, "--name", "smoke-a1", "--set", "train.max_steps=20")
    out = capfd.readouterr().out
    record = json.loads((FIXTURE_RUN / "run.json").read_text())
    assert code == exit_code(of_record(record)), out
    lines = [line.strip() for line in out.splitlines()]
    order = ["RayJob smoke-a1: Initializing (cluster smoke-a1-x7k2p)", "1 pod(s) waiting for a node",
             "1 pod(s) pulling the image", "RayJob smoke-a1: Running (cluster", "step 10/20 loss 9.81",
             "RayJob smoke-a1: Complete / SUCCEEDED",
             "==> smoke-a1: Complete / SUCCEEDED", "verdict:   "]
    positions = [next((i for i, line in enumerate(lines) if line.startswith(want)), -1) for want in order]
    assert -1 not in positions and positions == sorted(positions), out
    job = cluster.state()["rayjobs"]["smoke-a1"]
    calls = cluster.state()["calls"]
    # the run's network policy is created (submitters may not patch one), then the rest applied
    created = [c[-1] for c in calls if c[0] == "create"]
    assert len(created) == 1 and created[0].endswith("network-policy.k8s.yaml")
    applied = [c[-1] for c in calls if c[0] == "apply"]
    assert applied[0].endswith("serviceaccount-smoke-a1.yaml")
    assert applied[1].endswith("rayjob-smoke-a1.k8s.yaml")
    # the run's own identity: its service account, associated with the run role before the
    # RayJob, the association gone once the results are copied
    account = cluster.state()["serviceaccounts"]["smoke-a1"]
    assert account["automountServiceAccountToken"] is False and account["metadata"]["namespace"] == "ray"
    [(_, made), (gone, _)] = cluster.identity.calls
    assert (made["namespace"], made["serviceAccount"], made["clusterName"]) == ("ray", "smoke-a1", "raytrain")
    assert made["roleArn"].endswith(":role/raytrain-ray-runs") and gone == "delete"
    assert cluster.identity.associations == {}
    pods = job["spec"]["rayClusterSpec"]
    assert {t["spec"]["serviceAccountName"] for t in (pods["headGroupSpec"]["template"],
                                                      pods["workerGroupSpecs"][0]["template"])} == {"smoke-a1"}
    # followed, not done at the first poll: New, Initializing until the cluster is ready, Running, Complete
    assert sum(c[:2] == ["get", "rayjob"] for c in calls) >= 6
    # the code archive the RayJob names is in the bucket, and the results came back
    job = cluster.state()["rayjobs"]["smoke-a1"]
    working_dir = json.dumps(job["spec"]["runtimeEnvYAML"]).split("working_dir: ")[1].split("\\n")[0]
    bucket, _, key = working_dir.removeprefix("s3://").partition("/")
    cluster.s3.head_object(Bucket=bucket, Key=key)
    assert "--set train.max_steps=20" in job["spec"]["entrypoint"]
    assert "checkpoint.run_name=smoke-a1" in job["spec"]["entrypoint"]
    assert (tmp_path / "out" / "run.json").is_file() and (tmp_path / "out" / "report" / "report.md").is_file()


def test_a_second_submit_refuses_a_used_name_and_resume_continues_it(cluster, tmp_path, capfd):
    submit(tmp_path, "--name", "smoke-b1")
    capfd.readouterr()
    assert submit(tmp_path, "--name", "smoke-b1") == 2
    assert "already holds a run: it would resume it (say so with --resume smoke-b1" in capfd.readouterr().err
    assert submit(tmp_path, "--resume", "smoke-nothing") == 2
    assert "has nothing in" in capfd.readouterr().err
    code = submit(tmp_path, "--resume", "smoke-b1")
    out = capfd.readouterr().out
    assert code in (0, 3), out
    assert "run smoke-b1: resumes" in out and "code archive already in the bucket" in out
    calls = cluster.state()["calls"]
    assert ["delete", "rayjob", "smoke-b1", "-n", "ray", "--cascade=foreground", "--wait=true"] in calls
    # the network policy existed already: applied once, for the first submit only
    assert sum(c[0] == "create" and c[-1].endswith("network-policy.k8s.yaml") for c in calls) == 1


def test_status_list_logs_and_stop(cluster, tmp_path, capfd):
    cluster.set(cluster_ready_after=100)
    from charts.main import synth  # noqa: F401  (the manifests come from submit below)

    # a run that stays Initializing: Ctrl-C detaches, the RayJob stays
    import raytrain_eks.backends.eks as eks

    real = eks.follow

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    eks.follow = interrupted
    try:
        assert submit(tmp_path, "--name", "smoke-c1") == 130
    finally:
        eks.follow = real
    assert "detached; the run goes on" in capfd.readouterr().err
    assert "smoke-c1" in cluster.state()["rayjobs"]

    assert main(["status", "smoke-c1"]) == 0
    out = capfd.readouterr().out
    assert "status     Initializing" in out and "cluster    smoke-c1-x7k2p" in out
    assert "waiting    1 pod(s) waiting for a node" in out

    # no submitter Job before the cluster is ready (rayjob_controller.go:230-232): no log yet
    assert main(["logs", "smoke-c1"]) == 2
    assert "run 'smoke-c1' is Initializing: no log yet" in capfd.readouterr().err

    assert main(["list"]) == 0
    table = capfd.readouterr().out.splitlines()
    assert table[0].split() == ["run", "job", "config", "status", "job", "status", "queue", "started"]
    assert table[1].split()[:3] == ["smoke-c1", "jobs/smoke.toml", "Initializing"]

    assert main(["stop", "smoke-c1"]) == 0
    assert "stopped smoke-c1" in capfd.readouterr().out
    state = cluster.state()
    assert "smoke-c1" not in state["rayjobs"] and state["stopped_jobs"] == ["smoke-c1-abcde"]
    # background deletion: KubeRay's finalizer stops the Ray job before the garbage collector
    # deletes the RayJob's own cluster (rayjob_controller.go:112-138, 1021); foreground would
    # let the collector delete the cluster first (kubectl_double.py)
    assert ["delete", "rayjob", "smoke-c1", "-n", "ray", "--cascade=background", "--wait=true"] in state["calls"]
    assert state["deleted_clusters"] == [{"cluster": "smoke-c1-x7k2p", "foreground": False}]
    assert "ray-rayjob-smoke-c1" not in state.get("policies", {})
    assert main(["stop", "smoke-c1"]) == 2


def test_logs_come_from_storage_once_the_rayjob_is_gone(cluster, tmp_path, capfd):
    key = cluster.storage.removeprefix(f"s3://{cluster.bucket}/") + "/smoke-gone/logs/driver.log"
    cluster.s3.put_object(Bucket=cluster.bucket, Key=key, Body=DRIVER_LOG.encode())
    assert main(["logs", "smoke-gone"]) == 0
    assert capfd.readouterr().out == DRIVER_LOG
    assert main(["logs", "smoke-never"]) == 2
    assert "has no submitter pod and no s3://" in capfd.readouterr().err


def test_a_failed_attempt_is_retried_on_a_new_cluster_and_followed_to_the_end(cluster, tmp_path, capfd):
    # KubeRay v1.7.0 rayjob_controller.go:452, 518-556: with backoffLimit left, a failed attempt
    # is written as Retrying (never Failed); Retrying -> New clears the cluster and the job id
    # (366-410), so the next attempt has a new cluster, a new Ray job and its own log.
    cluster.set(outcomes=["FAILED", "SUCCEEDED"])
    code = submit(tmp_path, "--name", "smoke-r1", "--set", "rayjob.backoff_limit=1")
    out = capfd.readouterr().out
    assert code in (0, 3), out
    lines = [line.strip() for line in out.splitlines()]
    order = ["RayJob smoke-r1: Running (cluster smoke-r1-x7k2p)", "step 10/20 loss 9.81",
             "RayJob smoke-r1: Retrying / FAILED", "attempt 1 failed; KubeRay retries on a new cluster",
             "RayJob smoke-r1: Initializing (cluster smoke-r1-r1x7k)", "RayJob smoke-r1: Running (cluster smoke-r1-r1x7k)",
             "RayJob smoke-r1: Complete / SUCCEEDED"]
    positions = [next((i for i, line in enumerate(lines) if line.startswith(want)), -1) for want in order]
    assert -1 not in positions and positions == sorted(positions), out
    assert not any(line.startswith("RayJob smoke-r1: Failed") for line in lines), out
    assert sum(c[0] == "logs" for c in cluster.state()["calls"]) == 2  # each attempt's log streamed


def test_on_cluster_rayjob_passes_kuberays_validation(cluster, tmp_path, capfd):
    # KubeRay v1.7.0 utils/validation.go:575-576: backoffLimit > 0 with a clusterSelector is
    # ValidationFailed. The on-cluster manifest carries backoffLimit 0 whatever the job says.
    code = submit(tmp_path, "--name", "smoke-o1", "--on-cluster", "--set", "rayjob.backoff_limit=1")
    out = capfd.readouterr().out
    assert code in (0, 3), out
    job = cluster.state()["rayjobs"]["smoke-o1-on-cluster"]
    assert job["spec"].get("backoffLimit", 0) == 0 and job["status"]["jobDeploymentStatus"] == "Complete", out
    # its folder is one the long-lived cluster's role may write, and no run with its own cluster's
    assert "checkpoint.run_name=on-cluster_smoke-o1 " in job["spec"]["entrypoint"] + " "
    assert f"storage {cluster.storage}/on-cluster_smoke-o1" in out, out


def test_the_double_refuses_backoff_with_a_cluster_selector_as_kuberay_does(cluster, tmp_path, capfd):
    import yaml

    import raytrain_eks.backends.eks as eks

    manifest = tmp_path / "rayjob.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "bad"},
                                        "spec": {"backoffLimit": 1, "clusterSelector": {"ray.io/cluster": "c"}}}))
    eks.apply(str(manifest))
    final = eks.follow("bad", "ray", poll_s=0, say=lambda line: None)
    assert eks.phase(final)[0] == "ValidationFailed"
    assert final["status"]["reason"] == "ValidationFailed" and "ClusterSelector" in final["status"]["message"]
    # server-side apply of an existing RayJob succeeds and keeps its status (no re-run)
    eks.apply(str(manifest))
    assert eks.get_rayjob("bad", "ray")["status"]["jobDeploymentStatus"] == "ValidationFailed"


def test_a_new_run_name_with_a_leftover_rayjob_is_refused(cluster, tmp_path, capfd):
    # A RayJob of that name with nothing in storage (it was refused, or failed before writing):
    # applying onto it would succeed and run nothing (rayjob_controller.go:420-447).
    cluster.set(rayjobs={"smoke-l1": {"kind": "RayJob", "metadata": {"name": "smoke-l1"}, "spec": {},
                                      "status": {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed"},
                                      "_fake": {"reconciles": 0, "submitter_done": False}}})
    assert submit(tmp_path, "--name", "smoke-l1") == 2
    out, err = capfd.readouterr()
    assert "RayJob smoke-l1 already exists (ValidationFailed): raytrain-eks stop smoke-l1" in err, err
    # refused before anything is written: no upload, no network policy, no RayJob
    assert "code archive" not in out and not any(c[0] in ("apply", "create") for c in cluster.state()["calls"])


def test_resume_refuses_a_run_whose_rayjob_is_still_live(cluster, tmp_path, capfd):
    # Deleting a live RayJob stops its Ray job (rayjob_controller.go:112-137) but its RayCluster
    # goes in the background (owner reference): its workers could write beside the new attempt.
    key = cluster.storage.removeprefix(f"s3://{cluster.bucket}/") + "/smoke-v1/run.json"
    cluster.s3.put_object(Bucket=cluster.bucket, Key=key, Body=b"{}")
    cluster.set(rayjobs={"smoke-v1": {"kind": "RayJob", "metadata": {"name": "smoke-v1"}, "spec": {},
                                      "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
                                      "_fake": {"reconciles": 0, "submitter_done": False, "running_since": 0}}},
                submitter_runs=1000)
    assert submit(tmp_path, "--resume", "smoke-v1") == 2
    assert "RayJob smoke-v1 is still Running / RUNNING: raytrain-eks stop smoke-v1 first" in capfd.readouterr().err
    assert not any(c[0] == "delete" for c in cluster.state()["calls"])


def test_a_spec_kuberay_refuses_ends_submit_with_its_message_and_exit_2(cluster, tmp_path, capfd, monkeypatch):
    # ValidationFailed (rayjob_controller.go:144-161) runs nothing: no storage to look for.
    import yaml

    import raytrain_eks.backends.eks as eks

    real = eks.apply

    def refused_spec(path: str) -> None:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
        for doc in docs:
            if doc and doc.get("kind") == "RayJob":
                doc["spec"] |= {"clusterSelector": {"ray.io/cluster": "raytrain"}, "backoffLimit": 1}
        Path(path).write_text(yaml.safe_dump_all(docs))
        real(path)

    monkeypatch.setattr(eks, "apply", refused_spec)
    assert submit(tmp_path, "--name", "smoke-x1") == 2
    captured = capfd.readouterr()
    assert "KubeRay refused RayJob smoke-x1: The RayJob spec is invalid: BackoffLimit is incompatible" in captured.err
    assert "RayJob smoke-x1: ValidationFailed" in captured.out and "wrote no run.json" not in captured.err


def test_a_restarted_submitter_is_streamed_on_without_repeating_lines(cluster, tmp_path, capfd):
    # kubectl logs -f exits 0 when the submitter's container exits, whatever its code; the
    # submitter Job's next pod runs `ray job logs --follow`, which starts from the top
    # (KubeRay v1.7.0 rayjob_controller.go:718, common/job.go:119-130).
    cluster.set(submitter_restarts=1)
    code = submit(tmp_path, "--name", "smoke-s1")
    out = capfd.readouterr().out
    assert code in (0, 3), out
    for line in DRIVER_LOG.splitlines():
        assert out.count(line) == 1, (line, out)
    assert sum(c[0] == "logs" for c in cluster.state()["calls"]) == 2


def test_logs_read_the_stored_copy_when_no_cluster_answers(cluster, capfd):
    """After ``cdk destroy`` or with a stale kubeconfig kubectl fails; ``logs`` still prints the
    copy in storage, and says why. Nothing anywhere: exit 5 (the tool could not reach the
    cluster), not 1 (a run's failure)."""
    from raytrain_eks.backends.eks import EXIT_UNREACHABLE

    cluster.set(unreachable=True)
    key = cluster.storage.removeprefix(f"s3://{cluster.bucket}/") + "/smoke-destroyed/logs/driver.log"
    cluster.s3.put_object(Bucket=cluster.bucket, Key=key, Body=DRIVER_LOG.encode())
    assert main(["logs", "smoke-destroyed"]) == 0
    out = capfd.readouterr()
    assert out.out == DRIVER_LOG and "the cluster does not answer" in out.err and "reading the stored copy" in out.err
    assert main(["status", "smoke-destroyed"]) == EXIT_UNREACHABLE
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "connection to the server localhost:8080 was refused" in err


def test_submit_refuses_another_clusters_context_before_anything_is_applied(cluster, tmp_path, capfd):
    from raytrain_eks.backends.eks import EXIT_UNREACHABLE

    cluster.set(context_cluster="arn:aws:eks:us-east-1:111122223333:cluster/someone-elses")
    assert submit(tmp_path, "--name", "smoke-x1") == EXIT_UNREACHABLE
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "cluster/someone-elses" in err and "not this environment's" in err
    cluster.set(context_cluster="")
    assert submit(tmp_path, "--name", "smoke-x1") == EXIT_UNREACHABLE
    assert "kubectl has no current context" in capfd.readouterr().err
    assert not [c for c in cluster.state()["calls"] if c[0] == "apply"]


# `submit --no-wait` returning once the RayJob is applied: against the real API server in
# tests/cluster/test_cli.py (test_submit_no_wait_status_list_and_stop_against_the_real_api_server).


def test_submit_refuses_bad_data_before_anything_is_applied(cluster, tmp_path, capfd):
    """The data check runs in submit: a bad line in the job's own data is one line, before any
    upload or apply."""
    data = tmp_path / "chats.jsonl"
    data.write_text('{"text": "one"}\n{"text": \n')
    code = submit(tmp_path, "--name", "smoke-d1", "--set", "data.kind=jsonl", "--set", f"data.path={data}")
    err = capfd.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{data}, line 2: not valid JSON" in err, err
    assert not [c for c in cluster.state().get("calls", []) if c[0] in ("apply", "config")]


@pytest.mark.parametrize("command", ["status", "logs", "list", "stop"])
def test_the_run_commands_start_no_node(command, tmp_path):
    """cdk8s and jsii start Node (seconds, and a banner on stdout): the run commands need neither."""
    import subprocess

    args = [command] if command == "list" else [command, "no-such-run"]
    program = (f"import sys; from raytrain_eks.cli import main; code = main({args!r}); "
               "print(sorted(m for m in ('cdk8s', 'jsii', 'constructs') if m in sys.modules)); sys.exit(code)")
    env = {**os.environ, "PATH": str(tmp_path)}  # no kubectl: the cluster cannot be reached
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr
    # list still lists the local runs (0) when there are any in .work/runs; logs says "no log" (2)
    # when storage answers; otherwise nothing could be reached (5)
    assert proc.returncode == 5 or (command, proc.returncode) in (("list", 0), ("logs", 2)), proc.stderr


@pytest.mark.parametrize("live, flags", [("smoke-w1-on-cluster", ()), ("smoke-w1", ("--on-cluster",))])
def test_resume_refuses_while_the_other_variant_of_the_run_is_live(cluster, tmp_path, capfd, live, flags):
    # RUN and RUN-on-cluster write different folders (<storage>/RUN, <storage>/on-cluster_RUN),
    # but status, logs and stop find a run by its name, which would then name two.
    for folder in ("smoke-w1", "on-cluster_smoke-w1"):
        key = cluster.storage.removeprefix(f"s3://{cluster.bucket}/") + f"/{folder}/run.json"
        cluster.s3.put_object(Bucket=cluster.bucket, Key=key, Body=b"{}")
    cluster.set(rayjobs={live: {"kind": "RayJob", "metadata": {"name": live}, "spec": {},
                                "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
                                "_fake": {"reconciles": 0, "submitter_done": False, "running_since": 0}}},
                submitter_runs=1000)
    assert submit(tmp_path, "--resume", "smoke-w1", *flags) == 2
    out, err = capfd.readouterr()
    assert f"RayJob {live} is Running / RUNNING under the same run name 'smoke-w1': " \
           "raytrain-eks stop smoke-w1 first" in err, err
    assert not any(c[0] in ("apply", "create", "delete") for c in cluster.state()["calls"])  # nothing written
    assert "code archive" not in out


@pytest.mark.parametrize("flags, rayjob", [((), "smoke-d1"), (("--on-cluster",), "smoke-d1-on-cluster")])
def test_a_deadline_deletes_the_rayjob_so_its_job_stops_and_its_gpus_go(cluster, tmp_path, capfd, flags, rayjob):
    # KubeRay only marks the RayJob Failed/DeadlineExceeded; with clusterSelector the Ray job runs on.
    cluster.set(deadline_after=1, submitter_runs=1000)
    assert submit(tmp_path, "--name", "smoke-d1", *flags) == 1  # no run.json yet: the stop writes it
    out = capfd.readouterr().out
    assert f"DeadlineExceeded: RayJob {rayjob} deleted, so KubeRay stops its Ray job (final checkpoint)" in out, out
    state = cluster.state()
    assert rayjob not in state["rayjobs"]
    if flags:  # a clusterSelector cluster stays: KubeRay's StopJob has the job's full stop wait
        assert state["stopped_jobs"] == [f"{rayjob}-abcde"] and "ray_stopped_jobs" not in state
    else:
        _assert_stopped_through_ray_before_the_delete(state, rayjob)


def _assert_stopped_through_ray_before_the_delete(state, rayjob):
    """On a run's OWN cluster KubeRay v1.7.0's finalizer calls StopJob, which returns at once,
    and drops the finalizer in the same reconcile (rayjob_controller.go:112-138); the owned
    RayCluster is deleted and `ray start --block` drains only RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
    = 30 s (ray 2.58 _private/ray_constants.py:40, _private/node.py:629-664) before the driver
    dies. So the Ray job is stopped through Ray (`ray job stop` waits until it is terminal,
    dashboard/modules/job/cli.py:448-466) BEFORE the RayJob is deleted. Before the fix there was
    no exec and the RayJob was deleted with its job RUNNING."""
    calls = state["calls"]
    execs = [i for i, c in enumerate(calls) if c[0] == "exec" and c[-1] == f"{rayjob}-abcde"]
    deletes = [i for i, c in enumerate(calls) if c[:3] == ["delete", "rayjob", rayjob]]
    assert execs and deletes and execs[0] < deletes[0], calls
    assert calls[execs[0]][:6] == ["exec", f"svc/{rayjob}-x7k2p-head-svc", "-n", "ray", "-c", "ray-head"]
    assert state["ray_stopped_jobs"] == [f"{rayjob}-abcde"]
    assert state["deleted_rayjobs"] == [{"name": rayjob, "jobStatus": "STOPPED"}]
    assert "stopped_jobs" not in state  # KubeRay's StopJob found the job terminal already


def test_status_deletes_a_rayjob_past_its_deadline(cluster, tmp_path, capfd):
    cluster.set(rayjobs={"smoke-d2-on-cluster": {
        "kind": "RayJob", "metadata": {"name": "smoke-d2-on-cluster"}, "spec": {"clusterSelector": {"ray.io/cluster": "c"}},
        "status": {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "jobStatus": "RUNNING",
                   "jobId": "smoke-d2-on-cluster-abcde"},
        "_fake": {"reconciles": 0, "submitter_done": False}}})
    assert main(["status", "smoke-d2"]) == 0
    assert "RayJob smoke-d2-on-cluster deleted" in capfd.readouterr().out
    assert cluster.state()["stopped_jobs"] == ["smoke-d2-on-cluster-abcde"]


@pytest.mark.parametrize("run, case", [("smoke-p1", {"submitter_restarts": 1}), ("smoke-p2", {"stream_drops": 1}),
                                       ("smoke-p3", {"stream_drops": 1, "submitter_restarts": 1})])
def test_every_driver_line_is_shown_once_across_restarts_and_dropped_streams(cluster, tmp_path, capfd, run, case):
    # The first submitter pod prints `ray job submit`'s lines first; a retried pod does not
    # (KubeRay v1.7.0 common/job.go:119-130): counting lines would skip driver lines after a
    # retry, and a dropped stream (kubectl exits 1) would show lines twice.
    preamble = [f"Job submission server address: http://{run}-x7k2p-head-svc:8265",
                f"Job '{run}-abcde' submitted successfully", "Tailing logs until the job exits"]
    cluster.set(submit_preamble=preamble, **case)
    code = submit(tmp_path, "--name", run)
    out = capfd.readouterr().out
    assert code in (0, 3), out
    for line in [*preamble, *DRIVER_LOG.splitlines()]:
        assert out.count(line) == 1, (line, out)


def test_a_run_stopped_while_submit_follows_it_ends_with_its_verdict_not_exit_5(cluster, tmp_path, capfd):
    """`raytrain-eks stop RUN` from another terminal deletes the RayJob that this submit follows:
    a stopped run, not an unreachable cluster. Submit copies what storage has and exits with the
    verdict's code (docs/submit.md)."""
    from training.verdict import exit_code, of_record

    cluster.set(stopped_after=0)
    code = submit(tmp_path, "--name", "smoke-x1")
    out = capfd.readouterr()
    assert code == exit_code(of_record(json.loads((FIXTURE_RUN / "run.json").read_text()))), out.out + out.err
    assert "RayJob smoke-x1: deleted" in out.out and "==> smoke-x1: stopped (RayJob deleted)" in out.out
    assert (tmp_path / "out" / "run.json").is_file()


def test_a_kubectl_refusal_exits_6_and_no_api_server_exits_5(cluster, tmp_path, capfd):
    """Only a cluster kubectl cannot reach is 5 (retry later); one that answers Forbidden is
    refused, 6 (docs/submit.md's exit codes)."""
    from raytrain_eks.backends.eks import EXIT_REFUSED, EXIT_UNREACHABLE

    cluster.set(forbidden=True)
    assert main(["status", "smoke-f1"]) == EXIT_REFUSED == 6
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Error from server (Forbidden)" in err
    assert main(["list"]) == EXIT_REFUSED
    capfd.readouterr()
    cluster.set(forbidden=False, unreachable=True)
    assert main(["status", "smoke-f1"]) == EXIT_UNREACHABLE == 5


def test_a_job_path_relative_to_another_directory_is_found(cluster, tmp_path, capfd, monkeypatch):
    """`cd jobs && raytrain-eks submit smoke.toml --env ../environment.toml`: the user's paths
    are from the user's directory, though submit plans the job in the repository root."""
    monkeypatch.chdir(ROOT / "jobs")
    assert main(["submit", "smoke.toml", "--env", "../environment.toml", "--name", "smoke-j1", "--no-wait",
                 "--out", str(tmp_path / "out")]) == 0, capfd.readouterr().err
    assert "RayJob smoke-j1 applied" in capfd.readouterr().out
    assert "entrypoint" in cluster.state()["rayjobs"]["smoke-j1"]["spec"]


def test_stop_stops_the_ray_job_through_its_head_before_deleting_its_rayjob(cluster, capfd):
    """`raytrain-eks stop` of a RUNNING job on its own cluster (see
    _assert_stopped_through_ray_before_the_delete for the upstream rules)."""
    spec = {"entrypoint": "python -m training", "runtimeEnvYAML": "env_vars:\n  RAY_JOB_STOP_WAIT_TIME_S: '150'\n"}
    cluster.set(submitter_runs=1000, rayjobs={"smoke-s1": {
        "kind": "RayJob", "metadata": {"name": "smoke-s1"}, "spec": spec,
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": "smoke-s1-abcde",
                   "rayClusterName": "smoke-s1-x7k2p", "dashboardURL": "smoke-s1-x7k2p-head-svc:8265"},
        "_fake": {"reconciles": 0, "submitter_done": False, "running_since": 0}}})
    assert main(["stop", "smoke-s1"]) == 0
    assert "stopping Ray job smoke-s1-abcde through its head (final checkpoint; at most 210 s)" in capfd.readouterr().out
    _assert_stopped_through_ray_before_the_delete(cluster.state(), "smoke-s1")


def test_a_concurrent_submit_of_one_name_is_one_line(cluster, tmp_path, capfd):
    """Two submits of one --name at once: the second ends in one line, before it writes or
    applies anything (before the fix the two wrote one results folder and one raised a traceback).
    The first submit is stood in for by its lock, held by another process as a running submit holds it."""
    import subprocess

    lock = tmp_path / "out" / ".submit.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | "
                               "os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(3600)",
                               str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        calls_before = len(cluster.state().get("calls", []))
        assert submit(tmp_path, "--name", "smoke-twice") == 2
        err = capfd.readouterr().err.strip()
        assert err.count("\n") == 0 and "another submit of this run is running on this machine" in err, err
        assert "Traceback" not in err
        assert not [c for c in cluster.state().get("calls", [])[calls_before:] if c[0] == "apply"]
    finally:
        holder.kill()
        holder.wait()
    assert submit(tmp_path, "--name", "smoke-twice") in (0, 3)  # the lock goes with its process


def test_a_local_name_whose_results_folder_holds_a_run_is_refused(tmp_path, capfd, monkeypatch):
    """``--local``: the run's storage (moto in memory) lives for one submit, so storage never
    holds the earlier run; its results folder does. Before the fix ``--name`` reused printed
    "run dup: new" and overwrote it (its record, its report; TensorBoard and MLflow mixed both)."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text('{"run_name": "dup"}')
    assert submit(tmp_path, "--local", "--name", "dup") == 2
    captured = capfd.readouterr()
    assert captured.err.strip().count("\n") == 0 and "already holds a run of that name" in captured.err
    assert "run dup: new" not in captured.out
    assert (out / "run.json").read_text() == '{"run_name": "dup"}' and not (out / "manifests").exists()
