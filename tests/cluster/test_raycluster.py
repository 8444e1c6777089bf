"""The long-lived RayCluster as Kueue v0.19.2 manages it on the real plane: an elastic workload
(``kueue.x-k8s.io/elastic-job``) whose head is admitted first, and whose scale-up (the Ray
autoscaler raising a worker group's ``replicas``) is a new Workload slice admitted against the
same quota; its worker pods stay behind Kueue's scheduling gate until then, and then land on
the GPU group. Without the annotation Kueue's own webhook refuses the autoscaling cluster."""
from __future__ import annotations

import json

import pytest

from environment.contract import NODE_GROUP_LABEL, RAY_NODE_TYPE_LABEL
from environment.queueing import ELASTIC_JOB
from test_manifests import wait_for

# One xdist worker holds the session's plane: every test of the tier runs there.
pytestmark = pytest.mark.xdist_group("cluster")


def placed_groups(namespace, node_type: str) -> list[str | None]:
    groups = {n["metadata"]["name"]: n["metadata"]["labels"].get(NODE_GROUP_LABEL)
              for n in namespace.plane.get("nodes")["items"]}
    return sorted(groups.get(p["spec"].get("nodeName")) or "-" for p in namespace.pods(f"{RAY_NODE_TYPE_LABEL}={node_type}"))


def test_the_long_lived_raycluster_is_admitted_and_scales_up_through_a_workload_slice(namespace, shipped):
    [cluster] = namespace.manifest(shipped / "raycluster.k8s.yaml")
    namespace.plane.apply_objects([cluster])
    name = cluster["metadata"]["name"]
    wait_for("the head admitted and placed on the system group", lambda: placed_groups(namespace, "head") == ["system"])
    assert placed_groups(namespace, "worker") == []
    # the Ray autoscaler's scale-up: two GPU workers
    patch = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    namespace.plane.kubectl("patch", "raycluster", name, "-n", namespace.name, "--type=json", "-p", json.dumps(patch))
    wait_for("two GPU workers admitted through a new slice and placed on the GPU group",
             lambda: placed_groups(namespace, "worker") == ["gpu", "gpu"])
    workloads = namespace.plane.get("workloads.kueue.x-k8s.io", "-n", namespace.name)["items"]
    admitted = [w for w in workloads if any(c["type"] == "Admitted" and c["status"] == "True"
                                            for c in (w.get("status") or {}).get("conditions", []))]
    assert admitted, workloads
    assert all(not p["spec"].get("schedulingGates") for p in namespace.pods(f"{RAY_NODE_TYPE_LABEL}=worker"))


def test_without_the_elastic_annotation_kueue_refuses_the_autoscaling_cluster(namespace, shipped):
    def not_elastic(doc):
        doc["metadata"]["annotations"].pop(ELASTIC_JOB)

    docs = namespace.manifest(shipped / "raycluster.k8s.yaml", not_elastic)
    proc = namespace.plane.kubectl("apply", "--server-side", "-f", "-", input=_dump(docs), check=False)
    assert proc.returncode != 0
    assert "admission webhook" in proc.stderr and "autoscal" in proc.stderr.lower(), proc.stderr


def _dump(docs) -> str:
    import yaml

    return yaml.safe_dump_all(docs, sort_keys=False)
