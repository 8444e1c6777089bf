"""The long-lived RayCluster as Kueue v0.19.2 judges it (charts_oracles/kueue_raycluster.py): its
webhooks at ``kubectl apply``, and its workers counted against the ClusterQueue, so a RayJob is not
admitted onto GPUs the cluster holds (nor the cluster's scale-up onto GPUs a RayJob holds)."""
from __future__ import annotations

import copy

import pytest
from charts_oracles.kueue_raycluster import ELASTIC_JOB, managed, pod_sets, validate_create, validate_update
from charts_oracles.kueue_rayjob import PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL, admission
from charts_testspec import SPEC_TOML, make_env, run_synth, spec_raw
from test_kueue_rules import queue_objects

from environment.queueing import KUEUE_FRAMEWORKS, kueue_values

VARIANTS = ["default_synth", "large_synth"]


def _queue(env):
    objects = queue_objects(env)
    (cluster_queue,) = objects["ClusterQueue"]
    return cluster_queue, objects["ResourceFlavor"]


def _at_max(raycluster: dict) -> dict[str, int]:
    """What the autoscaler writes when every worker is asked for."""
    return {g["groupName"]: g["maxReplicas"] for g in raycluster["spec"]["workerGroupSpecs"]}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_long_lived_raycluster_is_a_queued_elastic_workload(variant, request):
    synth = request.getfixturevalue(variant)
    cluster = synth.one("raycluster")
    objects = queue_objects(synth.env)
    labels = cluster["metadata"]["labels"]
    assert managed(cluster) and labels[QUEUE_NAME_LABEL] == objects["LocalQueue"][0]["metadata"]["name"]
    assert labels[PRIORITY_CLASS_LABEL] in {p["metadata"]["name"] for p in objects["WorkloadPriorityClass"]}
    assert cluster["spec"]["enableInTreeAutoscaling"] is True and cluster["metadata"]["annotations"][ELASTIC_JOB] == "true"
    assert validate_create(cluster) == []
    assert "ray.io/raycluster" in KUEUE_FRAMEWORKS
    assert "ray.io/raycluster" in kueue_values(synth.env, "0.19.2", {})["managerConfig"]["controllerManagerConfigYaml"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_its_head_at_rest_and_its_workers_at_max_fit_the_quota(variant, request):
    synth = request.getfixturevalue(variant)
    cluster = synth.one("raycluster")
    cluster_queue, flavors = _queue(synth.env)
    rest = pod_sets(cluster)
    assert [ps["count"] for ps in rest] == [1, 0]  # the head; no worker until a job asks
    assert admission(cluster, cluster_queue, flavors, sets=rest)[1] == []
    assert admission(cluster, cluster_queue, flavors, sets=pod_sets(cluster, _at_max(cluster)))[1] == []


@pytest.fixture(scope="module")
def shipped_system_synth(tmp_path_factory):
    """The test spec with the shipped system node (environment.toml: m7i.2xlarge): the test
    spec's m7i.xlarge (4 vCPU) cannot hold the long-lived head and a RayJob's head and submitter
    at once (preflight's fit says so too), so Kueue rightly admits no RayJob beside that cluster."""
    raw = spec_raw()
    raw["system_node_group"]["instance_type"] = "m7i.2xlarge"
    return run_synth(make_env(raw), tmp_path_factory.mktemp("dist-system"), spec_text=SPEC_TOML)


def test_every_rayjob_is_admitted_beside_the_long_lived_cluster_at_rest(shipped_system_synth):
    synth = shipped_system_synth
    cluster = synth.one("raycluster")
    cluster_queue, flavors = _queue(synth.env)
    jobs = [o for objs in synth.docs.values() for o in objs if o["kind"] == "RayJob" and "clusterSelector" not in o["spec"]]
    assert jobs
    for job in jobs:
        usage: dict = {}
        assert admission(cluster, cluster_queue, flavors, usage, sets=pod_sets(cluster))[1] == []
        assert admission(job, cluster_queue, flavors, usage)[1] == [], job["metadata"]["name"]


def test_a_rayjob_waits_while_the_long_lived_cluster_holds_the_gpus(shipped_system_synth):
    synth = shipped_system_synth
    cluster, job = synth.one("raycluster"), synth.one("rayjob-finetune-qwen")
    cluster_queue, flavors = _queue(synth.env)
    usage: dict = {}
    if managed(cluster):  # Kueue counts only a cluster it manages; an unmanaged one holds GPUs unseen
        assert admission(cluster, cluster_queue, flavors, usage, sets=pod_sets(cluster, _at_max(cluster)))[1] == []
    (problem,) = admission(job, cluster_queue, flavors, usage)[1]
    assert problem.startswith("couldn't assign flavors to pod set gpu: insufficient unused quota for")
    # the other way round: the job holds the GPUs, so the cluster's scale-up slice waits (the
    # slice it would replace is not counted beside it: pkg/workloadslicing/workloadslicing.go:343-355 ReplacedWorkloadSlice)
    usage = {}
    assert admission(job, cluster_queue, flavors, usage)[1] == []
    (problem,) = admission(cluster, cluster_queue, flavors, usage, sets=pod_sets(cluster, _at_max(cluster)))[1]
    assert problem.startswith("couldn't assign flavors to pod set gpu: insufficient unused quota for")


def test_the_oracle_refuses_autoscaling_that_is_not_elastic_and_an_ungated_elastic_cluster(default_synth):
    cluster = default_synth.one("raycluster")
    plain = copy.deepcopy(cluster)
    del plain["metadata"]["annotations"][ELASTIC_JOB]
    assert validate_create(plain) == [
        "spec.enableInTreeAutoscaling: a kueue-managed RayCluster can use autoscaling only as an elastic job: "
        f"enable the ElasticJobsViaWorkloadSlices feature gate and set the \"{ELASTIC_JOB}\": \"true\" annotation"]
    ungated = copy.deepcopy(cluster)
    del ungated["spec"]["workerGroupSpecs"][0]["template"]["spec"]["schedulingGates"]
    assert validate_create(ungated) == ["spec.workerGroupSpecs[0].template.spec.schedulingGates: an elastic job must "
                                        "have the ElasticJobSchedulingGate"]
    unlabelled = copy.deepcopy(cluster)
    del unlabelled["metadata"]["labels"][QUEUE_NAME_LABEL]
    assert not managed(unlabelled) and validate_create(unlabelled) == []


def test_the_autoscaler_sidecar_counts_in_the_head_pod_set(default_synth):
    """raycluster/common.go:97-104: KubeRay injects it at pod build time; Kueue adds it."""
    cluster = default_synth.one("raycluster")
    (head, _) = pod_sets(cluster)
    assert [c.get("name") for c in head["template"]["spec"]["containers"]][-1] == "autoscaler"
    assert head["template"]["spec"]["containers"][-1]["resources"] == cluster["spec"]["autoscalerOptions"]["resources"]


def test_a_running_unqueued_cluster_cannot_be_relabelled_in_place(default_synth):
    """A long-lived cluster deployed without the queue (before this change, or with
    ``queueing.enabled = false``) is running: Kueue refuses the re-applied, queued manifest
    (the label, the priority class and the elastic annotation cannot be added in place), so it is
    deleted once and re-created (docs/submit.md); the re-applied manifest itself is accepted."""
    new = default_synth.one("raycluster")
    assert validate_update(copy.deepcopy(new), new) == []
    old = copy.deepcopy(new)
    for key in (QUEUE_NAME_LABEL, PRIORITY_CLASS_LABEL):
        del old["metadata"]["labels"][key]
    del old["metadata"]["annotations"][ELASTIC_JOB]
    assert validate_update(old, new) == [
        "metadata.labels[kueue.x-k8s.io/queue-name]: field is immutable",
        f"metadata.annotations[{ELASTIC_JOB}]: field is immutable",
        f"metadata.labels[{PRIORITY_CLASS_LABEL}]: WorkloadPriorityClass cannot be added to a non-suspended workload"]
