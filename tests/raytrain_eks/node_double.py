"""The nodes under the kubectl double's RayClusters (tests/raytrain_eks/kubectl_double.py): the GPU
node groups' room, and the pods of a cluster that waits for it.

- room (``gpu_capacity``: the groups' GPUs at ``max_nodes``; absent: unbounded): a RayJob's own
  cluster is placed when its pods' ``nvidia.com/gpu`` requests fit beside the clusters placed
  before it. A cluster holds its GPUs from placement until KubeRay deletes it:
  ``ttlSecondsAfterFinished`` (``ttl_after`` reconciles) after its job ended, with
  ``shutdownAfterJobFinishes`` (``ray-project/kuberay`` tag ``ray-operator/v1.7.0``,
  ``rayjob_controller.go`` ``handleShutdownAfterJobFinishes``), at once when it is retried or
  suspended (:366-410).
- the long-lived RayCluster's workers (``state["long_lived"]``) hold their GPUs first: those
  Kueue admitted, or, unmanaged, every one the autoscaler asked for (kueue_double.py).
- pods (``kubectl get pods -l ray.io/cluster=NAME``) while the RayJob is ``Initializing``: the
  worker is Unschedulable ("Insufficient nvidia.com/gpu", as kube-scheduler says) until placed and
  for the first half of ``cluster_ready_after`` reconciles after (a node scales up), then
  ContainerCreating (the image pulls).
"""
from __future__ import annotations

from kueue_double import long_lived_workers, pod_requests, pod_sets  # the Kueue oracle's pod sets


def long_lived_gpus(state: dict) -> int:
    """The GPUs the long-lived RayCluster's workers hold (kueue_double.long_lived_workers)."""
    long_lived = state.get("long_lived")
    if not long_lived:
        return 0
    groups = {g["groupName"]: g for g in long_lived["raycluster"]["spec"]["workerGroupSpecs"]}
    return int(sum(count * pod_requests(groups[name]["template"]["spec"]).get("nvidia.com/gpu", 0)
                   for name, count in long_lived_workers(state).items()))


def gpus_of(job: dict) -> int:
    """The GPUs its own RayCluster's pods request (a clusterSelector job brings none)."""
    if not job["spec"].get("rayClusterSpec"):
        return 0
    return int(sum(ps["count"] * pod_requests(ps["template"]["spec"]).get("nvidia.com/gpu", 0)
                   for ps in pod_sets(job)))


def gpus_fit(state: dict, job: dict) -> bool:
    """Whether the node groups (``gpu_capacity`` GPUs at max nodes; none: unbounded) have room for
    its cluster beside the clusters placed before it; a cluster's GPUs are freed when its job ends."""
    if state.get("gpu_capacity") is None:
        return True
    return sum(gpus_of(j) for j in state["rayjobs"].values() if j is not job and holds_gpus(state, j)) \
        + long_lived_gpus(state) + gpus_of(job) <= state["gpu_capacity"]


def holds_gpus(state: dict, job: dict) -> bool:
    """Its cluster's pods hold their GPUs from placement until KubeRay deletes the cluster:
    ``ttlSecondsAfterFinished`` (``ttl_after`` reconciles here) after the job ended
    (rayjob_controller.go ``handleShutdownAfterJobFinishes``)."""
    fake, deployment = job.get("_fake") or {}, (job.get("status") or {}).get("jobDeploymentStatus")
    if fake.get("placed_at") is None:
        return False
    if deployment in ("Complete", "Failed"):
        return fake["reconciles"] - fake.get("ended_at", fake["reconciles"]) < state.get("ttl_after", 0)
    return deployment in ("Initializing", "Running")


def pods(state: dict, cluster: str) -> list[dict]:
    """The cluster's pods as ``kubectl get pods -o json`` lists them (none unless Initializing)."""
    job = next((j for j in state["rayjobs"].values() if j.get("status", {}).get("rayClusterName") == cluster), None)
    if job is None or job["status"].get("jobDeploymentStatus") != "Initializing":
        return []
    placed = job["_fake"].get("placed_at")
    waited = -1 if placed is None else job["_fake"]["reconciles"] - placed
    head = {"metadata": {"name": f"{cluster}-head"}, "status": {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True"}]}}
    if waited < state["cluster_ready_after"] // 2:  # no room yet, or its node scales up
        worker = {"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}}
    else:
        worker = {"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                             "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    return [head, {"metadata": {"name": f"{cluster}-gpu-worker-0"}, **worker}]
