"""KubeRay's own admission rules, applied by the operator AFTER ``kubectl apply`` succeeded: a
RayCluster or RayJob that breaks one is parked (``ValidationFailed``) and never runs.

Port of ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``,
``ray-operator/controllers/ray/utils/validation.go``: ``ValidateRayClusterMetadata``,
``ValidateRayClusterUpgradeOptions``, ``ValidateRayClusterSpec`` (with
``validateRayGroupResources``, ``validateRayGroupLabels``, ``validateWorkerGroupIdleTimeout``,
``validateWorkerGroupPriority``), ``ValidateRayJobMetadata`` and ``ValidateRayJobSpec`` (with
``validateDeletionConfiguration``), and ``dashboardclient.UnmarshalRuntimeEnvYAML``. Constants from ``utils/constant.go`` (name limits, label
keys). Like the Go code, each function returns the FIRST error's message, or None.

Left out, because the charts emit none of the fields they judge (a test asserts that): GCS fault
tolerance (``gcsFaultToleranceOptions``, Redis), history server, TLS, network policy (feature
gates off by default), ``deletionStrategy``, a worker group's ``suspend`` (validation.go:199-218).
A RayJob's own ``spec.suspend`` (Kueue's queue) is ported: ValidateRayJobSpec :547-548, :561-562.
Default feature gates of v1.7.0 assumed.
"""
from __future__ import annotations

import re

import yaml

MAX_RAYCLUSTER_NAME = 53                     # utils/constant.go MaxRayClusterNameLength
MAX_RAYJOB_NAME = MAX_RAYCLUSTER_NAME - 6    # MaxRayJobNameLength
ORIGINATED_FROM_CRD = "ray.io/originated-from-crd"
CLUSTER_SELECTOR_KEY = "ray.io/cluster"      # RayJobClusterSelectorKey
FT_ANNOTATION = "ray.io/ft-enabled"
RAY_CONTAINER_INDEX = 0
UNSUPPORTED = ("gcsFaultToleranceOptions", "historyServerOptions", "tlsOptions", "networkPolicy",
               "deletionStrategy", "suspend")
"""Fields whose rules this port leaves out: the charts must not emit them (``suspend``: below
a RayJob's spec, i.e. a worker group's)."""

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUB = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns1035_label(name: str) -> bool:
    """k8s.io/apimachinery/pkg/util/validation IsDNS1035Label."""
    return len(name) <= 63 and bool(_DNS1035.fullmatch(name))


