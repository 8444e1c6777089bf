"""The Kueue objects (environment/queueing.py ``kueue_objects``: flavors, the ClusterQueue, the
Ray namespace's LocalQueue, the priority classes) as the cluster stack ships them.

Two rules decide whether a queued RayJob is ever admitted:

- Kueue admits a Workload only through the LocalQueue its job's ``kueue.x-k8s.io/queue-name``
  label names, in the job's namespace (kubernetes-sigs/kueue v0.19.2
  ``pkg/cache/queue/manager.go`` ``AddOrUpdateWorkload``: a workload whose LocalQueue is not
  known is not queued; ``pkg/controller/core/workload_controller.go`` marks it inadmissible,
  "LocalQueue ... doesn't exist"). Every RayJob the charts write carries that label whenever
  ``queueing.enabled`` (environment/queueing.py ``rayjob_queue_labels``), also on an existing
  cluster that already runs Kueue (``cluster.present_addons`` naming ``kueue``): the objects
  are this app's, not the Kueue installation's, and must be created there too.
- The LocalQueue is namespaced in the Ray namespace: aws-cdk-lib 2.275.0
  custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/apply/__init__.py runs
  ``kubectl apply -f`` on Create (Overwrite) and fails on "namespaces ... not found"; so the
  objects' manifest must wait for the manifest that creates the namespace.
"""
from __future__ import annotations

import json

from environment.queueing import CLUSTER_QUEUE
from infra_variants import existing_raw, synthesize

MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"


def _objects(resource: dict) -> list[dict]:
    manifest = resource["Properties"]["Manifest"]
    if isinstance(manifest, dict):  # Fn::Join of literals and tokens: the literal parts only
        manifest = "".join(p for p in manifest["Fn::Join"][1] if isinstance(p, str))
    try:
        return json.loads(manifest)
    except ValueError:
        return []


def _kinds(synth) -> dict[str, list[str]]:
    """Manifest logical id -> ``kind/name`` of every object it holds."""
    return {k: [f"{o['kind']}/{o['metadata']['name']}" for o in _objects(v)]
            for k, v in synth.resources("cluster", MANIFEST).items()}


def _check_queue_objects(synth) -> None:
    env = synth.env
    kinds = _kinds(synth)
    [holder] = [k for k, objs in kinds.items() if f"LocalQueue/{env.queueing.local_queue}" in objs]
    assert f"ClusterQueue/{CLUSTER_QUEUE}" in kinds[holder]
    [namespace] = [k for k, objs in kinds.items() if f"Namespace/{env.ray.namespace}" in objs]
    depends = synth.json("cluster")["Resources"][holder].get("DependsOn", [])
    assert namespace in depends, f"{holder} does not wait for {namespace} (the LocalQueue's namespace)"


def test_the_queue_objects_wait_for_the_ray_namespace(default):
    # given the default spec (queueing on, a new cluster): the LocalQueue is created after its namespace
    assert default.env.queueing.enabled
    _check_queue_objects(default)


def test_an_existing_cluster_running_kueue_still_gets_the_queue_objects(tmp_path):
    # given an existing cluster that already runs Kueue: the chart is not installed, but the
    # RayJobs still name the LocalQueue, so the app's queue objects are created
    raw = existing_raw()
    raw["cluster"]["present_addons"] = [*raw["cluster"]["present_addons"], "kueue"]
    synth = synthesize(raw, tmp_path, "existing.toml")
    releases = {v["Properties"]["Release"] for v in synth.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()}
    assert "kueue" not in releases
    _check_queue_objects(synth)
