"""The node paths of self-healing (issue 50) and spot capacity (issue 53) on the real plane: a GPU
node tainted, cordoned, NotReady or deleted, and what the real kube-controller-manager,
kube-scheduler and KubeRay operator then do with the shipped smoke RayJob's workers. Nothing here
models them: the node is changed the way an operator's ``kubectl`` or a lost instance changes it,
and the test reads where the pods went.

- taint / cordon / NotReady: the scheduler puts no new worker on that node (a cordon is
  ``spec.unschedulable``; a NotReady node gets ``node.kubernetes.io/not-ready:NoSchedule`` from the
  node lifecycle controller, pkg/controller/nodelifecycle/node_lifecycle_controller.go
  ``doNoScheduleTaintingPass``); the worker it cannot place waits unscheduled, naming why.
- drained (``kubectl drain``: a cordon, then each pod evicted through the Eviction API, as a spot
  interruption handler or a node repair drains): KubeRay replaces the evicted worker and the
  scheduler keeps the replacement off the cordoned node.
- deleted: the pod garbage collector removes the pods bound to the missing node
  (pkg/controller/podgc/gc_controller.go ``gcOrphaned``, after its 40 s quarantine), KubeRay
  sees its worker group one short and creates a new worker pod, which the scheduler places once a
  node of the group is back (cluster-autoscaler's replacement: the same node re-created).

Each check is also run with a manifest broken as a user would break it (a toleration of every
taint; a wrong node selector) and must then fail. Every test leaves the node as the spec made it.
"""
from __future__ import annotations

import json

import pytest

from environment.contract import NODE_GROUP_LABEL, RAY_NODE_TYPE_LABEL
from plane import KWOK_ANNOTATION, nodes, spec
from test_manifests import SETTLE_S, wait_for, wrong_node_selector, worker_templates

# One xdist worker holds the session's plane: every test of the tier runs there.
pytestmark = pytest.mark.xdist_group("cluster")

NODE = "gpu-0"
"""The GPU node each test takes out (the smoke job's two workers need both GPU nodes)."""
HEALTH_TAINT = {"key": "raytrain.io/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
"""A taint an operator (or a health agent) puts on a node whose GPU went bad."""
PODGC_S = 240
"""The pod garbage collector's quarantine (40 s) and check period (20 s), with a loaded machine's margin."""


def tolerate_everything(doc: dict) -> None:
    """The breakage: a worker template that tolerates every taint (``operator: Exists``, no key)."""
    for template in worker_templates(doc):
        template["tolerations"] = [{"operator": "Exists"}]


def workers(namespace) -> dict[str, tuple[str | None, str]]:
    """worker pod name -> (its node or None, why it is unscheduled)."""
    out = {}
    for pod in namespace.pods(f"{RAY_NODE_TYPE_LABEL}=worker"):
        why = "; ".join(c.get("message", "") for c in pod["status"].get("conditions", [])
                        if c["type"] == "PodScheduled" and c["status"] == "False")
        out[pod["metadata"]["name"]] = (pod["spec"].get("nodeName"), why)
    return out


def apply_smoke(namespace, shipped, mutate=None) -> str:
    docs = namespace.manifest(shipped / "rayjob-smoke.k8s.yaml", mutate)
    namespace.plane.apply_objects(docs)
    return docs[0]["metadata"]["name"]


def settled_workers(namespace, count: int = 2):
    """The workers once KubeRay made ``count`` of them and the scheduler decided on each (bound,
    or unschedulable with its reason)."""
    return wait_for(f"{count} workers each placed or refused by the scheduler", lambda: (
        (w := workers(namespace)) and len(w) == count and all(node or why for node, why in w.values()) and w), SETTLE_S)


@pytest.fixture
def gpu_node(plane):
    """``NODE``, restored afterwards to what the spec made (deleted and re-created from
    tests/cluster/plane.py ``nodes``, then Ready again under kwok). Before: the GPU nodes hold no
    pod of an earlier test (its namespace is deleted without waiting)."""
    wait_for("the GPU nodes free of earlier tests' pods", lambda: not [
        p for p in plane.get("pods", "-A")["items"] if (p["spec"].get("nodeName") or "").startswith("gpu-")], SETTLE_S)
    yield NODE
    [manifest] = [n for n in nodes(spec()) if n["metadata"]["name"] == NODE]
    plane.kubectl("delete", "node", NODE, "--wait=true", "--timeout=60s", check=False)
    plane.apply_objects([manifest], server_side=False)
    wait_for(f"{NODE} Ready again", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (plane.get("node", NODE).get("status") or {}).get("conditions", [])), SETTLE_S)


