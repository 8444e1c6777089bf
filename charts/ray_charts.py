"""The app's cdk8s charts, one per ``dist/*.k8s.yaml`` file (charts.main names them): the
long-lived RayCluster (interactive work and the ``*-on-cluster`` RayJobs run on it), one RayJob
per job config (on a cluster of its own, built by the same builder as the RayCluster, or, as the
``-on-cluster`` variant, on the long-lived RayCluster through ``clusterSelector``), and the
NetworkPolicies of their Ray clusters.

Kubernetes JSON -> the classes generated from the KubeRay CRDs (charts/imports/): the charts
write specs as plain camelCase dictionaries (what the YAML shows, easy to read and to test) and
convert them with :func:`to_bindings`. The generated class names follow the JSON path
(``RayJobSpec`` + ``RayClusterSpec`` + ``WorkerGroupSpecs`` + ...), so ONE dictionary from
:func:`charts.cluster_spec.ray_cluster_spec` becomes a ``RayClusterSpec`` for the RayCluster
kind or a ``RayJobSpecRayClusterSpec`` inside a RayJob, depending only on where it is placed.
The classes check every field name and type: a misspelled or mistyped field fails synth.

``dist/network-policy.k8s.yaml`` (:class:`NetworkPolicyChart`): one NetworkPolicy per Ray cluster
the manifests define (the long-lived RayCluster and each RayJob's own cluster), so the pods of one
cluster, and the submitters of jobs on it, reach each other and nothing else in the namespace
does. The namespace's default-deny and the two admitted outside callers (the KubeRay operator and
Prometheus) come with the namespace from the CDK app; both layers are built by
:mod:`environment.network_policy`. Apply this file before the RayCluster and the RayJobs: without
it the default-deny keeps a cluster's pods apart and the cluster never comes up.
"""
from __future__ import annotations

import enum
import re
from typing import Any

import cdk8s
import yaml
from constructs import Construct

from charts import ChartError
from charts.cluster_spec import ClusterShape, ray_cluster_spec, secure_pod
from charts.code_bundle import CodeBundle
from charts.imports.io import ray as generated
from charts.jobs import MAX_RAYJOB_NAME, JobPlan, pre_running_deadline_seconds
from charts.provenance import POD_TEMPLATE_LABELS, Provenance, SourceIdentity, image_reference
from environment import Environment
from environment.contract import ON_CLUSTER_SUFFIX, RAY_CLUSTER_LABEL, RAY_PEER_LABEL
from environment.network_policy import ray_cluster_policy, raycluster_label, rayjob_label
from environment.queueing import raycluster_queue_metadata, rayjob_queue_labels
from training import contract
from training.contract import stop_wait_seconds

_QUANTITY_KEYS = {"limits", "requests"}
"""Maps of int-or-string quantities: one generated class per JSON path, built from strings."""
_QUANTITY_FIELDS = {"sizeLimit"}
"""Single int-or-string quantities (an emptyDir's ``sizeLimit``), built from their string."""
_STRING_MAP_KEYS = {"labels", "annotations", "nodeSelector", "rayStartParams", "clusterSelector"}
"""Maps of user data whose keys are not field names (they keep their spelling)."""


def _enum_member(cls: type[enum.Enum], path: str, value: str) -> enum.Enum:
    """A CRD enum value (``token``) as the generated member (``TOKEN``, serialised back as ``token``)."""
    wanted = re.sub(r"[^a-z0-9]", "", value.lower())
    for member in cls:
        if re.sub(r"[^a-z0-9]", "", member.name.lower()) == wanted:
            return member
    raise TypeError(f"{path}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}")


def to_bindings(path: str, value: Any) -> Any:
    """Convert ``value`` (JSON at the binding class ``path``, e.g. ``"RayJobSpec"``)."""
    if isinstance(value, list):
        return [to_bindings(path, item) for item in value]
    if not isinstance(value, dict):
        cls = getattr(generated, path, None)
        if isinstance(value, str) and isinstance(cls, type) and issubclass(cls, enum.Enum):
            return _enum_member(cls, path, value)
        return value
    cls = getattr(generated, path, None)
    if cls is None:
        raise TypeError(f"no generated binding {path}: a misspelled field in charts/?")
    # The generated struct's own map of Python name -> property name, reversed. Property names
    # lower-case acronyms (runtimeEnvYAML -> runtimeEnvYaml; the generated toJson restores the
    # CRD's spelling), so they are matched without case.
    python_names = {prop.lower(): py for py, prop in cls.__jsii_name_mapping__.items()}
    kwargs = {}
    for key, item in value.items():
        if key.lower() not in python_names:
            raise TypeError(f"{path}: {key!r} is not a field (fields: {', '.join(sorted(cls.__jsii_name_mapping__.values()))})")
        python_name = {key: python_names[key.lower()]}
        child = path + key[0].upper() + key[1:]
        if key in _QUANTITY_KEYS:
            kwargs[python_name[key]] = {k: getattr(generated, child).from_string(v) for k, v in item.items()}
        elif key in _QUANTITY_FIELDS:
            kwargs[python_name[key]] = getattr(generated, child).from_string(item)
        elif key in _STRING_MAP_KEYS:
            kwargs[python_name[key]] = dict(item)
        else:
            kwargs[python_name[key]] = to_bindings(child, item)
    return cls(**kwargs)


class NetworkPolicyChart(cdk8s.Chart):
    """One NetworkPolicy per label value in ``cluster_labels``."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, cluster_labels: list[str]):
        super().__init__(scope, id, namespace=env.ray.namespace, disable_resource_name_hashes=True)
        for label in cluster_labels:
            policy = ray_cluster_policy(label, env.ray.namespace)
            obj = cdk8s.ApiObject(self, label, api_version=policy["apiVersion"], kind=policy["kind"],
                                  metadata=cdk8s.ApiObjectMetadata(**policy["metadata"]))
            obj.add_json_patch(cdk8s.JsonPatch.add("/spec", policy["spec"]))


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


SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""The submitter only runs ``ray job submit`` and follows the log. Explicit, and on the system
nodes: KubeRay's default (500m / 200Mi, no node selector) would land wherever 500m is free."""
RAY_JOB_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
"""Ray 2.58's job supervisor (dashboard/modules/job/job_supervisor.py ``JobSupervisor.run``)
sends a stopped job's driver SIGTERM and SIGKILLs it after ``int(os.environ[...])`` seconds,
default ``DEFAULT_RAY_JOB_STOP_WAIT_TIME_S = 3``. It reads its own environment, which is the
job's runtime env (job_manager.py ``_get_supervisor_runtime_env`` copies its ``env_vars``): set
there, per job, to :func:`training.contract.stop_wait_seconds`. KubeRay's StopJob (a deleted
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
            **node_price_env(env, plan),
            **(source.env_vars() if source else {}),
        },
    }, sort_keys=True, default_flow_style=False, width=1 << 20)


def node_price_env(env: Environment, plan: JobPlan) -> dict[str, str]:
    """The price of an hour of the job's node (the preflight's; a spot price is an estimate, and
    its label says so) for the run's cost (training/incidents.py). Per job, in the runtime env:
    in the pods' template a price edit would change the long-lived RayCluster's hash and KubeRay
    would recreate it under running jobs."""
    group = env.gpu_group(plan.node_group) if plan.uses_gpu else None
    if group is None:
        return {}
    price, label = env.node_price(group)
    return {contract.ENV_NODE_PRICE: f"{price:g}", contract.ENV_PRICE_LABEL: label}


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
                             gpus_per_pod=plan.world.workers_per_node if plan.world else 0,
                             service_account=plan.name)
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
