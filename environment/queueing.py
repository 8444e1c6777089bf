"""Kueue: GPU jobs wait in a queue for the node groups' capacity instead of failing.

One definition of the queue: the ``[queueing]`` section of environment.toml
(:class:`QueueingSpec`), the Kueue objects the cluster gets (:func:`kueue_objects`: one
ResourceFlavor per node group, one ClusterQueue whose quota is the groups' capacity at
``max_nodes``, one LocalQueue in the Ray namespace, the WorkloadPriorityClasses) and the labels
a queued RayJob carries (:func:`rayjob_queue_labels`). The add-on table installs Kueue with
these objects; the charts label and suspend the RayJobs with the same names.

How Kueue treats a RayJob (``kubernetes-sigs/kueue`` tag ``v0.19.2``): its webhook suspends a
RayJob that carries the queue-name label (``pkg/controller/jobframework/defaults.go:36-46``,
``utils.go:147-150``); its reconciler admits the job's Workload (pod sets: head, each worker
group, the submitter; ``pkg/controller/jobs/rayjob/rayjob_controller.go:133-164``) against the
ClusterQueue's quota, higher priority first, and unsuspends it (``:166-193``); a
``clusterSelector`` RayJob is skipped (``:116-120``). So a RayJob on the long-lived RayCluster
must NOT carry the label: suspended by the webhook and never admitted, KubeRay would refuse it
(ray-project/kuberay ray-operator/v1.7.0 ``utils/validation.go:561-562``). The long-lived
RayCluster those jobs run on is queued instead (:func:`raycluster_queue_metadata`): an elastic
workload whose head and autoscaled workers count against the same ClusterQueue, so a RayJob is
never admitted onto GPU nodes the cluster's workers hold, nor its scale-up onto a RayJob's.

Standard library only.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from environment.contract import EFA_RESOURCE, GPU_RESOURCE, PART_OF
from spec_schema import FieldError

Environment = Any
"""An :class:`environment.model.Environment` (not imported: the model imports this module)."""

KUEUE_API = "kueue.x-k8s.io/v1beta2"
"""The storage version of Kueue v0.19.2's CRDs (charts/kueue/templates/crd/)."""
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
"""pkg/controller/constants/constants.go:23 ``QueueLabel``."""
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
"""pkg/controller/constants/constants.go:48 ``WorkloadPriorityClassLabel``."""
KUEUE_DEFAULT_NAME = "default"
"""``constants.DefaultLocalQueueName`` / ``DefaultWorkloadPriorityClassName``: with a LocalQueue
so named, Kueue's webhook labels EVERY job of the namespace for it (defaults.go:52-98), the
long-lived cluster's RayJobs included; a priority class so named is given to every job."""
CLUSTER_QUEUE = "raytrain"
"""The ClusterQueue (cluster-scoped) every LocalQueue of the Ray namespace points at."""
SYSTEM_FLAVOR = "system"
"""The ResourceFlavor of the system node group (Ray heads, submitters)."""
KUEUE_RESOURCES = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
                   "WorkloadPriorityClass": "workloadpriorityclasses"}