def assert_nothing_new_on(namespace, shipped, node: str, mutate=None) -> str:
    """The smoke job's workers: one on the other GPU node, the other unscheduled, none on ``node``."""
    apply_smoke(namespace, shipped, mutate)
    placed = settled_workers(namespace)
    print(json.dumps(placed))
    assert node not in {n for n, _ in placed.values()}, f"a new worker was placed on {node}: {placed}"
    assert sorted(bool(n) for n, _ in placed.values()) == [False, True], placed
    [why] = [why for n, why in placed.values() if not n]
    return why


def take_out(plane, node: str, how: str) -> None:
    if how == "tainted":
        taint = HEALTH_TAINT
        plane.kubectl("taint", "node", node, f"{taint['key']}={taint['value']}:{taint['effect']}")
    elif how == "cordoned":
        plane.kubectl("cordon", node)
    elif how == "NotReady":
        # The kubelet stops reporting: kwok lets go of the node (its annotation removed), and the
        # node's Ready condition turns False, as a kubelet's last status says before it goes.
        [key] = KWOK_ANNOTATION
        plane.kubectl("annotate", "node", node, f"{key}-")
        ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "GPU node lost"}
        patch = {"status": {"conditions": [ready]}}
        plane.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))
        wait_for(f"the node lifecycle controller taints {node} not-ready", lambda: any(
            t["key"] == "node.kubernetes.io/not-ready" for t in plane.get("node", node)["spec"].get("taints") or []),
            SETTLE_S)
    else:
        raise ValueError(how)


WHY = {"tainted": "untolerated taint", "cordoned": "unschedulable", "NotReady": "untolerated taint"}
"""What kube-scheduler v1.36 says of the node taken out (its message counts nodes by reason, naming
no taint key: ``1 node(s) had untolerated taint(s)``)."""


@pytest.mark.parametrize("how", list(WHY))
def test_no_new_worker_lands_on_a_gpu_node_taken_out(namespace, shipped, gpu_node, how):
    take_out(namespace.plane, gpu_node, how)
    why = assert_nothing_new_on(namespace, shipped, gpu_node)
    assert WHY[how] in why, why  # the scheduler names the taint / the cordon


@pytest.mark.parametrize("how", list(WHY))
def test_a_worker_that_tolerates_every_taint_lands_on_the_node_taken_out(namespace, shipped, gpu_node, how):
    """The breakage the test above must catch: a toleration of every taint (``operator: Exists``)."""
    take_out(namespace.plane, gpu_node, how)
    with pytest.raises(AssertionError) as caught:
        assert_nothing_new_on(namespace, shipped, gpu_node, tolerate_everything)
    print(f"{how}, tolerating every taint: {caught.value}")
    assert f"placed on {gpu_node}" in str(caught.value)


