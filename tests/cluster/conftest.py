"""The ``cluster`` tier's fixtures: ONE real control plane per test session (tests/cluster/plane.py),
and one namespace per test with the queue objects the stacks install for a Ray namespace.

The plane is built by scripts/build-control-plane.sh (``make test`` builds it first). Where it
cannot start (binaries missing, a component exiting), every test of the tier FAILS with the
reason: it is never skipped, so CI cannot pass without it.
"""
from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plane import Plane, PlaneError, spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def plane(tmp_path_factory):
    """The running plane (etcd, apiserver, controller-manager, scheduler, kwok, KubeRay, Kueue)
    with the spec's nodes, CRDs and add-on configuration."""
    env = spec()
    running = Plane(workdir=tmp_path_factory.mktemp("plane"), cluster_name=env.cluster.eks_name)
    try:
        running.start(env)
    except (PlaneError, OSError) as err:
        running.stop()
        pytest.fail(f"the cluster tier's control plane did not start: {err}", pytrace=False)
    yield running
    running.stop()


@dataclass
class Namespace:
    name: str
    env: object
    plane: Plane

    def manifest(self, path: Path, mutate=None) -> list[dict]:
        """The documents of a synthesized manifest, moved to this namespace (the only place the
        manifests name it), each passed through ``mutate`` (a test's deliberate breakage)."""
        from raytrain_eks.backends.eks import run_service_account

        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        # a RayJob runs as its own service account, which `submit` creates before the RayJob
        # (raytrain_eks/runs/submit.py); the long-lived cluster's is the namespace's (the fixture's)
        # (an ``-on-cluster`` RayJob has no cluster of its own: a clusterSelector, no rayClusterSpec)
        runs = {d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"].get("serviceAccountName")
                for d in docs if d.get("kind") == "RayJob" and "rayClusterSpec" in d["spec"]}
        if runs - {None}:
            self.plane.apply_objects([run_service_account(run, self.name) for run in sorted(runs - {None})])
        for doc in docs:
            if "namespace" in doc.get("metadata", {}):
                doc["metadata"]["namespace"] = self.name
            if mutate:
                mutate(doc)
        return docs

    def pods(self, selector: str = "") -> list[dict]:
        args = ["pods", "-n", self.name] + (["-l", selector] if selector else [])
        return self.plane.get(*args)["items"]


@pytest.fixture
def namespace(plane, request):
    """A namespace of this test, with the Ray service account and the Kueue objects the stacks
    install for a Ray namespace (flavors and ClusterQueue prefixed with the namespace, so each
    test's quota is its own), deleted with everything in it afterwards."""
    from environment.queueing import kueue_objects

    # short enough for queueing.name_prefix (40 characters), unique per test (and parameter)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:24].rstrip("-")
    name = f"t-{slug}-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]}"
    env = spec(name, f"{name}-")
    plane.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                         {"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": env.ray.service_account, "namespace": name}}])
    queue = [o for o in kueue_objects(env) if o["kind"] != "WorkloadPriorityClass"]
    plane.apply_objects(queue)
    yield Namespace(name=name, env=env, plane=plane)
    plane.kubectl("delete", "rayjobs,rayclusters", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
    for obj in queue:
        if obj["kind"] in ("ClusterQueue", "ResourceFlavor"):
            plane.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Path:
    """The cdk8s app's output for the template spec (charts.main.synth, as ``cdk8s synth`` runs it)."""
    from charts.main import quiet_node_floor_warning, synth

    quiet_node_floor_warning()
    out = tmp_path_factory.mktemp("dist")
    synth(spec(), out)
    return out
