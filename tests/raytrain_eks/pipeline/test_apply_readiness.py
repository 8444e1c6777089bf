"""Apply's readiness rule and the KubeRay double's model (kuberay_double.py), on plain data (no processes).

The oracle is KubeRay v1.7.0 (``ray-project/kuberay`` tag ``ray-operator/v1.7.0``):
``ray-operator/controllers/ray/utils/util.go`` GenerateHashWithoutReplicasAndWorkersToDelete
(what a Recreate upgrade hashes) and ``raycluster_controller.go`` calculateStatus (``state:
ready`` once head + desired workers, autoscaled ones included, all run).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from raytrain_eks.pipeline.kube import annotated, manifest_hash, not_ready

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the KubeRay double
import kuberay_double  # noqa: E402

REPO = "registry.example/ray"
DIGEST, OLD = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def spec(image: str = f"{REPO}@{DIGEST}", replicas: int = 1) -> dict:
    template = {"metadata": {"labels": {"raytrain.io/spec-hash": "x"}},
                "spec": {"containers": [{"name": "ray-head", "image": image}], "tolerations": []}}
    return {"headGroupSpec": {"template": template},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": replicas, "minReplicas": 0, "maxReplicas": 4,
                                  "template": copy.deepcopy(template)}],
            "upgradeStrategy": {"type": "Recreate"}}


def test_recreate_hash_ignores_replicas_tolerations_and_the_strategy_but_not_labels_or_image():
    base = kuberay_double.recreate_hash(spec())
    scaled = spec(replicas=3)
    scaled["workerGroupSpecs"][0]["template"]["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    del scaled["upgradeStrategy"]
    assert kuberay_double.recreate_hash(scaled) == base
    assert kuberay_double.recreate_hash(spec(image=f"{REPO}@{OLD}")) != base
    labelled = spec()
    labelled["headGroupSpec"]["template"]["metadata"]["labels"]["raytrain.io/spec-hash"] = "y"
    assert kuberay_double.recreate_hash(labelled) != base  # pod-template labels are in the hash


def test_the_applied_annotation_is_metadata_so_it_never_recreates_pods():
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"}, "spec": spec()}
    marked = annotated(manifest)
    assert marked["spec"] == manifest["spec"]
    assert manifest_hash(marked) == manifest_hash(manifest) == marked["metadata"]["annotations"][
        "raytrain.io/applied-manifest"]


def pod(name: str, node_type: str, image_id: str, ready: bool = True) -> dict:
    return {"metadata": {"name": name, "labels": {"ray.io/node-type": node_type}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "ray", "image": image_id, "imageID": image_id, "ready": ready}]}}


def live(state: str = "ready", generation: int = 2, observed: int = 2) -> dict:
    return {"metadata": {"name": "c", "generation": generation},
            "status": {"state": state, "observedGeneration": observed}}


@pytest.mark.parametrize("cluster, pods, why", [
    # an on-cluster job holds two autoscaled workers beyond the manifest's one: still ready
    (live(), [pod("h", "head", f"{REPO}@{DIGEST}"), pod("w0", "worker", f"{REPO}@{DIGEST}"),
              pod("w1", "worker", f"{REPO}@{DIGEST}")], ""),
    # KubeRay has not reconciled what was just applied: its "ready" is stale
    (live(observed=1), [pod("h", "head", f"{REPO}@{DIGEST}")], "has not reconciled generation 2"),
    (live(state=""), [pod("h", "head", f"{REPO}@{DIGEST}")], "state (none)"),
    # a crash-looping head on the right image ID
    (live(), [pod("h", "head", f"{REPO}@{DIGEST}", ready=False), pod("w0", "worker", f"{REPO}@{DIGEST}")],
     "pods not Ready: h"),
    (live(), [pod("h", "head", f"{REPO}@{OLD}")], f"pods report {REPO}@{OLD}"),
    (None, [], "RayCluster not found"),
])
def test_ready_means_kuberay_ready_every_pod_ready_and_on_the_digest(cluster, pods, why):
    reason = not_ready(cluster, pods, repository=REPO, digest=DIGEST)
    assert (why in reason) if why else reason == "", reason


def test_with_the_pull_through_cache_the_check_reads_the_pods_cached_image():
    # given image.pull_through_cache, the pods pull (and kubelet reports as imageID)
    # <account>.dkr.ecr.<region>.amazonaws.com/<prefix>/<name>@digest: the step's repository must
    # be that one, or no container matches and a pod on the old digest passes as ready
    from environment import environment_from_dict
    from environment.image_source import pull_repository
    from raytrain_eks.pipeline import StepContext
    from spec_template import template_raw

    raw = template_raw()
    raw["cluster"]["account"] = "111122223333"
    raw["image"].update(pull_through_cache=True, digest=DIGEST)
    env = environment_from_dict(raw)
    ctx = StepContext(env=env, dist=Path("dist"), kube=None, s3=None, ssm=None, history=None,
                      parameter_name="p", execution_id="e")
    cached = pull_repository(env)
    assert ctx.repository == cached != env.image.repository
    stale = [pod("h", "head", f"{cached}@{OLD}")]
    assert not_ready(live(), stale, repository=ctx.repository, digest=DIGEST) == f"pods report {cached}@{OLD}"
    assert not_ready(live(), [pod("h", "head", f"{cached}@{DIGEST}")], repository=ctx.repository, digest=DIGEST) == ""