"""The kinds of the queue objects and their resources (the CRDs' ``spec.names.plural``, Kueue
v0.19.2 charts/kueue/templates/crd/)."""
QUEUED_RESOURCES = ("cpu", "memory", GPU_RESOURCE, EFA_RESOURCE)
"""What the ClusterQueue counts: every resource the Ray pods request (a resource a pod requests
and the queue does not cover makes the workload inadmissible)."""
INT32_MAX = 2**31 - 1
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueingSpec:
    """``[queueing]``: Kueue in front of the GPU node groups."""

    enabled: bool = True
    """Install Kueue and queue every RayJob that brings its own cluster (false: jobs start at
    once and one that finds the GPUs busy fails after its pre-running deadline)."""
    local_queue: str = "ray-jobs"
    """The LocalQueue of the Ray namespace the RayJobs name (never ``default``: see above)."""
    priorities: Mapping[str, Any] = field(default_factory=lambda: {"short": 1000, "experiment": 100})
    """WorkloadPriorityClass name = value: a higher value is admitted first. Nothing is
    preempted: a running job keeps its GPUs (the ClusterQueue preempts Never)."""
    job_priorities: Mapping[str, Any] = field(default_factory=lambda: {"smoke": "short", "netcheck": "short"})
    """Job config ``name`` = priority class (the pipeline's Smoke runs ``smoke``)."""
    default_priority: str = "experiment"
    """The priority class of every job ``job_priorities`` does not name."""
    name_prefix: str = ""
    """Put before the names of the cluster-wide queue objects (the ClusterQueue ``raytrain``, the
    ResourceFlavors ``system`` and ``gpu-<group>``): for a cluster whose own Kueue already has
    objects so named."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.local_queue) or len(self.local_queue) > 63 or self.local_queue == KUEUE_DEFAULT_NAME:
            raise FieldError("local_queue", self.local_queue,
                             "is not allowed (a lower-case Kubernetes name, not 'default': Kueue would give that queue "
                             "to every RayJob of the namespace)")
        if not self.priorities:
            raise FieldError("priorities", {}, "must name at least one priority class (name = value)")
        for name, value in self.priorities.items():
            if not _NAME.fullmatch(name) or len(name) > 253 or name == KUEUE_DEFAULT_NAME:
                raise FieldError(f"priorities.{name}", name,
                                 "is not allowed as a priority class name (lower-case letters, digits, '-'; not 'default')")
            if isinstance(value, bool) or not isinstance(value, int) or not -INT32_MAX - 1 <= value <= INT32_MAX:
                raise FieldError(f"priorities.{name}", value, "must be an integer (int32; higher is admitted first)")
        known = ", ".join(sorted(self.priorities))
        for job, name in self.job_priorities.items():
            if name not in self.priorities:
                raise FieldError(f"job_priorities.{job}", name, f"is not a priority class of queueing.priorities ({known})")
        if self.name_prefix and (not _NAME.fullmatch(self.name_prefix.rstrip("-")) or len(self.name_prefix) > 40):
            raise FieldError("name_prefix", self.name_prefix,
                             "is not a name prefix (lower-case letters, digits, '-'; at most 40 characters, e.g. \"raytrain-\")")
        if self.default_priority not in self.priorities:
            raise FieldError("default_priority", self.default_priority,
                             f"is not a priority class of queueing.priorities ({known})")

    def priority_of(self, job: str) -> str:
        """The priority class of the job config named ``job``."""
        return str(self.job_priorities.get(job, self.default_priority))


def cluster_queue(env: Environment) -> str:
    """The ClusterQueue's name."""
    return env.queueing.name_prefix + CLUSTER_QUEUE


def system_flavor(env: Environment) -> str:
    """The ResourceFlavor of the system node group."""
    return env.queueing.name_prefix + SYSTEM_FLAVOR


def gpu_flavor(env: Environment, group_name: str) -> str:
    """The ResourceFlavor of one GPU node group."""
    return f"{env.queueing.name_prefix}gpu-{group_name}"


def _metadata(name: str, **more: str) -> dict[str, Any]:
    return {"name": name, **more, "labels": dict(PART_OF)}


def _quota(cpu: int, memory_gib: int, gpus: int, efa: int) -> list[dict[str, Any]]:
    amounts = (str(cpu), f"{memory_gib}Gi", str(gpus), str(efa))
    return [{"name": name, "nominalQuota": amount} for name, amount in zip(QUEUED_RESOURCES, amounts)]


def flavor_quotas(env: Environment) -> dict[str, list[dict[str, Any]]]:
    """Flavor -> its quota: each GPU group's capacity at ``max_nodes`` (the instance's vCPUs,
    memory, GPUs and EFA interfaces from environment/instances.py), and the system group's
    CPU and memory (heads and submitters run there; no GPU, no EFA)."""
    out = {}
    for group in env.gpu_node_groups:
        node = group.instance
        out[gpu_flavor(env, group.name)] = _quota(node.vcpus * group.max_nodes, node.memory_gib * group.max_nodes,
                                             group.gpus_per_node * group.max_nodes, group.efa_per_node * group.max_nodes)
    system = env.system_node_group
    out[system_flavor(env)] = _quota(system.instance.vcpus * system.nodes, system.instance.memory_gib * system.nodes, 0, 0)
    return out


def resource_flavors(env: Environment) -> list[dict[str, Any]]:
    """One ResourceFlavor per node group, with the group's node labels (Kueue matches them
    against each pod set's nodeSelector) and, for GPU groups, their taints (a pod set that does
    not tolerate them does not get the flavor)."""
    flavors = [{"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": _metadata(gpu_flavor(env, g.name)),
                "spec": {"nodeLabels": dict(g.labels), "nodeTaints": [dict(t) for t in g.taints]}}
               for g in env.gpu_node_groups]
    flavors.append({"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": _metadata(system_flavor(env)),
                    "spec": {"nodeLabels": dict(env.system_node_group.labels)}})
    return flavors


