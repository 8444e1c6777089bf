"""Every synthesized RayCluster and RayJob as KubeRay v1.7.0's controller judges it after
``kubectl apply``: its own validation (charts_oracles/kuberay_validation.py) and the retry rule.
"""
from __future__ import annotations

import pytest
from charts_oracles.kuberay_validation import UNSUPPORTED, validate, validate_rayjob, validate_rayjob_spec

VARIANTS = ["default_synth", "large_synth"]


def kuberay_objects(synth):
    return [(chart, o) for chart, objs in synth.docs.items() for o in objs if o["kind"] in ("RayCluster", "RayJob")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_controller_accepts_every_synthesized_object(variant, request):
    synth = request.getfixturevalue(variant)
    verdicts = {chart: validate(obj) for chart, obj in kuberay_objects(synth)}
    assert {c for c in verdicts if c.startswith("rayjob-")} and "raycluster" in verdicts
    assert {c: v for c, v in verdicts.items() if v} == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_field_the_port_leaves_out_is_emitted(variant, request):
    # The oracle does not port the rules of these fields: emitting one needs its rules first.
    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                yield from keys(v)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)
    for chart, obj in kuberay_objects(request.getfixturevalue(variant)):
        # A RayJob's own suspend (Kueue's queue) is ported (validate_rayjob_spec); a worker group's is not.
        spec = {k: v for k, v in obj["spec"].items() if not (obj["kind"] == "RayJob" and k == "suspend")}
        assert not set(keys(spec)) & set(UNSUPPORTED), chart


def test_the_oracle_rejects_what_kuberay_rejects(default_synth):
    # The port, checked on the controller's own examples (validation.go, ValidateRayJobSpec).
    rj = default_synth.one("rayjob-smoke-on-cluster")
    bad = {**rj, "spec": {**rj["spec"], "backoffLimit": 1}}
    assert validate_rayjob(bad) == "The RayJob spec is invalid: BackoffLimit is incompatible with ClusterSelector mode"
    own = default_synth.one("rayjob-smoke")
    with_upgrade = {**own, "spec": {**own["spec"], "rayClusterSpec": {
        **own["spec"]["rayClusterSpec"], "upgradeStrategy": {"type": "Recreate"}}}}
    assert validate(with_upgrade) == "upgradeStrategy cannot be set when RayCluster is created by RayJob"
    long = {**own, "metadata": {**own["metadata"], "name": "x" * 48}}
    assert "no more than 47 characters" in validate(long)


def test_on_cluster_jobs_carry_no_backoff_limit(default_synth):
    # A retry needs a fresh cluster; on the long-lived one KubeRay refuses the field outright.
    for chart, obj in kuberay_objects(default_synth):
        if obj["kind"] == "RayJob" and "clusterSelector" in obj["spec"]:
            assert "backoffLimit" not in obj["spec"], chart


def test_the_oracle_reads_runtime_env_yaml_as_kuberay_does(default_synth):
    # dashboardclient.UnmarshalRuntimeEnvYAML: into map[string]interface{}; a YAML list fails
    own = default_synth.one("rayjob-smoke")
    listed = {**own, "spec": {**own["spec"], "runtimeEnvYAML": "- working_dir\n"}}
    assert validate_rayjob_spec(listed).startswith("failed to unmarshal RuntimeEnvYAML")
    assert validate_rayjob_spec({**own, "spec": {**own["spec"], "runtimeEnvYAML": ""}}) is None


def test_the_derived_cluster_carries_the_rayjobs_annotations(default_synth):
    # constructRayClusterForRayJob copies the RayJob's annotations: the RayCluster controller
    # then sees e.g. ray.io/ft-enabled with a RAY_REDIS_ADDRESS-free head as GCS FT enabled
    own = default_synth.one("rayjob-smoke")
    head = own["spec"]["rayClusterSpec"]["headGroupSpec"]
    redis_env = [*head["template"]["spec"]["containers"][0].get("env", []), {"name": "RAY_REDIS_ADDRESS", "value": "r:6379"}]
    containers = [{**head["template"]["spec"]["containers"][0], "env": redis_env}]
    spec = {**own["spec"], "rayClusterSpec": {**own["spec"]["rayClusterSpec"], "headGroupSpec": {
        **head, "template": {**head["template"], "spec": {**head["template"]["spec"], "containers": containers}}}}}
    bad = {**own, "spec": spec}
    assert validate(bad).startswith("The RayJob spec is invalid: RAY_REDIS_ADDRESS is set")
    annotated = {**bad, "metadata": {**own["metadata"], "annotations": {
        **own["metadata"].get("annotations", {}), "ray.io/ft-enabled": "true"}}}
    assert validate(annotated) is None


def test_the_oracle_refuses_a_restarting_head_in_sidecar_mode(default_synth):
    # ValidateRayJobSpec: SidecarMode needs the head's restartPolicy Never or unset
    own = default_synth.one("rayjob-smoke")
    head = own["spec"]["rayClusterSpec"]["headGroupSpec"]
    spec = {k: v for k, v in own["spec"].items() if k not in ("submitterPodTemplate", "submitterConfig")}
    spec |= {"submissionMode": "SidecarMode", "rayClusterSpec": {**own["spec"]["rayClusterSpec"], "headGroupSpec": {
        **head, "template": {**head["template"], "spec": {**head["template"]["spec"], "restartPolicy": "Always"}}}}}
    assert validate_rayjob_spec({**own, "spec": spec}) == \
        "restartPolicy for head Pod should be Never or unset when using SidecarMode"


KUBERAY_APPENDED_ENV = ("RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE", "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME",
                        "KUBERAY_GEN_RAY_START_CMD", "FQ_RAY_IP", "RAY_IP", "RAY_USAGE_STATS_EXTRA_TAGS")
"""common/pod.go setContainerEnvVars / setInitContainerEnvVars (v1.7.0): appended to the Ray (and
init) containers without looking for an existing entry; a template that set one would carry it
twice, and the later (KubeRay's) would win."""


def test_templates_leave_kuberays_appended_env_alone(default_synth):
    for chart, obj in kuberay_objects(default_synth):
        spec = obj["spec"].get("rayClusterSpec", obj["spec"])
        if "headGroupSpec" not in spec:
            continue
        for template in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]:
            for container in template["spec"]["containers"]:
                assert not {e["name"] for e in container.get("env", [])} & set(KUBERAY_APPENDED_ENV), chart


def test_every_runtime_env_survives_the_submitters_bash(default_synth):
    from charts_oracles.ray_job_submit import runtime_env_argument_survives
    for chart, obj in kuberay_objects(default_synth):
        if obj["kind"] == "RayJob":
            assert runtime_env_argument_survives(obj["spec"]["runtimeEnvYAML"]), chart
    assert not runtime_env_argument_survives("env_vars: {A: $(reboot)}")
