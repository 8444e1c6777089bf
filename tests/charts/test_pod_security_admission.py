"""Pod Security admission (baseline and restricted, Kubernetes 1.36) over the pods KubeRay v1.7.0
really creates from the synthesized manifests: templates plus the autoscaler sidecar, the
``wait-gcs-ready`` init container (a copy of the Ray container's securityContext) and the
volumes it adds (charts_oracles/kuberay_pods.py, charts_oracles/pod_security.py).

The ``ray`` namespace enforces ``baseline`` (infra/constructs/pod_identity.py): a pod failing it
is never created. ``restricted`` is warned and audited; :data:`RESTRICTED_FAILURES` is every
check that still fails there, each with its reason.
"""
from __future__ import annotations

import pytest
from charts_oracles.kuberay_pods import AUTOSCALER_CONTAINER, INIT_CONTAINER, effective_pods, qos_class
from charts_oracles.pod_security import run_as_non_root, violations

VARIANTS = ["default_synth", "large_synth"]
RESTRICTED_FAILURES = {
    # The AWS Ray Train DLC (used unmodified) runs as root: runAsNonRoot=true would make the
    # kubelet refuse to start it ("image will run as root").
    "runAsNonRoot",
}


def all_pods(synth):
    return [p for chart, objs in synth.docs.items() for o in objs for p in effective_pods(chart, o)]