def kueue_objects(env: Environment) -> list[dict[str, Any]]:
    """The flavors, the ClusterQueue, the Ray namespace's LocalQueue and the priority classes."""
    quotas = flavor_quotas(env)
    queue = {
        "apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": _metadata(cluster_queue(env)),
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ray.namespace}},
            # BestEffortFIFO: priority, then creation time; a job that cannot fit does not
            # block a smaller one behind it. Never preempt: a running job keeps its GPUs.
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"},
            "resourceGroups": [{"coveredResources": list(QUEUED_RESOURCES),
                                "flavors": [{"name": name, "resources": quota} for name, quota in quotas.items()]}],
        },
    }
    local_queue = {"apiVersion": KUEUE_API, "kind": "LocalQueue",
                   "metadata": _metadata(env.queueing.local_queue, namespace=env.ray.namespace),
                   "spec": {"clusterQueue": cluster_queue(env)}}
    priorities = [{"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass", "metadata": _metadata(name),
                   "value": value, "description": f"raytrain-eks queueing.priorities.{name}"}
                  for name, value in sorted(env.queueing.priorities.items())]
    return [*resource_flavors(env), queue, local_queue, *priorities]


def rayjob_queue_labels(env: Environment, job: str) -> dict[str, str]:
    """The labels of a queued RayJob of job config ``job`` (none when queueing is off)."""
    if not env.queueing.enabled:
        return {}
    return {QUEUE_NAME_LABEL: env.queueing.local_queue, PRIORITY_CLASS_LABEL: env.queueing.priority_of(job)}


KUEUE_IMAGE = "registry.k8s.io/kueue/kueue"
"""The released manager image (the chart's own default is a staging tag, ``release-0.19``,
pulled Always; the release build overrides it to this repository and the version)."""
KUEUE_FRAMEWORKS = {"ray.io/rayjob": "queued RayJobs would never be admitted",
                    "ray.io/raycluster": "the long-lived RayCluster's pods would stay gated, never scheduled"}
"""The integrations Kueue manages (-> what breaks without it): RayJobs, and the long-lived RayCluster, whose GPU workers
would otherwise hold the nodes a RayJob was admitted to (the chart's default also takes over
batch Jobs, pods, Deployments and StatefulSets of labelled namespaces). A RayJob's own
RayCluster is its child: Kueue counts it in the RayJob's Workload, not twice
(pkg/controller/jobframework/reconciler.go:342-392)."""
ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
"""The annotation (pkg/constants/constants.go:88 ``ElasticJobAnnotation``, value ``"true"``) and
the pod scheduling gate (apis/kueue/v1beta2/constants.go:27 ``ElasticJobSchedulingGate``) of an
elastic workload: Kueue admits an autoscaling RayCluster only so
(pkg/controller/jobs/raycluster/raycluster_webhook.go:141-155, the ``ElasticJobsViaWorkloadSlices``
gate, beta and on by default since v0.18, pkg/features/kube_features.go:712-715). Each scale-up
is a new Workload slice that waits for quota like a RayJob; its new pods stay gated until then."""


def raycluster_queue_metadata(env: Environment) -> tuple[dict[str, str], dict[str, str], list[dict[str, str]]]:
    """The long-lived RayCluster's queue labels, annotations and pod scheduling gates (all empty
    when queueing is off: a gate nothing lifts would keep every pod Pending). The gates are the
    ones Kueue's webhook adds at creation (raycluster_webhook.go:99-108); written here so a
    re-applied manifest keeps them (its update is refused without them, :182-215)."""
    if not env.queueing.enabled:
        return {}, {}, []
    labels = {QUEUE_NAME_LABEL: env.queueing.local_queue, PRIORITY_CLASS_LABEL: env.queueing.default_priority}
    return labels, {ELASTIC_JOB: "true"}, [{"name": ELASTIC_JOB}]


def kueue_values(env: Environment, version: str, node_selector: dict[str, str]) -> dict[str, Any]:
    """The Kueue chart's values: the released image of ``version``, on the system nodes,
    managing :data:`KUEUE_FRAMEWORKS` only (``managerConfig.controllerManagerConfigYaml`` is a
    YAML string; JSON is YAML)."""
    config = {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)}}
    return {
        "controllerManager": {
            "manager": {"image": {"repository": KUEUE_IMAGE, "tag": f"v{version.lstrip('v')}", "pullPolicy": "IfNotPresent"}},
            "nodeSelector": dict(node_selector),
        },
        "managerConfig": {"controllerManagerConfigYaml": json.dumps(config)},
    }
