"""``dist/network-policy.k8s.yaml``: one NetworkPolicy per Ray cluster the manifests define (the
long-lived RayCluster and each RayJob's own cluster), so the pods of one cluster, and the
submitters of jobs on it, reach each other and nothing else in the namespace does.

The namespace's default-deny and the two admitted outside callers (the KubeRay operator and
Prometheus) come with the namespace from the CDK app; both layers are built by
:mod:`environment.network_policy`. Apply this file before the RayCluster and the RayJobs:
without it the default-deny keeps a cluster's pods apart and the cluster never comes up.
"""
from __future__ import annotations

import cdk8s
from constructs import Construct

from environment import Environment
from environment.network_policy import ray_cluster_policy, raycluster_label, rayjob_label  # noqa: F401 (re-exported)


class NetworkPolicyChart(cdk8s.Chart):
    """One NetworkPolicy per label value in ``cluster_labels``."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, cluster_labels: list[str]):
        super().__init__(scope, id, namespace=env.ray.namespace, disable_resource_name_hashes=True)
        for label in cluster_labels:
            policy = ray_cluster_policy(label, env.ray.namespace)
            obj = cdk8s.ApiObject(self, label, api_version=policy["apiVersion"], kind=policy["kind"],
                                  metadata=cdk8s.ApiObjectMetadata(**policy["metadata"]))
            obj.add_json_patch(cdk8s.JsonPatch.add("/spec", policy["spec"]))
