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
from charts.jobs import MAX_RAYJOB_NAME, JobPlan, pre_running_deadline_seconds
from charts.network_policy import raycluster_label, rayjob_label
from charts.pod_security import secure_pod
from charts.provenance import POD_TEMPLATE_LABELS, Provenance, SourceIdentity, image_reference
from charts.raycluster import LONG_LIVED_CHECKPOINT_GRACE_SECONDS
from charts.code_bundle import CodeBundle
from environment import Environment
from environment.contract import ON_CLUSTER_SUFFIX, RAY_CLUSTER_LABEL, RAY_PEER_LABEL
from environment.queueing import rayjob_queue_labels
from training import contract
from training.config import stop_wait_seconds

SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""The submitter only runs ``ray job submit`` and follows the log. Explicit, and on the system
nodes: KubeRay's default (500m / 200Mi, no node selector) would land wherever 500m is free."""
RAY_JOB_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
"""Ray 2.58's job supervisor (dashboard/modules/job/job_supervisor.py ``JobSupervisor.run``)
sends a stopped job's driver SIGTERM and SIGKILLs it after ``int(os.environ[...])`` seconds,
default ``DEFAULT_RAY_JOB_STOP_WAIT_TIME_S = 3``. It reads its own environment, which is the
job's runtime env (job_manager.py ``_get_supervisor_runtime_env`` copies its ``env_vars``): set
there, per job, to :func:`training.config.stop_wait_seconds`. KubeRay's StopJob (a deleted
RayJob, ``raytrain-eks stop``) takes this path; 3 s would kill any final checkpoint larger
than a toy's."""
SUBMITTER_BACKOFF_LIMIT = 10
"""``submitterConfig.backoffLimit``: the submitter Job's pod retries. KubeRay v1.7.0 defaults it
to 2 (rayjob_controller.go ``createNewK8sJob``) and marks the RayJob Failed once the submitter
Job fails, even while the Ray job still runs (``checkSubmitterAndUpdateStatusIfNeeded``): its
cluster is then deleted (after the TTL, or at once for a retry). ``ray job logs --follow`` exits
non-zero when the dashboard's websocket closes abnormally, so a long job could be killed by
three dropped log streams. A retried pod first asks ``ray job status`` and only reattaches to the
log (KubeRay's submit command never submits twice); with the Job's exponential pod backoff
(10 s doubling, at most 6 min) ten retries give up after about 35 minutes of failures."""


def runtime_env_yaml(env: Environment, plan: JobPlan, code: CodeBundle, *, source: SourceIdentity | None = None,
                     manifest_name: str = "") -> str:
    """The Ray runtime environment: the code archive as working_dir (Ray downloads and unpacks
    it on every node; no pip, no py_modules), the provenance the run record reports and how
    long Ray's job supervisor waits for a stopped driver (:data:`RAY_JOB_STOP_WAIT_ENV`). The
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
            RAY_JOB_STOP_WAIT_ENV: str(stop_wait_seconds(plan.grace_seconds)),
            **(source.env_vars() if source else {}),
        },
    }, sort_keys=True, default_flow_style=False, width=1 << 20)


def submitter_pod_template(env: Environment, cluster_label: str) -> dict:
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
    return {"metadata": {"labels": {**POD_TEMPLATE_LABELS, RAY_PEER_LABEL: cluster_label}},
            "spec": secure_pod(pod)}


def rayjob_spec(env: Environment, plan: JobPlan, code: CodeBundle, on_cluster: str | None,
                source: SourceIdentity | None = None, manifest_name: str = "") -> dict:
    """The RayJob spec as Kubernetes JSON; ``on_cluster`` = the RayCluster to target, or None
    for a cluster of its own that is deleted after the job."""
    limits = plan.config.rayjob
    spec: dict = {
        "entrypoint": plan.entrypoint,
        "runtimeEnvYAML": runtime_env_yaml(env, plan, code, source=source, manifest_name=manifest_name),
        # The submitter is a Kubernetes Job running `ray job submit`: its log is the job's log.
        "submissionMode": "K8sJobMode",
        "activeDeadlineSeconds": limits.active_deadline_minutes * 60,
        "preRunningDeadlineSeconds": pre_running_deadline_seconds(),
    }
    cluster_label = raycluster_label(on_cluster) if on_cluster else rayjob_label(plan.name)
    spec["submitterPodTemplate"] = submitter_pod_template(env, cluster_label)
    spec["submitterConfig"] = {"backoffLimit": SUBMITTER_BACKOFF_LIMIT}
    if on_cluster:
        # No backoffLimit: KubeRay v1.7.0 parks a RayJob with clusterSelector and backoffLimit > 0
        # in ValidationFailed (utils/validation.go ValidateRayJobSpec); a retry needs a new cluster.
        spec["clusterSelector"] = {RAY_CLUSTER_LABEL: on_cluster}
        longest = LONG_LIVED_CHECKPOINT_GRACE_SECONDS
        if plan.grace_seconds > longest:
            raise ChartError(f"{plan.config_path}: checkpoint.sigterm_grace_seconds: {plan.grace_seconds} is longer "
                             f"than the long-lived RayCluster's workers wait on SIGTERM (at most {longest}): "
                             "its -on-cluster RayJob would be killed inside its final checkpoint")
    else:
        cpus = 0 if plan.uses_gpu else plan.config.parallel.num_workers * plan.config.parallel.cpus_per_worker
        shape = ClusterShape(env=env, worker_replicas=plan.worker_replicas,
                             checkpoint_grace_seconds=plan.grace_seconds,
                             group_name=plan.node_group, cluster_label=cluster_label, cpu_job_cpus=cpus,
                             gpus_per_pod=plan.world.workers_per_node if plan.world else 0)
        spec |= {
            "backoffLimit": limits.backoff_limit,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": limits.ttl_seconds_after_finished,
            "rayClusterSpec": ray_cluster_spec(shape),
        }
        if env.queueing.enabled:
            # Created suspended: Kueue unsuspends it once its Workload is admitted against the
            # quota (its webhook would suspend it anyway; written here, the manifest says what
            # runs). KubeRay then starts it from New, its deadlines' clock set at that moment
            # (kuberay ray-operator/v1.7.0 rayjob_controller.go:411-418, 887-917): time in the
            # queue counts against neither deadline.
            spec["suspend"] = True
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
        # Only a RayJob with a cluster of its own is queued: Kueue skips clusterSelector jobs but
        # its webhook would still suspend a labelled one, which KubeRay then refuses
        # (environment/queueing.py).
        queue = {} if on_cluster else rayjob_queue_labels(env, plan.config.name)
        generated.RayJob(
            self, "rayjob",
            metadata=cdk8s.ApiObjectMetadata(name=name, labels={**provenance.labels, **queue},
                                             annotations=provenance.annotations),
            spec=to_bindings("RayJobSpec", rayjob_spec(env, plan, code, on_cluster, source, id)),
        )
