"""Kueue's rules for a RayCluster of its own (the long-lived cluster): what its webhooks do at
``kubectl apply`` and what its Workload counts against the ClusterQueue.

Port of ``kubernetes-sigs/kueue`` tag ``v0.19.2`` with the ``ray.io/raycluster`` integration on
(default configuration otherwise: ``manageJobsWithoutQueueName`` false, TopologyAwareScheduling
off, ``ElasticJobsViaWorkloadSlices`` on: beta, default true since v0.18,
``pkg/features/kube_features.go:712-715``):

- ``pkg/controller/jobs/raycluster/raycluster_webhook.go:133-180`` ``validateCreate`` (also run on
  update, :260-276): only a cluster with the queue-name label is judged; an elastic one
  (annotation ``kueue.x-k8s.io/elastic-job: "true"``, ``pkg/workloadslicing/workloadslicing.go:52-67``)
  must carry the ``kueue.x-k8s.io/elastic-job`` scheduling gate in the head's and every worker
  group's template (``validateElasticJob`` :182-230); a non-elastic one must not set
  ``enableInTreeAutoscaling`` (:143-155); at most 18 pod sets; no worker group named ``head``.
- ``raycluster_webhook.go:86-111`` ``Default``: a labelled cluster is suspended at creation
  (``jobframework/defaults.go:36-46``) and an elastic one gets the gates (idempotent,
  ``pkg/util/pod/pod.go:72-86``).
- pod sets (``raycluster/common.go:64-125`` ``BuildPodSets``): ``head`` (count 1; with in-tree
  autoscaling the autoscaler sidecar KubeRay injects is added to it, its
  ``autoscalerOptions.resources`` or 500m / 512Mi, :97-104, :156-185), one per worker group
  (``replicas`` x ``numOfHosts``; the RayCluster CRD defaults ``replicas`` to 0). An elastic
  cluster's Workload follows ``replicas`` as the autoscaler writes it: a scale-up is a new slice
  admitted against the quota like any Workload, a scale-down shrinks it in place
  (site/content/en/docs/concepts/elastic_workload.md "Lifecycle").
"""
from __future__ import annotations

from charts_oracles.kueue_rayjob import HEAD_POD_SET, MAX_POD_SETS, PRIORITY_CLASS_LABEL, queue_name

ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
"""The annotation key (pkg/constants/constants.go:88) and the gate's name (apis/kueue/v1beta2/constants.go:27)."""
DEFAULT_AUTOSCALER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}


def elastic(raycluster: dict) -> bool:
    return (raycluster["metadata"].get("annotations") or {}).get(ELASTIC_JOB) == "true"


def _gated(template: dict) -> bool:
    return {"name": ELASTIC_JOB} in ((template.get("spec") or {}).get("schedulingGates") or [])


def validate_create(raycluster: dict) -> list[str]:
    """The validating webhook's errors (empty: admitted by the API server)."""
    if not queue_name(raycluster):
        return []
    spec, errors = raycluster["spec"], []
    groups = spec.get("workerGroupSpecs") or []
    if elastic(raycluster):
        errors += [f"spec.workerGroupSpecs[{i}].template.spec.schedulingGates: an elastic job must have the "
                   "ElasticJobSchedulingGate" for i, g in enumerate(groups) if not _gated(g["template"])]
        if not _gated(spec["headGroupSpec"]["template"]):
            errors.append("spec.headGroupSpec.template.spec.schedulingGates: an elastic job must have the "
                          "ElasticJobSchedulingGate")
    elif spec.get("enableInTreeAutoscaling") is True:
        errors.append("spec.enableInTreeAutoscaling: a kueue-managed RayCluster can use autoscaling only as an "
                      f"elastic job: enable the ElasticJobsViaWorkloadSlices feature gate and set the "
                      f"\"{ELASTIC_JOB}\": \"true\" annotation")
    if len(groups) + 1 > MAX_POD_SETS:
        errors.append(f"spec.workerGroupSpecs: must have at most {MAX_POD_SETS} items")
    errors += [f"spec.workerGroupSpecs[{i}].groupName: \"head\" is reserved for the head group"
               for i, g in enumerate(groups) if g.get("groupName") == HEAD_POD_SET]
    return errors


def managed(raycluster: dict) -> bool:
    """Whether Kueue counts it (a top-level labelled RayCluster; one a RayJob owns is counted in
    the RayJob's Workload, jobframework/reconciler.go:342-392)."""
    return bool(queue_name(raycluster)) and not raycluster["metadata"].get("ownerReferences")


def pod_sets(raycluster: dict, replicas: dict[str, int] | None = None) -> list[dict]:
    """``[{name, count, template}]`` of its Workload, with each worker group at ``replicas[group]``
    when given (what the autoscaler wrote) else as applied (the CRD's default 0 when unset)."""
    spec = raycluster["spec"]
    head = spec["headGroupSpec"]["template"]
    if spec.get("enableInTreeAutoscaling") is True:
        resources = (spec.get("autoscalerOptions") or {}).get("resources") or {
            "requests": DEFAULT_AUTOSCALER_RESOURCES, "limits": DEFAULT_AUTOSCALER_RESOURCES}
        head = {**head, "spec": {**head["spec"], "containers": [
            *head["spec"]["containers"], {"name": "autoscaler", "resources": resources}]}}
    sets = [{"name": HEAD_POD_SET, "count": 1, "template": head}]
    for group in spec.get("workerGroupSpecs") or []:
        count = (replicas or {}).get(group["groupName"], group.get("replicas", 0))
        sets.append({"name": group["groupName"], "count": count * max(1, group.get("numOfHosts", 1)),
                     "template": group["template"]})
    return sets


def validate_update(old: dict, new: dict) -> list[str]:
    """The validating webhook on update (raycluster_webhook.go:260-276; only a labelled new
    object is judged, ``jobframework/validation.go:99-104``): ``ValidateJobOnUpdate`` (:107-119) —
    the queue name is immutable while the cluster runs (:180-190), the elastic-job annotation
    always (:212-217), a priority class cannot be added to a running one (:219-224) — then the
    create rules."""
    if not queue_name(new):
        return []
    errors, running = [], new["spec"].get("suspend") is not True

    def labels(obj: dict) -> dict:
        return obj["metadata"].get("labels") or {}
    if running and queue_name(new) != queue_name(old):
        errors.append("metadata.labels[kueue.x-k8s.io/queue-name]: field is immutable")
    if elastic(new) != elastic(old):
        errors.append(f"metadata.annotations[{ELASTIC_JOB}]: field is immutable")
    if running and not labels(old).get(PRIORITY_CLASS_LABEL) and labels(new).get(PRIORITY_CLASS_LABEL):
        errors.append(f"metadata.labels[{PRIORITY_CLASS_LABEL}]: WorkloadPriorityClass cannot be added to a "
                      "non-suspended workload")
    return errors + validate_create(new)