def deleted_and_replaced(namespace, shipped, node: str, mutate=None) -> tuple[dict, dict]:
    """Run the smoke job, delete ``node`` under one of its workers, re-create it (the replacement
    instance); return the workers before and after."""
    plane = namespace.plane
    apply_smoke(namespace, shipped, mutate)
    before = wait_for("both workers placed on the GPU nodes", lambda: (
        (w := workers(namespace)) and len(w) == 2 and all(n for n, _ in w.values()) and w), SETTLE_S)
    [lost] = [name for name, (n, _) in before.items() if n == node]
    [manifest] = [n for n in nodes(spec()) if n["metadata"]["name"] == node]
    plane.kubectl("delete", "node", node, "--wait=true", "--timeout=60s")
    wait_for(f"the pod garbage collector removes {lost}", lambda: lost not in workers(namespace), PODGC_S)
    plane.apply_objects([manifest], server_side=False)
    after = wait_for(f"KubeRay's new worker placed on the re-created {node}", lambda: (
        (w := workers(namespace)) and len(w) == 2 and lost not in w and node in {n for n, _ in w.values()} and w), SETTLE_S)
    return before, after


def test_a_deleted_gpu_node_takes_its_worker_and_kuberay_makes_a_new_one(namespace, shipped, gpu_node):
    before, after = deleted_and_replaced(namespace, shipped, gpu_node)
    print(json.dumps({"before": before, "after": after}))
    kept = set(before) & set(after)
    assert len(kept) == 1  # the worker on the other node is untouched
    groups = {n["metadata"]["name"]: n["metadata"]["labels"].get(NODE_GROUP_LABEL)
              for n in namespace.plane.get("nodes")["items"]}
    assert [groups[n] for n, _ in after.values()] == ["gpu", "gpu"]


def test_with_a_wrong_node_selector_no_worker_comes_back(namespace, shipped, gpu_node):
    """The breakage: the workers' node selector names no group, so there is nothing to replace."""
    with pytest.raises(AssertionError) as caught:
        deleted_and_replaced(namespace, shipped, gpu_node, wrong_node_selector)
    print(f"wrong node selector: {caught.value}")


def drained(namespace, shipped, node: str, mutate=None) -> tuple[dict, dict]:
    """Run the smoke job, ``kubectl drain`` the node under one of its workers (cordon, then evict
    through the Eviction API, as a spot interruption handler or a node repair does); return the
    workers before and once KubeRay has made the evicted one's replacement and the scheduler
    decided on it."""
    plane = namespace.plane
    apply_smoke(namespace, shipped, mutate)
    before = wait_for("both workers placed on the GPU nodes", lambda: (
        (w := workers(namespace)) and len(w) == 2 and all(n for n, _ in w.values()) and w), SETTLE_S)
    [evicted] = [name for name, (n, _) in before.items() if n == node]
    # the worker pods have a controller (their RayCluster), so drain evicts them without --force
    plane.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s", timeout=180)
    after = wait_for("KubeRay's replacement worker placed or refused", lambda: (
        (w := workers(namespace)) and len(w) == 2 and evicted not in w and all(n or why for n, why in w.values()) and w),
        SETTLE_S)
    return before, after


def check_drain(namespace, shipped, node: str, mutate=None) -> None:
    before, after = drained(namespace, shipped, node, mutate)
    print(json.dumps({"before": before, "after": after}))
    assert node not in {n for n, _ in after.values()}, f"the replacement was placed on {node}: {after}"
    [(_, why)] = [v for name, v in after.items() if name not in before]
    assert WHY["cordoned"] in why, why  # the drained node is cordoned; the other GPU node is taken


def test_a_drained_gpu_node_loses_its_worker_and_the_replacement_keeps_off_it(namespace, shipped, gpu_node):
    check_drain(namespace, shipped, gpu_node)


def test_a_worker_that_tolerates_every_taint_goes_back_onto_the_drained_node(namespace, shipped, gpu_node):
    """The breakage the test above must catch: a toleration of every taint
    (``node.kubernetes.io/unschedulable``, which a cordon puts on the node, included)."""
    with pytest.raises(AssertionError) as caught:
        check_drain(namespace, shipped, gpu_node, tolerate_everything)
    print(f"drained, tolerating every taint: {caught.value}")
    assert f"placed on {gpu_node}" in str(caught.value)
