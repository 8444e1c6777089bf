"""One RayJob per job config: on its own cluster (built by the same builder as the RayCluster),
or, as the ``-on-cluster`` variant, on the long-lived RayCluster through ``clusterSelector``."""
from __future__ import annotations

import cdk8s
import yaml
from constructs import Construct

from charts.bindings import to_bindings
from charts.cluster_spec import ClusterShape, ray_cluster_spec
from charts.errors import ChartError
from charts.imports.io import ray as generated
from charts.jobs import MAX_RAYJOB_NAME, JobPlan
from charts.network_policy import raycluster_label, rayjob_label
from charts.pod_security import secure_pod
from charts.provenance import Provenance, SourceIdentity, image_reference
from charts.code_bundle import CodeBundle
from environment import Environment
from environment.contract import RAY_CLUSTER_LABEL, RAY_PEER_LABEL
from training import contract

GRACE_MARGIN_SECONDS = 30
"""Added to the job's ``checkpoint.sigterm_grace_seconds`` for the worker pods'
terminationGracePeriodSeconds: after the final checkpoint is written the worker still has to
finish the upload's last request, report to the controller and let ``ray stop`` tear down the
raylet; without the margin the kubelet's SIGKILL could land inside the checkpoint itself."""
"""The key KubeRay reads a target cluster's NAME from (RayJobClusterSelectorKey)."""
ON_CLUSTER_SUFFIX = "-on-cluster"
SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""The submitter only runs ``ray job submit`` and follows the log. Explicit, and on the system
nodes: KubeRay's default (500m / 200Mi, no node selector) would land wherever 500m is free."""


def worker_grace_seconds(plans: list[JobPlan]) -> int:
    """Grace of a cluster that may run any of these jobs: the longest checkpoint grace + margin."""
    from training.config import CheckpointConfig

    longest = max((p.grace_seconds for p in plans), default=CheckpointConfig().sigterm_grace_seconds)
    return longest + GRACE_MARGIN_SECONDS


def runtime_env_yaml(env: Environment, plan: JobPlan, code: CodeBundle, *, source: SourceIdentity | None = None,
                     manifest_name: str = "") -> str:
    """The Ray runtime environment: the code archive as working_dir (Ray downloads and unpacks
    it on every node; no pip, no py_modules) and the provenance the run record reports. The
    manifest hash is a placeholder here: charts.main fills it in the written file
    (:func:`training.contract.fill_manifest_hash`)."""
    return yaml.safe_dump({
        "working_dir": code.uri(env.bucket_name),
        "env_vars": {
            contract.ENV_CODE_HASH: code.content_hash,
            contract.ENV_SPEC_HASH: env.spec_hash,
            contract.ENV_JOB_CONFIG_HASH: plan.config_hash,
            contract.ENV_IMAGE: image_reference(env),
            contract.ENV_MANIFEST_NAME: manifest_name,
            contract.ENV_MANIFEST_HASH: contract.MANIFEST_HASH_PENDING,
            **(source.env_vars() if source else {}),
        },
    }, sort_keys=True, default_flow_style=False, width=1 << 20)


def submitter_pod_template(env: Environment, cluster_label: str, provenance: Provenance) -> dict:
    """The submitter Job's pod: the head's image on the system nodes (``ray job submit``; KubeRay
    fills in the command and, with token auth, ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN``), hardened
    like the Ray pods and labelled as a member of the Ray cluster it submits to, so that
    cluster's network policy admits it."""
    pod = {
        "restartPolicy": "Never",  # a Job's pods may not restart in place
        "nodeSelector": dict(env.system_node_group.labels),
        "containers": [{"name": SUBMITTER_CONTAINER, "image": image_reference(env),
                        "imagePullPolicy": "IfNotPresent", "resources": SUBMITTER_RESOURCES}],
    }
    return {"metadata": {"labels": {**provenance.labels, RAY_PEER_LABEL: cluster_label}},
            "spec": secure_pod(pod)}


def rayjob_spec(env: Environment, plan: JobPlan, code: CodeBundle, provenance: Provenance,
                on_cluster: str | None, source: SourceIdentity | None = None, manifest_name: str = "") -> dict:
    """The RayJob spec as Kubernetes JSON; ``on_cluster`` = the RayCluster to target, or None
    for a cluster of its own that is deleted after the job."""
    limits = plan.config.rayjob
    spec: dict = {
        "entrypoint": plan.entrypoint,
        "runtimeEnvYAML": runtime_env_yaml(env, plan, code, source=source, manifest_name=manifest_name),
        # The submitter is a Kubernetes Job running `ray job submit`: its log is the job's log.
        "submissionMode": "K8sJobMode",
        # KubeRay v1.7.0 refuses backoffLimit > 0 with a clusterSelector (utils/validation.go:575-576:
        # the RayJob goes ValidationFailed): a job on the long-lived RayCluster never retries.
        "backoffLimit": 0 if on_cluster else limits.backoff_limit,
        "activeDeadlineSeconds": limits.active_deadline_minutes * 60,
    }
    cluster_label = raycluster_label(on_cluster) if on_cluster else rayjob_label(plan.name)
    spec["submitterPodTemplate"] = submitter_pod_template(env, cluster_label, provenance)
    if on_cluster:
        spec["clusterSelector"] = {RAY_CLUSTER_LABEL: on_cluster}
    else:
        shape = ClusterShape(env=env, worker_replicas=plan.worker_replicas,
                             worker_grace_seconds=plan.grace_seconds + GRACE_MARGIN_SECONDS,
                             provenance=provenance, group_name=plan.node_group,
                             cluster_label=cluster_label)
        spec |= {
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": limits.ttl_seconds_after_finished,
            "rayClusterSpec": ray_cluster_spec(shape),
        }
    return spec


class RayJobChart(cdk8s.Chart):
    """One RayJob: ``on_cluster=None`` brings its own cluster; a name targets that RayCluster."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, plan: JobPlan,
                 code: CodeBundle, on_cluster: str | None = None, source: SourceIdentity | None = None):
        super().__init__(scope, id, namespace=env.ray.namespace, disable_resource_name_hashes=True)
        name = plan.name + (ON_CLUSTER_SUFFIX if on_cluster else "")
        if len(name) > MAX_RAYJOB_NAME:
            raise ChartError(f"{plan.config_path}: name: {plan.name!r} is too long for the RayJob "
                             f"{name!r} (at most {MAX_RAYJOB_NAME} characters)")
        provenance = Provenance.for_cluster(env).for_job(
            job=plan.name, code_hash=code.content_hash, code_uri=code.uri(env.bucket_name),
            config_hash=plan.config_hash, config_path=plan.config_path, source=source)
        generated.RayJob(
            self, "rayjob",
            metadata=cdk8s.ApiObjectMetadata(name=name, labels=provenance.labels,
                                             annotations=provenance.annotations),
            spec=to_bindings("RayJobSpec", rayjob_spec(env, plan, code, provenance, on_cluster, source, id)),
        )
