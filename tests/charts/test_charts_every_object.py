"""What holds on every object of every chart, asserted where the seven full-manifest snapshots
used to be the only check (each chart's leaves were changed one at a time; these are the
changes no targeted, schema, security or drift test saw): the provenance every object carries,
names and namespace, the labels of every pod template, the submitter pod, the fixed size of a
job's own cluster, the deadlines, the long-lived cluster's autoscaler token, and the local
job's cluster being the GPU jobs' cluster with a CPU shape."""
from __future__ import annotations

import copy
import shlex

import yaml
from charts_testspec import TEST_DIGEST

from charts.cluster_spec import API_TOKEN_PROJECTION, API_TOKEN_VOLUME, IDLE_TIMEOUT_SECONDS
from charts.provenance import POD_TEMPLATE_LABELS, image_reference
from charts.ray_charts import SUBMITTER_CONTAINER, cluster_name
from environment.contract import (
    CODE_URI_ANNOTATION, GIT_COMMIT_LABEL, GIT_DIRTY_LABEL, IMAGE_ANNOTATION, IMAGE_DIGEST_ANNOTATION,
    IMAGE_LOCKED_LABEL, JOB_CONFIG_ANNOTATION, RAY_PEER_LABEL,
)
from environment.network_policy import ray_cluster_policy, raycluster_label, rayjob_label
from training.config import load_job_config

CHARTS = ["raycluster", "rayjob-smoke", "rayjob-smoke-on-cluster", "rayjob-finetune-qwen",
          "rayjob-finetune-qwen-on-cluster", "rayjob-local", "network-policy"]
MADE_BY = {"app.kubernetes.io/managed-by": "cdk8s", "app.kubernetes.io/part-of": "raytrain-eks"}


def rayjobs(synth):
    return {chart: synth.one(chart) for chart in synth.docs if chart.startswith("rayjob-")}


def pod_templates(obj: dict) -> list[dict]:
    spec = obj["spec"]
    cluster = spec if obj["kind"] == "RayCluster" else spec.get("rayClusterSpec")
    found = [spec["submitterPodTemplate"]] if "submitterPodTemplate" in spec else []
    if cluster:
        found += [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return found


def config_path(rayjob: dict) -> str:
    return shlex.split(rayjob["spec"]["entrypoint"])[4]  # python -m training --config <path> ...


def test_every_chart_is_written(default_synth):
    assert sorted(default_synth.result.files) == sorted(CHARTS)


def test_every_object_says_what_made_it_and_from_what(default_synth):
    env, result = default_synth.env, default_synth.result
    for chart, objects in default_synth.docs.items():
        for obj in objects:
            labels, annotations = obj["metadata"]["labels"], obj["metadata"].get("annotations", {})
            if obj["kind"] == "NetworkPolicy":
                assert labels == {"app.kubernetes.io/part-of": "raytrain-eks"}, chart
                continue
            assert MADE_BY.items() <= labels.items(), chart
            assert annotations[IMAGE_ANNOTATION] == image_reference(env), chart
            assert annotations[IMAGE_DIGEST_ANNOTATION] == TEST_DIGEST and labels[IMAGE_LOCKED_LABEL] == "true", chart
            if obj["kind"] == "RayJob":
                assert labels[GIT_COMMIT_LABEL] == (result.source.git_commit or "none"), chart
                assert labels[GIT_DIRTY_LABEL] == ("true" if result.source.dirty else "false"), chart
                working_dir = yaml.safe_load(obj["spec"]["runtimeEnvYAML"])["working_dir"]
                assert annotations[CODE_URI_ANNOTATION] == working_dir == result.code.uri(env.bucket_name), chart
                assert annotations[JOB_CONFIG_ANNOTATION] == config_path(obj), chart


def test_every_object_is_in_the_spec_namespace_under_its_charts_name(default_synth):
    env = default_synth.env
    assert all(obj["metadata"]["namespace"] == env.ray.namespace for objs in default_synth.docs.values() for obj in objs)
    for chart, rayjob in rayjobs(default_synth).items():
        assert chart == f"rayjob-{rayjob['metadata']['name']}"
    labels = {t["metadata"]["labels"][RAY_PEER_LABEL] for objs in default_synth.docs.values() for obj in objs
              if obj["kind"] != "NetworkPolicy" for t in pod_templates(obj)}
    policies = sorted(p["metadata"]["name"] for p in default_synth.docs["network-policy"])
    assert policies == sorted(ray_cluster_policy(label, env.ray.namespace)["metadata"]["name"] for label in labels)


def test_every_pod_template_carries_the_constant_labels_and_its_clusters_alone(default_synth):
    """Only labels that never change (KubeRay's Recreate hash covers pod-template labels: see
    charts/provenance.py) and the Ray-cluster label its network policy selects: the long-lived
    cluster's for it and the submitters of jobs on it, the job's own otherwise."""
    long_lived = raycluster_label(cluster_name(default_synth.env))
    for chart, objects in default_synth.docs.items():
        for obj in objects:
            if obj["kind"] == "NetworkPolicy":
                continue
            own = obj["kind"] == "RayJob" and "rayClusterSpec" in obj["spec"]
            peer = rayjob_label(obj["metadata"]["name"]) if own else long_lived
            for template in pod_templates(obj):
                assert template["metadata"]["labels"] == {**POD_TEMPLATE_LABELS, RAY_PEER_LABEL: peer}, chart


def test_the_submitter_runs_the_heads_image_once_on_the_system_nodes(default_synth):
    """The container is named as KubeRay v1.7.0 names its own submitter and runs the head's image
    as that one does (ray-operator/controllers/ray/utils/constant.go ``SubmitterContainerName``,
    common/job.go ``GetDefaultSubmitterContainer``); a Job's pod may not restart in place
    (Kubernetes batch/v1 validation: ``restartPolicy`` Never or OnFailure)."""
    env = default_synth.env
    for chart, rayjob in rayjobs(default_synth).items():
        pod = rayjob["spec"]["submitterPodTemplate"]["spec"]
        (container,) = pod["containers"]
        assert (container["name"], container["image"], container["imagePullPolicy"]) == (
            SUBMITTER_CONTAINER, image_reference(env), "IfNotPresent"), chart
        assert pod["nodeSelector"] == env.system_node_group.labels and pod["restartPolicy"] == "Never", chart


def test_a_jobs_own_cluster_has_a_fixed_size_and_its_deadline_is_the_jobs(default_synth):
    for chart, rayjob in rayjobs(default_synth).items():
        limits = load_job_config(config_path(rayjob)).rayjob
        assert rayjob["spec"]["activeDeadlineSeconds"] == limits.active_deadline_minutes * 60, chart
        for group in rayjob["spec"].get("rayClusterSpec", {}).get("workerGroupSpecs", []):
            assert group["minReplicas"] == group["replicas"] == group["maxReplicas"], chart


def test_the_long_lived_clusters_autoscaler_reads_kubernetes_own_token_projection(default_synth):
    """The token volume is the projection Kubernetes itself mounts as ``kube-api-access``:
    ``expirationSeconds`` 3607 is kubernetes pkg/serviceaccount/claims.go
    ``WarnOnlyBoundTokenExpirationSeconds = 60*60 + 7``, the value its service-account admission
    injects, which the API server extends to a year for a legacy client that never re-reads it."""
    spec = default_synth.one("raycluster")["spec"]
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == IDLE_TIMEOUT_SECONDS
    volumes = {v["name"]: v for v in spec["headGroupSpec"]["template"]["spec"]["volumes"]}
    assert volumes[API_TOKEN_VOLUME]["projected"] == API_TOKEN_PROJECTION
    (token,) = [s["serviceAccountToken"] for s in API_TOKEN_PROJECTION["sources"] if "serviceAccountToken" in s]
    assert token == {"expirationSeconds": 60 * 60 + 7, "path": "token"}
    (ca,) = [s["configMap"] for s in API_TOKEN_PROJECTION["sources"] if "configMap" in s]
    assert ca == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}


