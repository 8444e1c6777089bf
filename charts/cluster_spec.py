"""THE builder of a RayCluster spec: the long-lived RayCluster and every RayJob's own cluster
come from :func:`ray_cluster_spec`, never from a copy.

It returns plain Kubernetes JSON (camelCase, as in the YAML), so it knows nothing of the two
families of generated classes (``RayClusterSpec...`` for the RayCluster kind,
``RayJobSpecRayClusterSpec...`` inside a RayJob): :func:`charts.ray_charts.to_bindings` turns the
same dictionary into either, type-checking every field on the way.

Every figure derives from the spec: instance type -> GPUs, EFA interfaces, pod CPU and memory;
node-group labels and taints -> nodeSelector and tolerations; image and Ray version.

Pod security: the settings of every pod the project creates (Ray heads, workers, submitters;
:func:`secure_pod`, :func:`container_security`).

- No privilege escalation, the container runtime's default seccomp profile, and every Linux
  capability dropped, on every container, none added back. Ray, NCCL (sockets or EFA) and the
  S3 clients need none. KubeRay copies the Ray container's ``securityContext`` to the
  ``wait-gcs-ready`` init container it injects into workers, and the autoscaler sidecar gets
  :func:`container_security` through ``autoscalerOptions``, so the pods KubeRay creates pass the
  Ray namespace's Pod Security level ``baseline`` (:data:`environment.contract.POD_SECURITY_LABELS`,
  enforced) and every ``restricted`` check but ``runAsNonRoot`` (the DLC runs as root).
- EFA: the AWS EFA device plugin hands the ``/dev/infiniband`` devices to the pod, so no
  privileged mode is needed (EKS user guide, "Run machine learning training on Amazon EKS with
  Elastic Fabric Adapter": the device plugin "does not require a Pod to run in privileged
  mode"). libfabric's EFA provider pins the buffers it registers with the NIC, up to
  ``RLIMIT_MEMLOCK``; that limit comes from the GPU node's containerd runtime spec
  (:data:`environment.contract.EFA_MEMLOCK_RLIMIT`), not from the capability ``IPC_LOCK``,
  which baseline forbids. Pinned pages stay charged to the pod's memory limit.
- No Kubernetes service-account token mounted: nothing in these pods calls the Kubernetes API,
  except the Ray autoscaler sidecar KubeRay adds to the long-lived cluster's head (it scales the
  RayCluster's worker group through the API), which alone mounts the token
  (:data:`API_TOKEN_PROJECTION`). EKS
  Pod Identity does not use that token: its admission webhook mounts a separate projected
  token (audience ``pods.eks.amazonaws.com``) at
  ``/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token`` and sets
  ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` (the node agent, ``http://169.254.170.23/v1/credentials``)
  and ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``; the AWS SDKs' container credential provider
  reads those, whatever ``automountServiceAccountToken`` says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from charts import ChartError
from charts.provenance import POD_TEMPLATE_LABELS, image_reference
from environment import Environment, GpuNodeGroupSpec
from environment.contract import EFA_RESOURCE, GPU_RESOURCE, RAY_PEER_LABEL
from training import contract
from training.contract import head_grace_seconds, stop_wait_seconds

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""Well-known label the kubelet puts on every node: the worker nodeSelector pins the type too."""
RAY_CONTAINER_HEAD = "ray-head"
RAY_CONTAINER_WORKER = "ray-worker"
SHM_VOLUME = "dshm"
STAGING_VOLUME = "local-staging"
RUNS_VOLUME = "runs"
"""The shared file system of the runs, where the spec has one (``storage.shared_claim``)."""
STAGING_MOUNT = "/mnt/raytrain-local"
"""Where GPU workers see their checkpoint staging emptyDir (RAYTRAIN_CHECKPOINT_LOCAL_DIR)."""
STAGING_DISK_FRACTION = 0.9
"""Of the NVMe RAID0 the staging emptyDir may fill: the rest (and the image, on the same array)
stays for the kubelet's own files and logs, so the kubelet evicts the pod before the disk fills."""
AUTOSCALER_RESOURCES = {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": "200m", "memory": "512Mi"}}
"""The Ray autoscaler sidecar on the long-lived head (KubeRay's default asks 500m / 512Mi).
Requests = limits: the head pod's QoS class is Guaranteed only if every container's are."""
API_TOKEN_VOLUME = "autoscaler-api-token"
API_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Ray's KubeRay node provider reads its token and CA (ray 2.58
autoscaler/_private/kuberay/node_provider.py ``load_k8s_secrets``)."""
API_TOKEN_PROJECTION = {"sources": [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}
"""The token and CA of Kubernetes' own ``kube-api-access`` projection (what
``automountServiceAccountToken`` mounts into every container; its ``namespace`` file Ray does not
read), mounted into the autoscaler sidecar only: KubeRay v1.7.0 binds the
autoscaler's Role to the head pod's one service account (common/rbac.go), and the head's Ray
container runs every -on-cluster driver, which must not patch pods or the RayCluster."""
AUTOSCALER_VERSION = "v2"
"""Explicit, although Ray 2.58's ``ray start --head`` runs autoscaler v2 anyway: KubeRay v1.7.0
gives the head and the workers ``restartPolicy: Never`` only for an explicit ``v2``
(common/pod.go:278-280, 698-700). A pod restarted in place keeps its Ray node id out of the
autoscaler's view (Ray's KubeRay autoscaling guide: both versions need Never), so an idle worker
may never be reclaimed; with Never a failed pod is replaced by the operator instead."""
IDLE_TIMEOUT_SECONDS = 300
"""An idle GPU worker pod of the long-lived cluster goes after this; cluster-autoscaler then
removes its node."""
TOKEN_AUTH = {"mode": "token"}
"""Ray's token authentication: KubeRay creates a Secret named after the RayCluster (a random
token under ``auth_token``) and injects ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` into the
head, the workers, their ``wait-gcs-ready`` init containers, the autoscaler sidecar and a
RayJob's submitter, so GCS, dashboard and job API refuse any caller without the token. Set
explicitly: KubeRay v1.7.0 turns it on only when ``mode`` says ``token``."""
MIN_TOKEN_AUTH_RAY = (2, 52)
"""KubeRay v1.7.0 refuses token mode for an older ``rayVersion``."""

SECCOMP = {"type": "RuntimeDefault"}


def container_security() -> dict[str, Any]:
    """``securityContext`` of one container: no capability at all."""
    return {"allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": dict(SECCOMP)}


def secure_pod(pod: dict[str, Any], *, automount_token: bool = False) -> dict[str, Any]:
    """``pod`` (a pod spec) with the pod- and container-level settings of "Pod security" (the module docstring).
    ``automount_token``: for a pod whose every container calls the Kubernetes API (none here)."""
    containers = [{**c, "securityContext": container_security()} for c in pod["containers"]]
    return {**pod, "automountServiceAccountToken": automount_token,
            "securityContext": {"seccompProfile": dict(SECCOMP)}, "containers": containers}


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterShape:
    """What differs between the clusters built from one spec."""
    env: Environment
    worker_replicas: int
    """GPU worker pods (one per node: each takes every GPU and EFA interface of its node)."""
    checkpoint_grace_seconds: int
    """The longest ``checkpoint.sigterm_grace_seconds`` of a job on this cluster: the pods'
    terminationGracePeriodSeconds derive from it (:func:`stop_wait_seconds`, :func:`head_grace_seconds`)."""
    cluster_label: str
    """Value of the Ray-cluster label on its pods: what its network policy admits."""
    group_name: str = ""
    """The GPU node group the workers run on (empty: the spec's primary group)."""
    service_account: str = ""
    """The pods' service account: a RayJob's own cluster runs under one named after the run (its
    AWS identity reaches only that run's folder, infra/constructs/pod_identity.py); empty: the
    spec's ``ray.service_account`` (the long-lived cluster's, single-team)."""

    @property
    def group(self) -> GpuNodeGroupSpec:
        return self.env.gpu_group(self.group_name)
    autoscale: bool = False
    """True for the long-lived cluster: no GPU worker until a job asks (Ray's autoscaler adds
    pods up to the job size, cluster-autoscaler the nodes under them), so GPU nodes scale to 0."""
    cpu_job_cpus: float = 0
    """A CPU job's cluster: its one worker pod asks for these CPUs (its Ray workers' together)
    and no GPU or EFA. 0: GPU workers taking whole nodes."""
    gpus_per_pod: int = 0
    """GPUs of each GPU worker pod (the job's ``WorldSize.workers_per_node``); 0: every GPU of
    its node. A job smaller than a node asks for its own GPUs and still takes the node's CPUs,
    memory and EFA interfaces (a node runs one worker pod)."""

    @property
    def pod_gpus(self) -> int:
        return self.gpus_per_pod or self.group.gpus_per_node


def gpu_worker_env(group: GpuNodeGroupSpec) -> list[dict[str, str]]:
    """NCCL/libfabric environment of GPU workers (as the DLC, the EKS EFA docs and AWS's
    Ray Train sample set it: socket interface eth0, libfabric provider efa, the OFI NCCL plugin).

    NCCL_DEBUG=INFO makes NCCL log the transport it selected: the evidence the transport gate
    reads. FI_EFA_USE_DEVICE_RDMA only where the instance has GPUDirect RDMA (not g5/g6).
    """
    pairs = [("NCCL_DEBUG", "INFO"), ("NCCL_SOCKET_IFNAME", "eth0")]
    if group.efa_per_node:
        pairs += [("FI_PROVIDER", "efa"), ("NCCL_NET_PLUGIN", "ofi")]
        if group.instance.gpudirect_rdma:
            pairs.append(("FI_EFA_USE_DEVICE_RDMA", "1"))
    return [{"name": k, "value": v} for k, v in pairs]


def run_record_env(env: Environment, group: GpuNodeGroupSpec, *, gpu_worker: bool = False) -> list[dict[str, Any]]:
    """What the job records about where it ran (training/run_record.py reads these), plus the
    bucket's region: the pod role may not call GetBucketLocation, so S3 clients must be told.

    The node name comes from the downward API (no extra pod privileges). Node labels (zone,
    instance type) are not exposed that way; every GPU node is in the spec's GPU zone, so GPU
    workers are told that zone; the head (system nodes span zones) is not."""
    node = {"name": contract.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    zone = [(contract.ENV_AZ, env.cluster.gpu_availability_zone)] if gpu_worker else []
    pairs = zone + [(contract.ENV_CLUSTER, env.cluster.name), (contract.ENV_REGION, env.cluster.region),
             # a spot group of several types: the pod cannot read its node's labels, so it is
             # told the types it may be on
             (contract.ENV_INSTANCE_TYPE, ",".join(group.all_instance_types)),
             # the run's cost (training/incidents.py): its node group's capacity type; the price
             # travels in the job's runtime env (charts/ray_charts.py runtime_env_yaml), never in
             # the pod template, where a price edit would recreate the long-lived cluster
             (contract.ENV_CAPACITY_TYPE, group.capacity),
             # MFU's denominator: the job never guesses its GPU's peak from a device name.
             (contract.ENV_PEAK_TFLOPS, gpu_peaks(group)),
             ("AWS_REGION", env.cluster.region), ("AWS_DEFAULT_REGION", env.cluster.region)]
    return [node] + [{"name": k, "value": v} for k, v in pairs]


def node_placement(group: GpuNodeGroupSpec) -> dict[str, Any]:
    """The worker pods' node selection: the group's labels, and its instance type; a spot group
    of several types accepts each of them (a nodeSelector holds one value: node affinity)."""
    if len(group.all_instance_types) == 1:
        return {"nodeSelector": {**group.labels, INSTANCE_TYPE_LABEL: group.instance_type}}
    types = {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(group.all_instance_types)}
    return {"nodeSelector": dict(group.labels), "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [types]}]}}}}


def gpu_peaks(group: GpuNodeGroupSpec) -> str:
    """``RAYTRAIN_PEAK_BF16_TFLOPS``: the GPU's peak; for a group whose types carry different GPU
    models, ``MODEL=peak`` per model (the job takes the one its device names: training/metrics.py)."""
    from environment.instances import INSTANCE_TYPES

    peaks = {INSTANCE_TYPES[t].gpu_model: INSTANCE_TYPES[t].gpu_bf16_tflops for t in group.all_instance_types}
    if len(peaks) == 1:
        return f"{group.instance.gpu_bf16_tflops:g}"
    return ",".join(f"{model}={peak:g}" for model, peak in peaks.items())


def cpu_worker_resources(group: GpuNodeGroupSpec, cpus: float) -> dict[str, str]:
    """Requests = limits of a CPU job's worker pod: its CPUs (whole), and the node's memory per
    CPU for each of them."""
    whole = max(1, math.ceil(cpus))
    return {"cpu": str(whole), "memory": f"{math.ceil(whole * group.pod_memory_gib / group.pod_cpu)}Gi"}


def worker_resources(group: GpuNodeGroupSpec, gpus: int = 0) -> dict[str, str]:
    """Requests = limits of one GPU worker pod (Guaranteed QoS: never the first to be evicted);
    ``gpus``: of a job smaller than a node (0: all of the node's)."""
    resources = {"cpu": str(group.pod_cpu), "memory": f"{group.pod_memory_gib}Gi",
                 GPU_RESOURCE: str(gpus or group.gpus_per_node)}
    if group.efa_per_node:
        resources[EFA_RESOURCE] = str(group.efa_per_node)
    return resources


def head_resources(env: Environment) -> dict[str, str]:
    """Small enough that the long-lived head, a RayJob's own head, the submitters and the
    add-ons share the system nodes (``raytrain-eks preflight`` checks they fit)."""
    return {"cpu": str(env.ray.head_cpu), "memory": f"{env.ray.head_memory_gib}Gi"}


def staging_gib(env: Environment, group: GpuNodeGroupSpec) -> int:
    """``sizeLimit`` of the staging emptyDir: :data:`STAGING_DISK_FRACTION` of the NVMe RAID0,
    less the image (containerd's folder is on the same array)."""
    return int(group.instance.instance_store_gb * 10**9 / 2**30 * STAGING_DISK_FRACTION) - env.image.disk_gib


def _staging(env: Environment, group: GpuNodeGroupSpec) -> tuple[list[dict], list[dict], list[dict]]:
    """The checkpoint staging directory (volumes, mounts, env) of GPU workers: an emptyDir, which
    sits on the node's NVMe RAID0 (nodeadm's RAID0 local-storage strategy bind-mounts the
    kubelet's folder onto the array: infra/constructs/node_groups.py), sized so the
    kubelet evicts the pod before the disk fills; a hostPath would do the same and fail Pod
    Security's baseline. Nothing where the instance has no instance store."""
    if not group.instance.instance_store_gb:
        return [], [], []
    return ([{"name": STAGING_VOLUME, "emptyDir": {"sizeLimit": f"{staging_gib(env, group)}Gi"}}],
            [{"name": STAGING_VOLUME, "mountPath": STAGING_MOUNT}],
            [{"name": contract.ENV_CHECKPOINT_LOCAL_DIR, "value": f"{STAGING_MOUNT}/checkpoints"}])


def _shm(memory: str) -> tuple[list[dict], list[dict]]:
    """/dev/shm as memory: the container default (64 MiB) starves NCCL and the object store.
    Sized to the container's memory limit, as KubeRay sizes its own (common/pod.go
    ``makeEmptyDirVolume``), which it skips once the template mounts ``/dev/shm``."""
    return ([{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": memory}}],
            [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}])


def _shared_runs(env: Environment) -> tuple[list[dict], list[dict]]:
    """The runs' shared file system (``storage.shared_claim`` mounted at ``storage.shared_path``,
    training/storage/__init__.py), on the head (the driver writes the run record) and every worker;
    nothing when the runs are in the bucket."""
    if not env.storage.shared_claim:
        return [], []
    return ([{"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": env.storage.shared_claim}}],
            [{"name": RUNS_VOLUME, "mountPath": env.storage.shared_path}])


def _worker_pod(shape: ClusterShape) -> dict[str, Any]:
    """The worker pod spec: a GPU worker takes its node's GPUs, EFA interfaces, CPUs and memory
    and stages checkpoints on the NVMe; a CPU job's worker takes its CPUs only."""
    env, group = shape.env, shape.group
    if shape.cpu_job_cpus:
        resources = cpu_worker_resources(group, shape.cpu_job_cpus)
        # No GPU requested: "void" keeps the NVIDIA runtime from exposing the node's GPUs anyway.
        pod_env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, *run_record_env(env, group)]
        staging_volumes, staging_mounts = [], []
    else:
        resources = worker_resources(group, shape.pod_gpus)
        staging_volumes, staging_mounts, staging_env = _staging(env, group)
        pod_env = [*gpu_worker_env(group), *run_record_env(env, group, gpu_worker=True), *staging_env]
    # Ray's own SIGTERM drain (30 s unless told) would kill the workers long before the checkpoint grace
    pod_env.append({"name": contract.RAY_SIGTERM_DRAIN_ENV, "value": str(shape.checkpoint_grace_seconds)})
    volumes, mounts = _shm(resources["memory"])
    runs_volumes, runs_mounts = _shared_runs(env)
    return {
        "serviceAccountName": shape.service_account or env.ray.service_account,
        "terminationGracePeriodSeconds": stop_wait_seconds(shape.checkpoint_grace_seconds),
        **node_placement(group),
        "tolerations": [{"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}
                        for t in group.taints],
        "volumes": volumes + staging_volumes + runs_volumes,
        "containers": [{
            "name": RAY_CONTAINER_WORKER,
            "image": image_reference(env),
            "imagePullPolicy": "IfNotPresent",
            "env": pod_env,
            "resources": {"requests": resources, "limits": dict(resources)},
            "volumeMounts": mounts + staging_mounts + runs_mounts,
        }],
    }


def ray_cluster_spec(shape: ClusterShape) -> dict[str, Any]:
    """The cluster as Kubernetes JSON: a head on the system nodes and one GPU worker group.

    Charts turn it into typed bindings with :func:`charts.ray_charts.to_bindings`.
    """
    env = shape.env
    group = shape.group
    image = image_reference(env)
    ray_version = tuple(int(p) for p in env.image.ray_version.split(".")[:2])
    if ray_version < MIN_TOKEN_AUTH_RAY:
        raise ChartError(f"{env.source}: image.ray_version: {env.image.ray_version!r} is too old for "
                         f"Ray's token authentication (needs {'.'.join(map(str, MIN_TOKEN_AUTH_RAY))}.0 or newer)")
    metadata = {"labels": {**POD_TEMPLATE_LABELS, RAY_PEER_LABEL: shape.cluster_label}}
    head_memory = head_resources(env)["memory"]
    volumes, mounts = _shm(head_memory)
    runs_volumes, runs_mounts = _shared_runs(env)
    volumes, mounts = volumes + runs_volumes, mounts + runs_mounts
    head_pod = {
        "serviceAccountName": shape.service_account or env.ray.service_account,
        "terminationGracePeriodSeconds": head_grace_seconds(shape.checkpoint_grace_seconds),
        "nodeSelector": dict(env.system_node_group.labels),
        "volumes": volumes + ([{"name": API_TOKEN_VOLUME, "projected": API_TOKEN_PROJECTION}] if shape.autoscale else []),
        "containers": [{
            "name": RAY_CONTAINER_HEAD,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            # The head never runs GPU work; "void" keeps the NVIDIA runtime from exposing any.
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, *run_record_env(env, group)],
            "resources": {"requests": head_resources(env), "limits": head_resources(env)},
            "volumeMounts": mounts,
        }],
    }
    workers = shape.worker_replicas
    spec: dict[str, Any] = {
        "rayVersion": env.image.ray_version,
        "authOptions": dict(TOKEN_AUTH),
        "headGroupSpec": {
            # num-cpus 0: no Ray task lands on the head; the job's driver still runs there.
            "rayStartParams": {"num-cpus": "0", "num-gpus": "0"},
            # The autoscaler sidecar (long-lived cluster) is the one caller of the Kubernetes
            # API: only that head keeps a service-account token.
            "template": {"metadata": metadata, "spec": secure_pod(head_pod)},
        },
        "workerGroupSpecs": [{
            "groupName": group.name,
            # A job's own cluster: a fixed world size, min = max = replicas. The long-lived
            # cluster: none until a job asks, at most the job size.
            # The long-lived cluster leaves ``replicas`` to Ray's autoscaler (the CRD defaults it
            # to 0): a re-applied manifest that set it would conflict with the autoscaler's
            # writes under server-side apply, or scale a running job's workers back to 0.
            **({} if shape.autoscale else {"replicas": workers}),
            "minReplicas": 0 if shape.autoscale else workers,
            "maxReplicas": workers,
            "rayStartParams": {"num-gpus": "0" if shape.cpu_job_cpus else str(shape.pod_gpus)},
            "template": {"metadata": metadata, "spec": secure_pod(_worker_pod(shape))},
        }],
    }
    if shape.autoscale:
        spec["enableInTreeAutoscaling"] = True
        spec["autoscalerOptions"] = {"version": AUTOSCALER_VERSION, "idleTimeoutSeconds": IDLE_TIMEOUT_SECONDS,
                                     "resources": AUTOSCALER_RESOURCES,
                                     "volumeMounts": [{"name": API_TOKEN_VOLUME, "mountPath": API_TOKEN_PATH,
                                                       "readOnly": True}],
                                     "securityContext": container_security()}
    return spec