def test_the_effective_pods_include_what_kuberay_injects(default_synth):
    pods = {p.where: p.pod for p in all_pods(default_synth)}
    head = pods["raycluster: head"]["spec"]
    assert [c["name"] for c in head["containers"]] == ["ray-head", AUTOSCALER_CONTAINER]
    worker = pods["raycluster: worker gpu"]["spec"]
    [init] = worker["initContainers"]
    assert init["name"] == INIT_CONTAINER and init["securityContext"] == worker["containers"][0]["securityContext"]
    assert {p.where.split(": ")[1] for p in all_pods(default_synth)} == {"head", "worker gpu", "submitter"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_effective_pod_passes_baseline(variant, request):
    failures = {p.where: v for p in all_pods(request.getfixturevalue(variant)) if (v := violations(p.pod, "baseline"))}
    assert failures == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_restricted_fails_only_for_the_stated_reasons(variant, request):
    failures = {p.where: [v.split(":")[0] for v in violations(p.pod, "restricted")]
                for p in all_pods(request.getfixturevalue(variant))}
    assert {check for checks in failures.values() for check in checks} <= RESTRICTED_FAILURES, failures


def test_the_checks_see_a_root_image_and_an_injected_capability():
    # the oracle itself, on the upstream checks' own cases (policy/check_*_test.go)
    pod = {"metadata": {}, "spec": {"containers": [{"name": "a", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
                                    "volumes": [{"name": "h", "hostPath": {"path": "/x"}}]}}
    assert [v.split(":")[0] for v in violations(pod, "baseline")] == ["capabilities_baseline", "hostPathVolumes"]
    assert run_as_non_root(pod) == "runAsNonRoot: pod or containers ['a'] must set securityContext.runAsNonRoot=true"
    assert run_as_non_root({**pod, "spec": {**pod["spec"], "hostUsers": False}}) is None


def test_restricted_keeps_the_proc_mount_check_for_user_namespace_pods():
    # policy/check_procMount_restricted.go (1.35+): overrides the baseline check, without its
    # relaxation for hostUsers: false (check_procMount_baseline.go procMount1_35baseline)
    pod = {"metadata": {}, "spec": {"hostUsers": False,
                                    "containers": [{"name": "a", "securityContext": {"procMount": "Unmasked"}}]}}
    assert [v.split(":")[0] for v in violations(pod, "baseline")] == []
    assert "procMount_restricted" in [v.split(":")[0] for v in violations(pod, "restricted")]


def test_an_empty_apparmor_annotation_is_allowed():
    # policy/check_appArmorProfile.go allowedAnnotationValue: empty, runtime/default, localhost/*
    key = "container.apparmor.security.beta.kubernetes.io/a"
    pod = {"metadata": {"annotations": {key: ""}}, "spec": {"containers": [{"name": "a"}]}}
    assert violations(pod, "baseline") == []
    assert violations({**pod, "metadata": {"annotations": {key: "unconfined"}}}, "baseline") == [
        f"appArmorProfile: ['{key}'] set a forbidden AppArmor profile"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_ray_pod_is_guaranteed(variant, request):
    # Head and workers are never the first to be evicted under node memory pressure.
    qos = {p.where: qos_class(p.pod) for p in all_pods(request.getfixturevalue(variant)) if "submitter" not in p.where}
    assert set(qos.values()) == {"Guaranteed"}, qos


def test_autoscaled_pods_never_restart_in_place(default_synth):
    """Ray 2.58's ``ray start --head`` runs autoscaler v2; Ray's KubeRay autoscaling guide says
    neither autoscaler version may have its worker pods restarted in place (an idle worker is
    reclaimed by deleting its pod). KubeRay v1.7.0 sets ``restartPolicy: Never`` only for an
    explicit ``autoscalerOptions.version: v2`` (charts_oracles/kuberay_pods.py)."""
    from charts_oracles.kuberay_pods import AUTOSCALER_V2_ENV, restart_policy

    pods = {p.where: p.pod for p in all_pods(default_synth)}
    autoscaled = {where: restart_policy(pod) for where, pod in pods.items() if where.startswith("raycluster: ")}
    assert autoscaled == {"raycluster: head": "Never", "raycluster: worker gpu": "Never"}
    head_env = {e["name"]: e.get("value") for e in pods["raycluster: head"]["spec"]["containers"][0]["env"]}
    assert head_env[AUTOSCALER_V2_ENV] == "true"


def test_the_restart_rule_needs_an_explicit_v2(default_synth):
    # the oracle itself: no version (Ray's default is v2 all the same) leaves the template's policy
    from charts_oracles.kuberay_pods import effective_pods, restart_policy

    [cluster] = default_synth.docs["raycluster"]
    options = {k: v for k, v in cluster["spec"]["autoscalerOptions"].items() if k != "version"}
    implicit = {**cluster, "spec": {**cluster["spec"], "autoscalerOptions": options}}
    assert {restart_policy(p.pod) for p in effective_pods("raycluster", implicit)} == {"Always"}
    explicit_v1 = {**implicit, "spec": {**implicit["spec"], "autoscalerOptions": {**options, "version": "v1"}}}
    assert {restart_policy(p.pod) for p in effective_pods("raycluster", explicit_v1)} == {"Always"}


def test_only_the_autoscaler_container_holds_a_kubernetes_api_token(default_synth):
    """KubeRay v1.7.0 binds the autoscaler's Role (pods get/list/watch/patch, rayclusters
    get/patch; common/rbac.go ``BuildRole``) to the head pod's service account
    (``GetHeadGroupServiceAccountName``), and a pod has one service account; every -on-cluster
    driver runs in the head's Ray container. So the head mounts no token of its own, and the
    token (Kubernetes' own kube-api-access projection) is mounted only into the autoscaler, at
    the path Ray's KubeRay node provider reads (ray 2.58 autoscaler/_private/kuberay/node_provider.py
    ``load_k8s_secrets``)."""
    from charts_oracles.kuberay_pods import AUTOSCALER_CONTAINER

    head = {p.where: p.pod for p in all_pods(default_synth)}["raycluster: head"]["spec"]
    assert head["automountServiceAccountToken"] is False
    token_volumes = {v["name"] for v in head["volumes"]
                     if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))}
    mounts = {c["name"]: [m for m in c.get("volumeMounts") or [] if m["name"] in token_volumes] for c in head["containers"]}
    assert mounts == {"ray-head": [], AUTOSCALER_CONTAINER: [
        {"name": next(iter(token_volumes)), "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]}
