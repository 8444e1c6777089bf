"""The synthesized manifests against the real plane: the API server's CRD schemas and Kueue's
admission accept them; Kueue admits the shipped RayJob onto the node groups' flavors; KubeRay
turns it into a head and workers; kube-scheduler places each on the group the spec intends.

Each check is also run on a deliberately broken manifest (a wrong node selector, no queue
label, no GPU toleration, a field of the wrong type) and must then fail: the plane, not a
model of it, says no.
"""
from __future__ import annotations

import copy
import time

import pytest

from environment.contract import NODE_GROUP_LABEL, RAY_NODE_TYPE_LABEL
from environment.queueing import QUEUE_NAME_LABEL

# One xdist worker holds the session's plane: every test of the tier runs there.
pytestmark = pytest.mark.xdist_group("cluster")

SETTLE_S = 90
"""How long a check waits for the operators and the scheduler to act (they answer in seconds;
the margin is for a loaded 2-core machine). Never a timing assertion: only an upper bound."""


def wait_for(what: str, probe, timeout: float = SETTLE_S):
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last seen: {last!r})")


def worker_templates(doc: dict) -> list[dict]:
    spec = doc["spec"].get("rayClusterSpec") or doc["spec"]
    return [group["template"]["spec"] for group in spec.get("workerGroupSpecs", [])]


# --- breakages ------------------------------------------------------------------------------------

def wrong_node_selector(doc: dict) -> None:
    for template in worker_templates(doc):
        template["nodeSelector"][NODE_GROUP_LABEL] = "gpu-typo"


def no_queue_label(doc: dict) -> None:
    doc["metadata"]["labels"].pop(QUEUE_NAME_LABEL, None)


def no_gpu_toleration(doc: dict) -> None:
    for template in worker_templates(doc):
        template.pop("tolerations", None)


BREAKAGES = {"wrong node selector": wrong_node_selector, "no queue label": no_queue_label,
             "no GPU toleration": no_gpu_toleration}


def run_smoke(namespace, shipped, mutate=None, settle_s: float = SETTLE_S) -> dict:
    """Apply the shipped smoke RayJob (through ``mutate``) and return where its pods went:
    {"admitted": bool, "pods": {pod name: (ray node type, node group or None, why pending)}}.
    Raises AssertionError when Kueue does not admit it or a pod stays unplaced."""
    docs = namespace.manifest(shipped / "rayjob-smoke.k8s.yaml", mutate)
    namespace.plane.apply_objects(docs)
    name = docs[0]["metadata"]["name"]
    groups = {n["metadata"]["name"]: n["metadata"]["labels"].get(NODE_GROUP_LABEL)
              for n in namespace.plane.get("nodes")["items"]}

    def admitted():
        job = namespace.plane.get("rayjob", name, "-n", namespace.name)
        # KubeRay's RayJobSpec.Suspend is ``json:"suspend,omitempty"``: unsuspended, the field is gone
        return not job["spec"].get("suspend") and job

    wait_for(f"Kueue admits RayJob {name} (spec.suspend false)", admitted, settle_s)
    expected = 1 + sum(g.get("replicas", 0) for g in docs[0]["spec"]["rayClusterSpec"]["workerGroupSpecs"])

    def placed():
        pods = [p for p in namespace.pods() if RAY_NODE_TYPE_LABEL in p["metadata"]["labels"]]
        out = {}
        for pod in pods:
            why = "; ".join(c.get("message", "") for c in pod["status"].get("conditions", [])
                            if c["type"] == "PodScheduled" and c["status"] == "False")
            out[pod["metadata"]["name"]] = (pod["metadata"]["labels"][RAY_NODE_TYPE_LABEL],
                                            groups.get(pod["spec"].get("nodeName")), why)
        return out if len(out) == expected and all(group for _, group, _ in out.values()) else None

    return wait_for(f"KubeRay's {expected} pods of {name} placed on nodes", placed, settle_s)


def test_shipped_manifests_pass_the_api_servers_schemas_and_kueues_admission(namespace, shipped):
    files = sorted(shipped.glob("*.k8s.yaml"))
    assert {f.name for f in files} >= {"raycluster.k8s.yaml", "rayjob-smoke.k8s.yaml", "network-policy.k8s.yaml"}
    for path in files:
        docs = namespace.manifest(path)
        proc = namespace.plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=_dump(docs),
                                       check=False)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr.strip()}"


def test_a_field_of_the_wrong_type_is_refused_by_the_crd_schema(namespace, shipped):
    def wrong_type(doc):
        doc["spec"]["ttlSecondsAfterFinished"] = "ten minutes"

    docs = namespace.manifest(shipped / "rayjob-smoke.k8s.yaml", wrong_type)
    proc = namespace.plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=_dump(docs), check=False)
    assert proc.returncode != 0
    # the server-side apply typing of the CRD schema (structured-merge-diff)
    assert ".spec.ttlSecondsAfterFinished: expected numeric" in proc.stderr, proc.stderr


def test_the_smoke_rayjob_is_admitted_and_its_pods_land_on_their_node_groups(namespace, shipped):
    pods = run_smoke(namespace, shipped)
    kinds = sorted((kind, group) for kind, group, _ in pods.values())
    # the head on the system group (it carries no GPU toleration), each GPU worker on a node of
    # the GPU group, one per node (each asks for all 4 GPUs of a g6.12xlarge)
    assert kinds == [("head", "system"), ("worker", "gpu"), ("worker", "gpu")], pods
    nodes = {namespace.plane.get("pod", p, "-n", namespace.name)["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 3


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_rayjob_is_not_placed(namespace, shipped, breakage):
    with pytest.raises(AssertionError) as caught:
        run_smoke(namespace, shipped, BREAKAGES[breakage], settle_s=30)
    print(f"{breakage}: {caught.value}")
    job = namespace.plane.get("rayjobs", "-n", namespace.name)["items"][0]
    workloads = namespace.plane.get("workloads.kueue.x-k8s.io", "-n", namespace.name)["items"]
    if breakage == "no queue label":
        # Kueue leaves an unlabelled job alone: no Workload, and it stays suspended as shipped
        assert workloads == [] and job["spec"]["suspend"] is True
    else:
        # Kueue finds no flavor whose node labels / taints the worker pod set matches
        [workload] = workloads
        reserved = {c["type"]: c for c in workload["status"].get("conditions", [])}.get("QuotaReserved", {})
        assert reserved.get("status") == "False", workload["status"]
        assert "flavor" in reserved.get("message", "").lower(), reserved


def _dump(docs) -> str:
    import yaml

    return yaml.safe_dump_all(copy.deepcopy(docs), sort_keys=False)