def is_qualified_name(key: str) -> bool:
    """apimachinery IsQualifiedName: ``[prefix/]name``, name <= 63, prefix a DNS-1123 subdomain."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return False
    if prefix and (len(prefix) > 253 or not _DNS1123_SUB.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED.fullmatch(name))


def is_valid_label_value(value: str) -> bool:
    """apimachinery IsValidLabelValue: empty, or <= 63 of the qualified-name alphabet."""
    return value == "" or (len(value) <= 63 and bool(_QUALIFIED.fullmatch(value)))


def _env_value(container: dict, name: str) -> str | None:
    for e in container.get("env", []) or []:
        if e.get("name") == name:
            return e.get("value", "")
    return None


def _version(text: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?.*", text)
    return tuple(int(g or 0) for g in m.groups()) if m else None


def _autoscaling(spec: dict) -> bool:
    return spec.get("enableInTreeAutoscaling") is True


def _autoscaling_v2(spec: dict) -> bool:
    return (spec.get("autoscalerOptions") or {}).get("version") == "v2"


def _group_resources(name: str, params: dict, resources: dict) -> str | None:
    if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and resources:
        return (f"resource fields should not be set in both rayStartParams and Resources for {name} group; "
                "please use only one")
    return None


def _group_labels(name: str, params: dict, labels: dict) -> str | None:
    if "labels" in params:
        return f"rayStartParams['labels'] is not supported for {name} group; please use the top-level Labels field instead"
    errors = [f"invalid label key for {name} group: '{k}'" for k in labels if not is_qualified_name(k)]
    errors += [f"invalid label value for key '{k}' in {name} group: '{v}'" for k, v in labels.items()
               if not is_valid_label_value(v)]
    return "; ".join(errors) or None


def validate_raycluster_metadata(metadata: dict) -> str | None:
    name = metadata.get("name", "")
    if len(name) > MAX_RAYCLUSTER_NAME:
        return f"RayCluster name should be no more than {MAX_RAYCLUSTER_NAME} characters"
    if not is_dns1035_label(name):
        return "RayCluster name should be a valid DNS1035 label"
    return None


def validate_raycluster_upgrade_options(obj: dict) -> str | None:
    kind = ((obj["spec"].get("upgradeStrategy") or {}).get("type"))
    if kind is not None and kind not in ("Recreate", "None"):
        return (f"The RayCluster spec is invalid: Spec.UpgradeStrategy.Type value {kind} is invalid, "
                "valid options are Recreate or None")
    creator = (obj["metadata"].get("labels") or {}).get(ORIGINATED_FROM_CRD, "")
    if kind is not None and creator in ("RayJob", "RayService"):
        return f"upgradeStrategy cannot be set when RayCluster is created by {creator}"
    return None


def validate_raycluster_spec(spec: dict, annotations: dict | None = None) -> str | None:
    annotations = annotations or {}
    head = spec["headGroupSpec"]
    head_containers = head["template"]["spec"].get("containers") or []
    if not head_containers:
        return "headGroupSpec should have at least one container"
    for check in (_group_resources("Head", head.get("rayStartParams", {}), head.get("resources", {})),
                  _group_labels("Head", head.get("rayStartParams", {}), head.get("labels", {}))):
        if check:
            return check
    autoscaling = _autoscaling(spec)
    for group in spec.get("workerGroupSpecs", []):
        name = group["groupName"]
        if not group["template"]["spec"].get("containers"):
            return "workerGroupSpec should have at least one container"
        lo, hi = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (lo is None or hi is None):
            return f"worker group {name} must set both minReplicas and maxReplicas when autoscaling is disabled"
        if lo is not None and lo < 0:
            return f"worker group {name} has negative minReplicas {lo}"
        if hi is not None and hi < 0:
            return f"worker group {name} has negative maxReplicas {hi}"
        if lo is not None and hi is not None and lo > hi:
            return f"worker group {name} has minReplicas {lo} greater than maxReplicas {hi}"
        for check in (_group_resources(name, group.get("rayStartParams", {}), group.get("resources", {})),
                      _group_labels(name, group.get("rayStartParams", {}), group.get("labels", {}))):
            if check:
                return check
        v2_env = _env_value(head_containers[RAY_CONTAINER_INDEX], "RAY_enable_autoscaler_v2") in ("1", "true")
        idle = group.get("idleTimeoutSeconds")
        if idle is not None:
            if idle < 0:
                return f"worker group {name}: idleTimeoutSeconds must be non-negative, got {idle}"
            if not (_autoscaling_v2(spec) or v2_env):
                return f"worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is not enabled"
        priority = group.get("priority")
        if priority:
            version = _version(spec.get("rayVersion", ""))
            if version is None or version < (2, 56, 0):
                return f"worker group {name}: priority is set, but minimum Ray version is 2.56.0"
            if not (_autoscaling_v2(spec) or v2_env):
                return f"worker group {name}: priority is set to {priority}, but autoscaler v2 is not enabled"
    ray = head_containers[RAY_CONTAINER_INDEX]
    ft = annotations.get(FT_ANNOTATION, "").lower() == "true" or "gcsFaultToleranceOptions" in spec
    if not ft and _env_value(ray, "RAY_REDIS_ADDRESS") is not None:
        return "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but GcsFaultToleranceOptions is not set"
    if head.get("rayStartParams", {}).get("redis-username") or _env_value(ray, "REDIS_USERNAME") is not None:
        return "cannot set redis username in rayStartParams or environment variables"
    if not autoscaling:
        value = _env_value(ray, "RAY_enable_autoscaler_v2")
        if value in ("1", "true"):
            return f"environment variable RAY_enable_autoscaler_v2 cannot be set to '{value}' when enableInTreeAutoscaling is false"
    else:
        options = spec.get("autoscalerOptions") or {}
        if "version" in options and _env_value(ray, "RAY_enable_autoscaler_v2") is not None:
            return "both .spec.autoscalerOptions.version and head Pod env var RAY_enable_autoscaler_v2 are set"
        if _autoscaling_v2(spec):
            if head["template"]["spec"].get("restartPolicy", "Never") != "Never":
                return "restartPolicy for head Pod should be Never or unset when using autoscaler V2"
            for group in spec.get("workerGroupSpecs", []):
                if group["template"]["spec"].get("restartPolicy", "Never") != "Never":
                    return f"restartPolicy for worker group {group['groupName']} should be Never or unset when using autoscaler V2"
    options = spec.get("autoscalerOptions") or {}
    if options.get("idleTimeoutSeconds", 0) < 0:
        return f"autoscalerOptions.idleTimeoutSeconds must be non-negative, got {options['idleTimeoutSeconds']}"
    if _env_value(options, "KUBERAY_GEN_AUTOSCALER_START_CMD") is not None:
        return "autoscalerOptions.env must not contain KUBERAY_GEN_AUTOSCALER_START_CMD"
    auth = spec.get("authOptions") or {}
    k8s_auth = auth.get("enableK8sTokenAuth") is True
    if auth.get("mode") == "token":
        if not spec.get("rayVersion"):
            return "authOptions.mode is 'token' but RayVersion was not specified. Ray version 2.52.0 or later is required"
        version = _version(spec["rayVersion"])
        if version is None:
            return f"authOptions.mode is 'token' but RayVersion format is invalid: {spec['rayVersion']}"
        if version < (2, 52, 0):
            return f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {spec['rayVersion']}"
        if k8s_auth and version < (2, 55, 0):
            return f"authOptions.enableK8sTokenAuth is enabled but minimum Ray version is 2.55.0, got {spec['rayVersion']}"
        if k8s_auth and auth.get("secretName"):
            return "authOptions.enableK8sTokenAuth is enabled and authOptions.secretName is also set"
    elif k8s_auth:
        return "authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to 'token'"
    return None


def validate_raycluster(obj: dict) -> str | None:
    """What the RayCluster controller checks before it reconciles (raycluster_controller.go
    ``rayClusterReconcile``: metadata, then spec, then upgrade options)."""
    return (validate_raycluster_metadata(obj["metadata"])
            or validate_raycluster_spec(obj["spec"], obj["metadata"].get("annotations"))
            or validate_raycluster_upgrade_options(obj))


def validate_rayjob_metadata(metadata: dict) -> str | None:
    name = metadata.get("name", "")
    if len(name) > MAX_RAYJOB_NAME:
        return f"The RayJob metadata is invalid: RayJob name should be no more than {MAX_RAYJOB_NAME} characters"
    if not is_dns1035_label(name):
        return "The RayJob metadata is invalid: RayJob name should be a valid DNS1035 label"
    return None


def validate_rayjob_spec(obj: dict) -> str | None:
    spec = obj["spec"]
    suspend = spec.get("suspend") is True
    shutdown = spec.get("shutdownAfterJobFinishes") is True
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    mode = spec.get("submissionMode", "K8sJobMode")
    backoff = spec.get("backoffLimit")
    if suspend and not shutdown:
        return ("The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not "
                "allowed to be suspended")
    if ttl < 0:
        return "The RayJob spec is invalid: TTLSecondsAfterFinished must be a non-negative integer"
    if not shutdown and ttl > 0:
        return ("The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false cannot "
                "have TTLSecondsAfterFinished")
    selector = spec.get("clusterSelector") or {}
    if suspend and selector:
        return "The RayJob spec is invalid: the ClusterSelector mode doesn't support the suspend operation"
    if "rayClusterSpec" not in spec and not selector:
        return "The RayJob spec is invalid: one of RayClusterSpec or ClusterSelector must be set"
    if selector:
        if not selector.get(CLUSTER_SELECTOR_KEY):
            return "cluster name in ClusterSelector should not be empty"
        if mode == "SidecarMode":
            return "ClusterSelector is not supported in SidecarMode"
        if backoff is not None and backoff > 0:
            return "The RayJob spec is invalid: BackoffLimit is incompatible with ClusterSelector mode"
    if mode == "InteractiveMode" and backoff is not None and backoff > 0:
        return "The RayJob spec is invalid: BackoffLimit is incompatible with InteractiveMode"
    if mode == "SidecarMode":
        if "submitterPodTemplate" in spec:
            return "Currently, SidecarMode doesn't support SubmitterPodTemplate"
        if "submitterConfig" in spec:
            return "Currently, SidecarMode doesn't support SubmitterConfig"
        head_restart = (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}).get(
            "spec", {}).get("restartPolicy", "")
        if head_restart not in ("", "Never"):
            return "restartPolicy for head Pod should be Never or unset when using SidecarMode"
    cluster = spec.get("rayClusterSpec")
    if cluster is not None:
        if (cluster.get("authOptions") or {}).get("enableK8sTokenAuth") is True:
            return "The RayJob spec is invalid: K8s token auth mode is currently not supported for RayJob"
        err = validate_raycluster_spec(cluster, obj["metadata"].get("annotations"))
        if err:
            return f"The RayJob spec is invalid: {err}"
    # utils/dashboardclient/dashboard_httpclient.go UnmarshalRuntimeEnvYAML: sigs.k8s.io/yaml into
    # RuntimeEnvType (map[string]interface{}): a mapping, or nothing; a list or a scalar fails.
    try:
        runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML", "") or "")
    except yaml.YAMLError as err:
        return f"failed to unmarshal RuntimeEnvYAML: {err}"
    if runtime_env is not None and not isinstance(runtime_env, dict):
        return f"failed to unmarshal RuntimeEnvYAML: a {type(runtime_env).__name__} is not a map"
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        return "The RayJob spec is invalid: activeDeadlineSeconds must be a positive integer"
    if spec.get("preRunningDeadlineSeconds") is not None and spec["preRunningDeadlineSeconds"] <= 0:
        return "The RayJob spec is invalid: preRunningDeadlineSeconds must be a positive integer"
    if backoff is not None and backoff < 0:
        return "The RayJob spec is invalid: backoffLimit must be a positive integer"
    return None


def validate_rayjob(obj: dict) -> str | None:
    """rayjob_controller.go ``validateRayJob``: metadata, then spec."""
    return validate_rayjob_metadata(obj["metadata"]) or validate_rayjob_spec(obj)


def validate(obj: dict) -> str | None:
    """The controller's verdict on one synthesized object (None for kinds KubeRay does not own).
    A RayJob's own cluster is a RayCluster labelled ``ray.io/originated-from-crd: RayJob``
    (rayjob_controller.go ``constructRayClusterForRayJob``), judged by the RayCluster rules too."""
    if obj.get("kind") == "RayCluster":
        return validate_raycluster(obj)
    if obj.get("kind") != "RayJob":
        return None
    err = validate_rayjob(obj)
    if err or "rayClusterSpec" not in obj["spec"]:
        return err
    # constructRayClusterForRayJob: the RayJob's own labels and annotations, plus the origin label
    metadata = obj["metadata"]
    derived = {"kind": "RayCluster", "spec": obj["spec"]["rayClusterSpec"],
               "metadata": {"name": f"{metadata['name']}-abcde",
                            "labels": {**(metadata.get("labels") or {}), ORIGINATED_FROM_CRD: "RayJob"},
                            "annotations": dict(metadata.get("annotations") or {})}}
    return validate_raycluster(derived)
