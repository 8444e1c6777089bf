"""The CLI's Kubernetes paths (raytrain_eks/backends/eks.py, raytrain_eks/backends/kueue_queue.py)
against the real API server, with the real kubectl built for the plane: ``submit --no-wait``
applies the run's NetworkPolicy and RayJob; ``status`` and ``list`` read KubeRay's and Kueue's
own objects (a second GPU run waits in Kueue's queue behind the first); ``stop`` deletes the
RayJob through KubeRay's finalizer. What the plane cannot give (a Ray head answering ``ray job
stop``: nothing runs in KWOK's pods) the CLI reports and goes on, as it does on EKS."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fixtures_s3 import s3_server  # noqa: F401  (the session's moto S3 server)
from plane import spec_raw
from test_queue import condition, workload_of
from test_manifests import wait_for
from toml_writer import toml_text

# One xdist worker holds the session's plane: every test of the tier runs there.
pytestmark = pytest.mark.xdist_group("cluster")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "raytrain_eks"))  # EKS's Pod Identity API double (no plane has it)


@pytest.fixture
def cli(plane, namespace, s3_server, tmp_path, monkeypatch, capsys):  # noqa: F811
    import boto3

    from raytrain_eks.cli import main
    from pod_identity_double import PodIdentityApi

    from raytrain_eks.backends import eks as eks_backend
    from raytrain_eks.backends import local as local_runs

    env_file = tmp_path / "environment.toml"
    env_file.write_text(toml_text(spec_raw(namespace.name, f"{namespace.name}-")))
    client = boto3.client("s3")
    if namespace.env.bucket_name not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=namespace.env.bucket_name)
    monkeypatch.setenv("PATH", f"{plane.bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    monkeypatch.chdir(ROOT)
    # EKS's Pod Identity association API is IAM's side, outside any control plane (moto 5 lacks it)
    pod_identity = PodIdentityApi()
    monkeypatch.setattr(eks_backend, "eks_api", lambda region: pod_identity)
    monkeypatch.setattr(local_runs, "RUNS_DIR", tmp_path / "local-runs")  # this machine's own local runs stay out

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        argv = [*args, "--env", str(env_file)]
        if args[0] == "submit":
            argv += ["--out", str(tmp_path / args[args.index("--name") + 1])]
        code = main(argv)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_submit_no_wait_status_list_and_stop_against_the_real_api_server(cli, plane, namespace):
    ns = namespace.name
    code, out, err = cli("submit", "jobs/smoke.toml", "--no-wait", "--name", "first")
    assert code == 0, out + err
    assert "network policy applied" in out and "RayJob first applied" in out
    rayjob = plane.get("rayjob", "first", "-n", ns)
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "ray-jobs"
    wait_for("first admitted", lambda: condition(workload_of(namespace, "first"), "Admitted").get("status") == "True")

    code, out, err = cli("submit", "jobs/smoke.toml", "--no-wait", "--name", "second")
    assert code == 0, out + err
    wait_for("second's workload says why it waits",
             lambda: condition(workload_of(namespace, "second"), "QuotaReserved").get("message"))

    code, out, err = cli("status", "second", "-o", "json")
    assert code == 0, err
    status = json.loads(out)
    assert status["backend"] == "eks", status
    assert status["queue"].startswith("queued: 1 of 1"), status
    assert "first (admitted)" in status["queue"], status

    code, out, err = cli("list", "-o", "json")
    assert code == 0, err
    rows = {row["run"]: row for row in json.loads(out)}
    assert rows["first"]["queue"] == "admitted" and rows["second"]["queue"] == "queued 1/1", rows
    assert rows["first"]["job config"] == "jobs/smoke.toml"

    code, out, err = cli("stop", "first")
    assert code == 0, out + err
    assert "stopped first: RayJob deleted" in out
    assert plane.kubectl("get", "rayjob", "first", "-n", ns, check=False).returncode != 0  # gone
    # its GPUs are free: Kueue admits the second run now
    wait_for("second admitted after first stopped",
             lambda: condition(workload_of(namespace, "second"), "Admitted").get("status") == "True")


def test_status_of_a_run_the_cluster_does_not_have_is_refused(cli):
    code, out, err = cli("status", "nobody")
    assert code == 2
    assert "no RayJob 'nobody'" in err


def test_a_short_job_submitted_later_is_admitted_before_a_queued_experiment(cli, plane, namespace):
    """``queueing.job_priorities``: smoke is ``short`` (1000), every other job ``experiment`` (100)
    (environment.toml); `submit` labels each RayJob with its class and the real Kueue admits the
    higher priority first, whatever was queued before it (BestEffortFIFO: priority, then creation)."""
    ns = namespace.name
    assert cli("submit", "jobs/smoke.toml", "--no-wait", "--name", "long-a", "--set", "name=long")[0] == 0
    wait_for("long-a admitted", lambda: condition(workload_of(namespace, "long-a"), "Admitted").get("status") == "True")
    assert cli("submit", "jobs/smoke.toml", "--no-wait", "--name", "exp-b", "--set", "name=exp")[0] == 0
    wait_for("exp-b waits", lambda: condition(workload_of(namespace, "exp-b"), "QuotaReserved").get("message"))
    assert cli("submit", "jobs/smoke.toml", "--no-wait", "--name", "smoke-c")[0] == 0
    wait_for("smoke-c waits", lambda: condition(workload_of(namespace, "smoke-c"), "QuotaReserved").get("message"))
    labels = {run: plane.get("rayjob", run, "-n", ns)["metadata"]["labels"]["kueue.x-k8s.io/priority-class"]
              for run in ("long-a", "exp-b", "smoke-c")}
    assert labels == {"long-a": "experiment", "exp-b": "experiment", "smoke-c": "short"}, labels

    code, out, err = cli("status", "smoke-c", "-o", "json")
    assert code == 0, err
    status = json.loads(out)["queue"]
    assert status.startswith("queued: 1 of 2") and "priority short" in status, status
    code, out, err = cli("list", "-o", "json")
    rows = {row["run"]: row["queue"] for row in json.loads(out)}
    assert rows == {"long-a": "admitted", "smoke-c": "queued 1/2", "exp-b": "queued 2/2"}, rows

    assert cli("stop", "long-a")[0] == 0
    wait_for("smoke-c admitted once long-a is gone",
             lambda: condition(workload_of(namespace, "smoke-c"), "Admitted").get("status") == "True")
    # the earlier experiment still waits: the short job took the GPUs
    assert condition(workload_of(namespace, "exp-b"), "Admitted").get("status") != "True"
    assert plane.get("rayjob", "exp-b", "-n", ns)["spec"]["suspend"] is True
