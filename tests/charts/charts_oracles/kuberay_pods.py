"""The pods KubeRay v1.7.0 really creates from a RayCluster spec or a RayJob: the templates plus
what the operator injects. Pod Security admission judges THESE, not the templates.

Port of ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``, ``ray-operator/controllers/ray/``:

- ``common/pod.go`` ``DefaultHeadPodTemplate``: with in-tree autoscaling, the head's service
  account becomes ``GetHeadGroupServiceAccountName`` (the template's, else the cluster name)
  and an ``autoscaler`` container is appended (``BuildAutoscalerContainer``: the head's image,
  500m / 512Mi, then ``mergeAutoscalerOverrides``: ``autoscalerOptions.resources`` and
  ``securityContext`` replace the defaults); token auth adds ``RAY_AUTH_MODE`` and
  ``RAY_AUTH_TOKEN`` (``configureTokenAuth``, ``SetContainerTokenAuthEnvVars``); a ``metrics``
  port 8080 is added to the Ray container when it declares none.
- ``DefaultWorkerPodTemplate``: the ``wait-gcs-ready`` init container (ENABLE_INIT_CONTAINER_INJECTION
  defaults to true): the Ray container's image, pull policy, env, volume mounts and a DEEP COPY
  of its ``securityContext``, 200m / 256Mi requests = limits; token env vars on it too.
- ``BuildPod``: unless ``plasma-directory`` is set, a Ray container that mounts nothing at
  ``/dev/shm`` gets the ``shared-mem`` emptyDir (medium Memory, ``sizeLimit`` = the container's
  memory limit, else its request: ``makeEmptyDirVolume``/``findMemoryReqOrLimit``); the
  autoscaling head's Ray and autoscaler containers share a ``ray-logs`` emptyDir at ``/tmp/ray``.
- restart policy (``DefaultHeadPodTemplate``:278-280, ``DefaultWorkerPodTemplate``:698-700, with
  ``utils/util.go`` ``IsAutoscalingV2Enabled``:756-758): only when in-tree autoscaling is on AND
  ``autoscalerOptions.version`` is explicitly ``v2`` does KubeRay set ``restartPolicy: Never`` on
  the head and every worker (the head's Ray container also gets ``RAY_enable_autoscaler_v2=true``,
  ``setAutoscalerV2EnvVars``; an explicit ``v1``: ``false``); otherwise the template's policy
  stands (Kubernetes' default ``Always``: a worker restarted in place is one the autoscaler may
  never reclaim).
- ``rayjob_controller.go`` ``getSubmitterTemplate`` / ``common/job.go``: the submitter Job's pod is
  ``submitterPodTemplate`` as given (KubeRay fills in command and env, not security).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

AUTOSCALER_CONTAINER = "autoscaler"
AUTOSCALER_DEFAULT_RESOURCES = {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "500m", "memory": "512Mi"}}
INIT_CONTAINER = "wait-gcs-ready"
INIT_RESOURCES = {"limits": {"cpu": "200m", "memory": "256Mi"}, "requests": {"cpu": "200m", "memory": "256Mi"}}
SHM_VOLUME, SHM_PATH = "shared-mem", "/dev/shm"
AUTOSCALER_V2_ENV = "RAY_enable_autoscaler_v2"
"""``utils/constant.go``:191."""
LOG_VOLUME, LOG_PATH = "ray-logs", "/tmp/ray"


@dataclass(frozen=True)
class EffectivePod:
    where: str
    """``<chart>: <role>`` (head, worker group name, submitter)."""
    pod: dict
    """``{"metadata": ..., "spec": ...}`` as the operator creates it."""


def _token_env(container: dict, cluster: str) -> None:
    names = {e["name"] for e in container.setdefault("env", [])}
    if "RAY_AUTH_MODE" not in names:
        container["env"].append({"name": "RAY_AUTH_MODE", "value": "token"})
    if "RAY_AUTH_TOKEN" not in names:
        container["env"].append({"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": cluster, "key": "auth_token"}}})


def _metrics_port(container: dict) -> None:
    if not any(p.get("name") == "metrics" for p in container.get("ports") or []):
        container.setdefault("ports", []).append({"name": "metrics", "containerPort": 8080})


def _memory(container: dict) -> str | None:
    resources = container.get("resources") or {}
    return (resources.get("limits") or {}).get("memory") or (resources.get("requests") or {}).get("memory")


def _add_empty_dir(pod: dict, container: dict, name: str, path: str, memory: bool) -> None:
    """common/pod.go addEmptyDir: nothing if the container already mounts ``path``."""
    if any(m.get("mountPath") == path for m in container.get("volumeMounts") or []):
        return
    volumes = pod["spec"].setdefault("volumes", [])
    if not any(v["name"] == name for v in volumes):
        empty: dict = {"medium": "Memory"} if memory else {}
        if memory and _memory(container):
            empty["sizeLimit"] = _memory(container)
        volumes.append({"name": name, "emptyDir": empty})
    container.setdefault("volumeMounts", []).append({"name": name, "mountPath": path})


def _build(pod: dict, params: dict, autoscaling_head: bool) -> dict:
    """common/pod.go BuildPod (volumes only: commands and probes do not change Pod Security)."""
    spec = pod["spec"]
    ray = spec["containers"][0]
    if "plasma-directory" not in params:
        _add_empty_dir(pod, ray, SHM_VOLUME, SHM_PATH, memory=True)
    if autoscaling_head:
        autoscaler = next(c for c in spec["containers"] if c["name"] == AUTOSCALER_CONTAINER)
        _add_empty_dir(pod, ray, LOG_VOLUME, LOG_PATH, memory=False)
        _add_empty_dir(pod, autoscaler, LOG_VOLUME, LOG_PATH, memory=False)
    return pod


def autoscaling_v2(spec: dict) -> bool:
    """``IsAutoscalingEnabled && IsAutoscalingV2Enabled``: in-tree autoscaling with an explicit v2."""
    return spec.get("enableInTreeAutoscaling") is True and (spec.get("autoscalerOptions") or {}).get("version") == "v2"


def restart_policy(pod: dict) -> str:
    """The pod's effective restart policy (Kubernetes defaults an unset one to ``Always``)."""
    return pod["spec"].get("restartPolicy") or "Always"