def test_the_local_jobs_cluster_is_the_gpu_jobs_cluster_with_a_cpu_shape(default_synth):
    """The same builder: the head as the smoke job's, the workers on the same nodes with the same
    identity, image, shared memory and environment, less what a CPU worker has no use for."""
    local = copy.deepcopy(default_synth.one("rayjob-local")["spec"]["rayClusterSpec"])
    smoke = copy.deepcopy(default_synth.one("rayjob-smoke")["spec"]["rayClusterSpec"])
    assert local["rayVersion"] == smoke["rayVersion"]
    heads = [spec["headGroupSpec"] for spec in (local, smoke)]
    assert [h["template"]["spec"].pop("serviceAccountName") for h in heads] == ["local", "smoke"]
    for head in heads:
        head["template"]["spec"].pop("terminationGracePeriodSeconds", None)
        head["template"]["metadata"] = {}
    assert heads[0] == heads[1]
    (cpu,), (gpu,) = local["workerGroupSpecs"], smoke["workerGroupSpecs"]
    cpu_pod, gpu_pod = cpu["template"]["spec"], gpu["template"]["spec"]
    for key in ("nodeSelector", "tolerations"):
        assert cpu_pod[key] == gpu_pod[key], key
    # each run's pods under a service account of its own, named after the run (its AWS grants)
    assert (cpu_pod["serviceAccountName"], gpu_pod["serviceAccountName"]) == ("local", "smoke")
    (cpu_c,), (gpu_c,) = cpu_pod["containers"], gpu_pod["containers"]
    for key in ("name", "image", "imagePullPolicy"):
        assert cpu_c[key] == gpu_c[key], key
    assert [m for m in cpu_c["volumeMounts"] if m["name"] == "dshm"] == [m for m in gpu_c["volumeMounts"] if m["name"] == "dshm"]
    (cpu_shm,), (gpu_shm,) = ([v["emptyDir"] for v in pod["volumes"] if v["name"] == "dshm"] for pod in (cpu_pod, gpu_pod))
    assert cpu_shm["medium"] == gpu_shm["medium"] == "Memory"
    assert cpu_shm["sizeLimit"] == cpu_c["resources"]["limits"]["memory"]  # sized to the pod, as the GPU one is
    assert gpu_shm["sizeLimit"] == gpu_c["resources"]["limits"]["memory"]
    gpu_env = {e["name"]: e for e in gpu_c["env"]}
    shared = [e for e in cpu_c["env"] if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
    assert shared and all(gpu_env.get(e["name"]) == e for e in shared)
