"""The long-lived RayCluster: interactive work and the ``*-on-cluster`` RayJobs run on it."""
from __future__ import annotations

import re

import cdk8s
from constructs import Construct

from charts.bindings import to_bindings
from charts.cluster_spec import ClusterShape, ray_cluster_spec
from charts import ChartError
from charts.imports.io import ray as generated
from charts.network_policy import raycluster_label
from charts.provenance import Provenance
from environment import Environment
from environment.queueing import raycluster_queue_metadata

UPGRADE_STRATEGY = {"type": generated.RayClusterSpecUpgradeStrategyType.RECREATE}
"""KubeRay (v1.6+) deletes every pod when the spec's hash changes (a new image digest too) and
recreates them from the new spec; without it a re-applied cluster keeps running the old image."""
LONG_LIVED_CHECKPOINT_GRACE_SECONDS = 600
"""The longest ``checkpoint.sigterm_grace_seconds`` of a job run on the long-lived cluster; its
workers wait this plus the margin on SIGTERM. A constant, not the longest of jobs/: the grace
is in the pod templates (workers and head), which KubeRay's Recreate hash covers, so adding a job would otherwise
delete the running cluster."""
MAX_RAYCLUSTER_NAME = 53
"""KubeRay's limit: the longest Service it derives (``-serve-svc``) must stay within 63."""


def cluster_name(env: Environment) -> str:
    """The RayCluster's name (what ``clusterSelector`` names): the EKS cluster's name."""
    name = env.cluster.name
    if len(name) > MAX_RAYCLUSTER_NAME or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        raise ChartError(f"{env.source}: cluster.name: {name!r} cannot name the RayCluster "
                         f"(a DNS-1035 label: starts with a letter, at most {MAX_RAYCLUSTER_NAME} characters)")
    return name


class RayClusterChart(cdk8s.Chart):
    """One RayCluster: a head on the system nodes, GPU workers only while a job needs them."""

    def __init__(self, scope: Construct, id: str, *, env: Environment):
        super().__init__(scope, id, namespace=env.ray.namespace, disable_resource_name_hashes=True)
        # Provenance on the object's own metadata only: KubeRay does not hash it.
        provenance = Provenance.for_cluster(env)
        shape = ClusterShape(env=env, worker_replicas=env.primary_gpu_group.job_nodes,
                             checkpoint_grace_seconds=LONG_LIVED_CHECKPOINT_GRACE_SECONDS,
                             autoscale=True, cluster_label=raycluster_label(cluster_name(env)))
        # Queued (Kueue counts the head and the workers the autoscaler asks for against the
        # ClusterQueue, so a RayJob is not admitted onto GPUs this cluster holds): an elastic
        # workload, each scale-up admitted like a job (environment/queueing.py).
        queue_labels, queue_annotations, gates = raycluster_queue_metadata(env)
        spec = ray_cluster_spec(shape)
        for template in [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]:
            template["spec"] = {**template["spec"], **({"schedulingGates": gates} if gates else {})}
        generated.RayCluster(
            self, "raycluster",
            metadata=cdk8s.ApiObjectMetadata(name=cluster_name(env), labels={**provenance.labels, **queue_labels},
                                             annotations={**provenance.annotations, **queue_annotations}),
            # Only on a RayCluster of our own: KubeRay rejects the field inside a RayJob.
            spec=to_bindings("RayClusterSpec", {**spec, "upgradeStrategy": UPGRADE_STRATEGY}),
        )
