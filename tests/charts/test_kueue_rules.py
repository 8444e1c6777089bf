"""Every synthesized RayJob as Kueue v0.19.2 judges it (charts_oracles/kueue_rayjob.py): its
webhooks at ``kubectl apply``, then whether the ClusterQueue the spec derives can ever admit it.
"""
from __future__ import annotations

import copy

import pytest
from charts_oracles.kueue_rayjob import (
    PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL, admission, managed, pod_sets, suspended_at_creation, validate_create,
)
from charts_oracles.kuberay_validation import validate_rayjob_spec

from environment.queueing import kueue_objects

VARIANTS = ["default_synth", "large_synth"]


def rayjobs(synth):
    return [(chart, obj) for chart, objs in synth.docs.items() for obj in objs if obj["kind"] == "RayJob"]


def queue_objects(env) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in kueue_objects(env):
        out.setdefault(obj["kind"], []).append(obj)
    return out


def kueue_problems(rayjob: dict, env) -> list[str]:
    """Everything that keeps a RayJob of its own cluster from being queued and admitted."""
    objects = queue_objects(env)
    (local_queue,) = objects["LocalQueue"]
    (cluster_queue,) = objects["ClusterQueue"]
    problems = validate_create(rayjob)
    if not managed(rayjob):
        return problems + ["not managed by Kueue: it starts at once, whoever holds the GPUs"]
    labels = rayjob["metadata"]["labels"]
    if labels[QUEUE_NAME_LABEL] != local_queue["metadata"]["name"]:
        problems.append(f"queue {labels[QUEUE_NAME_LABEL]!r} is not the LocalQueue {local_queue['metadata']['name']!r}")
    if labels.get(PRIORITY_CLASS_LABEL) not in {p["metadata"]["name"] for p in objects["WorkloadPriorityClass"]}:
        problems.append(f"priority class {labels.get(PRIORITY_CLASS_LABEL)!r} does not exist")
    if rayjob["spec"].get("suspend") is not True:
        problems.append("not created suspended")
    kuberay = validate_rayjob_spec({**rayjob, "spec": {**rayjob["spec"], "suspend": True}})
    problems += [kuberay] if kuberay else []
    return problems + admission(rayjob, cluster_queue, objects["ResourceFlavor"])[1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_own_cluster_rayjob_is_queued_and_admissible(variant, request):
    synth = request.getfixturevalue(variant)
    own = [(c, o) for c, o in rayjobs(synth) if "clusterSelector" not in o["spec"]]
    assert own
    assert {c: kueue_problems(o, synth.env) for c, o in own if kueue_problems(o, synth.env)} == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_on_cluster_rayjobs_are_not_labelled_so_never_suspended(variant, request):
    # Kueue's webhook suspends ANY labelled RayJob; it never admits a clusterSelector one, and
    # KubeRay refuses a suspended clusterSelector RayJob (validation.go:561-562).
    synth = request.getfixturevalue(variant)
    on_cluster = [(c, o) for c, o in rayjobs(synth) if "clusterSelector" in o["spec"]]
    assert on_cluster
    for chart, obj in on_cluster:
        assert not suspended_at_creation(obj), chart
        assert validate_create(obj) == [], chart


def test_priorities_put_smoke_ahead_of_experiments(default_synth):
    values = {p["metadata"]["name"]: p["value"] for p in queue_objects(default_synth.env)["WorkloadPriorityClass"]}
    smoke = default_synth.one("rayjob-smoke")["metadata"]["labels"][PRIORITY_CLASS_LABEL]
    finetune = default_synth.one("rayjob-finetune-qwen")["metadata"]["labels"][PRIORITY_CLASS_LABEL]
    assert values[smoke] > values[finetune]


def test_the_oracle_refuses_unlabelled_and_incompatible_rayjobs(default_synth):
    env = default_synth.env
    good = default_synth.one("rayjob-finetune-qwen")
    unlabelled = copy.deepcopy(good)
    del unlabelled["metadata"]["labels"][QUEUE_NAME_LABEL]
    assert kueue_problems(unlabelled, env) == ["not managed by Kueue: it starts at once, whoever holds the GPUs"]
    kept = copy.deepcopy(good)
    kept["spec"]["shutdownAfterJobFinishes"] = False
    assert "spec.shutdownAfterJobFinishes: a kueue managed job should delete the cluster after finishing" \
        in kueue_problems(kept, env)
    autoscaled = copy.deepcopy(good)
    autoscaled["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    assert any("enableInTreeAutoscaling" in p for p in kueue_problems(autoscaled, env))
    selector = copy.deepcopy(default_synth.one("rayjob-smoke-on-cluster"))
    selector["metadata"]["labels"][QUEUE_NAME_LABEL] = "ray-jobs"
    assert suspended_at_creation(selector) and not managed(selector)
    # KubeRay parks it in ValidationFailed (its first rule that a suspended on-cluster job breaks)
    refusal = validate_rayjob_spec({**selector, "spec": {**selector["spec"], "suspend": True}})
    assert refusal and refusal.startswith("The RayJob spec is invalid") and "suspend" in refusal
    both = copy.deepcopy(good)
    both["spec"]["clusterSelector"] = {"ray.io/cluster": "raytrain"}
    assert validate_create(both) == ["spec.clusterSelector: a kueue managed job should not use an existing cluster"]


def test_the_oracle_refuses_a_job_larger_than_the_quota(default_synth):
    good = default_synth.one("rayjob-finetune-qwen")
    objects = queue_objects(default_synth.env)
    (cluster_queue,) = objects["ClusterQueue"]
    chosen, problems = admission(good, cluster_queue, objects["ResourceFlavor"])
    assert problems == [] and chosen == {"head": "system", "gpu": "gpu-gpu", "submitter": "system"}
    bigger = copy.deepcopy(good)
    bigger["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] += 1
    assert admission(bigger, cluster_queue, objects["ResourceFlavor"])[1] == [
        "couldn't assign flavors to pod set gpu: insufficient quota for cpu in flavor gpu-gpu; "
        "flavor system doesn't match node affinity"]
    # a second job while the first holds its reservation: it waits (not admitted)
    usage = {}
    assert admission(good, cluster_queue, objects["ResourceFlavor"], usage)[1] == []
    assert admission(good, cluster_queue, objects["ResourceFlavor"], usage)[1]


def test_a_worker_group_counts_as_kueue_sees_it_after_the_crds_defaults():
    """The API server applies the RayJob CRD's defaults before any webhook or controller reads the
    object (KubeRay v1.7.0 ``ray.io_rayjobs.yaml`` workerGroupSpecs: ``replicas`` default 0,
    ``numOfHosts`` default 1), so Kueue v0.19.2's ``effectiveWorkerCount``
    (``pkg/controller/jobs/raycluster/common.go:64-74``: replicas x numOfHosts when > 1) sees 0
    for a group that leaves ``replicas`` out: it reserves no quota for it."""
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}
    job = {"spec": {"rayClusterSpec": {"headGroupSpec": {"template": pod}, "workerGroupSpecs": [
        {"groupName": "unset", "template": pod}, {"groupName": "hosts", "replicas": 2, "numOfHosts": 4, "template": pod}]}}}
    assert {ps["name"]: ps["count"] for ps in pod_sets(job)} == {"head": 1, "unset": 0, "hosts": 8, "submitter": 1}
