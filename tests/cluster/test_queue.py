"""Kueue v0.19.2 in front of the GPU node groups, on the real plane: the ClusterQueue the stacks
install (quota = the groups at ``max_nodes``) admits a first GPU RayJob and holds a second behind
it until the first one's GPUs are free; with a GPU's worth of quota more than a group has, the
second would have been admitted (the breakage), so the hold is the quota's, not chance."""
from __future__ import annotations

import pytest

from test_manifests import SETTLE_S, wait_for

# One xdist worker holds the session's plane: every test of the tier runs there.
pytestmark = pytest.mark.xdist_group("cluster")


def workload_of(namespace, rayjob: str) -> dict | None:
    for workload in namespace.plane.get("workloads.kueue.x-k8s.io", "-n", namespace.name)["items"]:
        if any(o.get("kind") == "RayJob" and o.get("name") == rayjob for o in workload["metadata"].get("ownerReferences", [])):
            return workload
    return None


def condition(workload: dict | None, kind: str) -> dict:
    return {c["type"]: c for c in ((workload or {}).get("status") or {}).get("conditions", [])}.get(kind, {})


def two_smoke_jobs(namespace, shipped) -> tuple[str, str]:
    names = []
    for suffix in ("first", "second"):
        def rename(doc, suffix=suffix):
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
        docs = namespace.manifest(shipped / "rayjob-smoke.k8s.yaml", rename)
        namespace.plane.apply_objects(docs)
        names.append(docs[0]["metadata"]["name"])
        if suffix == "first":
            wait_for(f"{names[0]} admitted", lambda: condition(workload_of(namespace, names[0]), "Admitted").get("status") == "True")
    return names[0], names[1]


def test_kueue_admits_the_first_gpu_rayjob_and_queues_the_second_until_it_is_gone(namespace, shipped):
    first, second = two_smoke_jobs(namespace, shipped)
    pending = wait_for(f"{second}'s workload reports why it waits", lambda: condition(
        workload_of(namespace, second), "QuotaReserved").get("message") and workload_of(namespace, second))
    reserved = condition(pending, "QuotaReserved")
    assert reserved["status"] == "False"
    assert "nvidia.com/gpu" in reserved["message"], reserved  # the GPUs are what it waits for
    assert namespace.plane.get("rayjob", second, "-n", namespace.name)["spec"]["suspend"] is True
    namespace.plane.kubectl("delete", "rayjob", first, "-n", namespace.name, "--wait=true", "--timeout=60s")
    wait_for(f"{second} admitted once {first} is gone",
             lambda: condition(workload_of(namespace, second), "Admitted").get("status") == "True", SETTLE_S)


def test_with_more_gpu_quota_than_the_nodes_the_second_job_is_admitted_too(namespace, shipped):
    # The breakage the test above must catch: a ClusterQueue counting twice the groups' GPUs.
    queue = namespace.plane.get("clusterqueue", f"{namespace.name}-raytrain")
    for group in queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                if resource["name"] in ("nvidia.com/gpu", "vpc.amazonaws.com/efa", "cpu", "memory") and flavor["name"].endswith("gpu-gpu"):
                    quantity = resource["nominalQuota"]
                    number = int(quantity.rstrip("Gi"))
                    resource["nominalQuota"] = f"{number * 2}{'Gi' if quantity.endswith('Gi') else ''}"
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        queue["metadata"].pop(key, None)
    queue.pop("status", None)
    namespace.plane.apply_objects([queue])
    first, second = two_smoke_jobs(namespace, shipped)
    wait_for(f"{second} admitted beside {first}",
             lambda: condition(workload_of(namespace, second), "Admitted").get("status") == "True")