def head_pod(cluster: str, spec: dict) -> dict:
    head = spec["headGroupSpec"]
    pod = copy.deepcopy(head["template"])
    pod.setdefault("metadata", {})
    ps = pod["spec"]
    ray = ps["containers"][0]
    autoscaling = spec.get("enableInTreeAutoscaling") is True
    auth = (spec.get("authOptions") or {}).get("mode") == "token"
    if autoscaling:
        ps["serviceAccountName"] = ps.get("serviceAccountName") or cluster
        options = spec.get("autoscalerOptions") or {}
        autoscaler = {"name": AUTOSCALER_CONTAINER, "image": options.get("image", ray["image"]),
                      "imagePullPolicy": options.get("imagePullPolicy", "IfNotPresent"), "env": [],
                      "resources": copy.deepcopy(options.get("resources") or AUTOSCALER_DEFAULT_RESOURCES)}
        if auth:
            _token_env(autoscaler, cluster)
        autoscaler["env"] += copy.deepcopy(options.get("env") or [])
        autoscaler["volumeMounts"] = copy.deepcopy(options.get("volumeMounts") or [])
        if "securityContext" in options:
            autoscaler["securityContext"] = copy.deepcopy(options["securityContext"])
        ps["containers"].append(autoscaler)
        version = options.get("version")
        if version in ("v1", "v2"):
            ray.setdefault("env", []).append({"name": AUTOSCALER_V2_ENV, "value": "true" if version == "v2" else "false"})
        if version == "v2":
            ps["restartPolicy"] = "Never"
    _metrics_port(ray)
    if auth:
        _token_env(ray, cluster)
    return _build(pod, head.get("rayStartParams") or {}, autoscaling)


def worker_pod(cluster: str, spec: dict, group: dict) -> dict:
    pod = copy.deepcopy(group["template"])
    pod.setdefault("metadata", {})
    ps = pod["spec"]
    ray = ps["containers"][0]
    init = {"name": INIT_CONTAINER, "image": ray["image"], "imagePullPolicy": ray.get("imagePullPolicy"),
            "env": copy.deepcopy(ray.get("env") or []), "volumeMounts": copy.deepcopy(ray.get("volumeMounts") or []),
            "resources": copy.deepcopy(INIT_RESOURCES)}
    if "securityContext" in ray:
        init["securityContext"] = copy.deepcopy(ray["securityContext"])
    ps["initContainers"] = (ps.get("initContainers") or []) + [init]
    _metrics_port(ray)
    if autoscaling_v2(spec):
        ps["restartPolicy"] = "Never"
    if (spec.get("authOptions") or {}).get("mode") == "token":
        _token_env(ray, cluster)
        _token_env(init, cluster)
    return _build(pod, group.get("rayStartParams") or {}, False)


def cluster_pods(where: str, cluster: str, spec: dict) -> list[EffectivePod]:
    pods = [EffectivePod(f"{where}: head", head_pod(cluster, spec))]
    pods += [EffectivePod(f"{where}: worker {g['groupName']}", worker_pod(cluster, spec, g))
             for g in spec.get("workerGroupSpecs", [])]
    return pods


def effective_pods(chart: str, obj: dict) -> list[EffectivePod]:
    """Every pod KubeRay creates for one RayCluster or RayJob (a RayJob's own cluster is named
    ``<rayjob>-<5 random>``: any name of that shape judges the same)."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "RayCluster":
        return cluster_pods(chart, name, obj["spec"])
    if obj["kind"] != "RayJob":
        return []
    spec = obj["spec"]
    pods = []
    if "rayClusterSpec" in spec:
        pods += cluster_pods(chart, f"{name}-abcde", spec["rayClusterSpec"])
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and "submitterPodTemplate" in spec:
        pods.append(EffectivePod(f"{chart}: submitter", copy.deepcopy(spec["submitterPodTemplate"])))
    return pods


def qos_class(pod: dict) -> str:
    """kubernetes pkg/apis/core/helper/qos ``ComputePodQOS`` for CPU and memory: Guaranteed when
    every container (init ones included) has both limits, with requests equal to them (an unset
    request defaults to the limit); BestEffort when none has any; else Burstable."""
    containers = list(pod["spec"].get("initContainers") or []) + list(pod["spec"]["containers"])
    any_set, guaranteed = False, True
    for c in containers:
        resources = c.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for key in ("cpu", "memory"):
            if key in limits or key in requests:
                any_set = True
            if key not in limits or requests.get(key, limits[key]) != limits[key]:
                guaranteed = False
    return "Guaranteed" if guaranteed else ("Burstable" if any_set else "BestEffort")
