"""The fixtures of the EKS CLI tests: a kubectl double (kubectl_double.py) whose RayJobs move as
KubeRay v1.7.0's controller moves them, with Kueue v0.19.2 in front (kueue_double.py: the
ClusterQueue, flavors and priority classes the add-on installs), and moto's bucket."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from raytrain_eks.cli import main

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("kubectl_double.py")
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "runs" / "efa-full"
DRIVER_LOG = "step 10/20 loss 9.81 tokens/s 530 ETA 12 s\neval step 10: held-out loss 9.90\ncheckpoint step 10\nverdict: ACCEPTED\n"


@pytest.fixture
def cluster(tmp_path, monkeypatch, s3_server):  # noqa: F811
    import boto3

    from environment import load_environment
    from environment.queueing import kueue_objects

    env = load_environment(ROOT / "environment.toml")
    client = boto3.client("s3")
    if env.bucket_name not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=env.bucket_name)
    results = tmp_path / "results"
    shutil.copytree(FIXTURE_RUN, results)
    (results / "logs").mkdir()
    (results / "logs" / "driver.log").write_text(DRIVER_LOG)
    state = tmp_path / "kubectl.json"
    state.write_text(json.dumps({"rayjobs": {}, "cluster_ready_after": 4, "submitter_runs": 3, "outcome": "SUCCEEDED",
                                 "results_dir": str(results), "run_uri": env.storage_uri + "/{run}",
                                 "driver_log": DRIVER_LOG, "kueue": {"objects": kueue_objects(env)},
                                 "gpu_capacity": sum(g.gpus_per_node * g.max_nodes for g in env.gpu_node_groups),
                                 "context_cluster": f"arn:aws:eks:{env.cluster.region}:111122223333:cluster/{env.cluster.name}"}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    (bin_dir / "kubectl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state))
    monkeypatch.chdir(ROOT)
    from raytrain_eks.backends import local as local_runs

    monkeypatch.setattr(local_runs, "RUNS_DIR", tmp_path / "local-runs")  # this machine's own local runs stay out
    from pod_identity_double import PodIdentityApi
    from raytrain_eks.backends import eks as eks_backend

    pod_identity = PodIdentityApi()  # moto has no Pod Identity associations (pod_identity_double.py)
    monkeypatch.setattr(eks_backend, "eks_api", lambda region: pod_identity)

    class Cluster:
        storage = env.storage_uri
        bucket = env.bucket_name
        s3 = client
        identity = pod_identity

        @staticmethod
        def state() -> dict:
            return json.loads(state.read_text())

        @staticmethod
        def set(**values) -> None:
            state.write_text(json.dumps({**json.loads(state.read_text()), **values}))

    return Cluster


def submit(tmp_path, *args: str) -> int:
    return main(["submit", "jobs/smoke.toml", "--poll-seconds", "0", "--out", str(tmp_path / "out"), *args])
