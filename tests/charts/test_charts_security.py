"""Least privilege inside the cluster, over every synthesized manifest: the security settings of
every pod template, Ray's token auth, and the network policies (schema-valid, and selecting the
pods as KubeRay v1.7.0 labels them)."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from charts_testspec import make_env, spec_raw

from charts import ChartError
from charts.validate import pod_templates
from environment.addons import ADDONS_BY_KEY
from environment.contract import RAY_DASHBOARD_PORT, RAY_METRICS_PORT, RAY_PEER_LABEL
from environment.observability import MONITORING_NAMESPACE
from environment.network_policy import NAMESPACE_NAME_LABEL, namespace_policies

VARIANTS = ["default_synth", "large_synth"]


def ray_objects(synth):
    return [(chart, o) for chart, objs in synth.docs.items() for o in objs if o["apiVersion"].startswith("ray.io/")]


def every_template(synth):
    for chart, obj in ray_objects(synth):
        for where, template in pod_templates(obj):
            yield f"{chart}: {where}", template


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_template_is_hardened(variant, request):
    synth = request.getfixturevalue(variant)
    efa = synth.env.primary_gpu_group.efa_per_node > 0
    seen = set()
    for where, template in every_template(synth):
        spec = template["spec"]
        # no pod mounts the token in every container (the autoscaler sidecar alone gets it:
        # test_pod_security_admission.py::test_only_the_autoscaler_container_holds_a_kubernetes_api_token)
        assert spec["automountServiceAccountToken"] is False, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec, where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            # nothing added back anywhere: EFA's memlock limit comes from the node (Pod Security
            # baseline forbids IPC_LOCK, also on the init container KubeRay copies it to)
            assert "add" not in sc["capabilities"], where
        seen |= {kind for kind in ("headGroupSpec", "workerGroupSpecs", "submitterPodTemplate") if kind in where}
    assert seen == {"headGroupSpec", "workerGroupSpecs", "submitterPodTemplate"}
    # the autoscaler sidecar KubeRay adds to the long-lived head is hardened the same way
    rc = synth.one("raycluster")["spec"]
    assert rc["enableInTreeAutoscaling"] is True
    assert rc["autoscalerOptions"]["securityContext"] == {
        "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}


def test_every_ray_cluster_runs_with_token_auth(default_synth):
    clusters = 0
    for chart, obj in ray_objects(default_synth):
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"].get("rayClusterSpec")
        if spec is None:  # an -on-cluster job: the long-lived cluster it targets has token auth
            assert obj["spec"]["clusterSelector"]["ray.io/cluster"] == default_synth.one("raycluster")["metadata"]["name"]
            continue
        clusters += 1
        assert spec["authOptions"] == {"mode": "token"}, chart
        # no manifest carries a token or overrides what KubeRay injects
        for _, template in pod_templates(obj):
            names = {e["name"] for c in template["spec"]["containers"] for e in c.get("env", [])}
            assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, chart
    assert clusters == 4


def test_token_auth_refuses_a_ray_older_than_kuberay_supports(tmp_path):
    from charts.cluster_spec import ClusterShape, ray_cluster_spec

    raw = spec_raw()
    raw["image"]["ray_version"] = "2.51.1"
    with pytest.raises(ChartError, match=r"image.ray_version: '2.51.1' is too old .* 2.52.0"):
        ray_cluster_spec(ClusterShape(env=make_env(raw), worker_replicas=1, checkpoint_grace_seconds=60,
                                      cluster_label="c"))


# --- network policies -----------------------------------------------------------------------

def kuberay_pod_labels(template: dict, cluster: str, node_type: str, group: str) -> dict:
    """The labels KubeRay v1.7.0 gives a Ray pod (common/pod.go labelPod): its own, then the
    template's, which may not override ray.io/node-type, ray.io/group or ray.io/cluster."""
    labels = {"ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": node_type,
              "ray.io/group": group, "ray.io/identifier": f"{cluster}-{node_type}",
              "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}
    for key, value in template["metadata"].get("labels", {}).items():
        if key not in ("ray.io/node-type", "ray.io/group", "ray.io/cluster"):
            labels[key] = value
    return labels


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels + Exists/In expressions) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        ok = {"Exists": lambda e: e["key"] in labels,
              "In": lambda e: labels.get(e["key"]) in e["values"]}[expr["operator"]](expr)
        if not ok:
            return False
    return True


def pods_of(synth) -> list[tuple[str, dict]]:
    """(chart, labels) of every pod the manifests make KubeRay create: the head and workers of
    every cluster (a RayJob's cluster gets a random suffix) and every submitter Job pod."""
    pods = []
    for chart, obj in ray_objects(synth):
        spec = obj["spec"]
        cluster = spec if obj["kind"] == "RayCluster" else spec.get("rayClusterSpec")
        name = obj["metadata"]["name"] + ("" if obj["kind"] == "RayCluster" else "-x7k2p")
        if cluster:
            pods.append((chart, kuberay_pod_labels(cluster["headGroupSpec"]["template"], name, "head", "headgroup")))
            for group in cluster["workerGroupSpecs"]:
                pods.append((chart, kuberay_pod_labels(group["template"], name, "worker", group["groupName"])))
        if "submitterPodTemplate" in spec:  # the Job controller adds only job-name labels
            pods.append((chart + " submitter", dict(spec["submitterPodTemplate"]["metadata"]["labels"])))
    return pods


def cluster_policies(synth) -> list[dict]:
    return synth.docs["network-policy"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_network_policies_validate_against_the_kubernetes_schema(variant, request):
    synth = request.getfixturevalue(variant)
    version = f"{synth.env.cluster.kubernetes_version}.0"
    policies = cluster_policies(synth) + namespace_policies(synth.env.ray.namespace, "kuberay-system")
    for policy in policies:
        kubernetes_validate.validate(policy, version, strict=True)
    broken = copy.deepcopy(policies[0])
    broken["spec"]["ingres"] = broken["spec"].pop("ingress")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_each_ray_cluster_admits_its_own_pods_and_submitters_only(default_synth):
    pods = pods_of(default_synth)
    policies = cluster_policies(default_synth)
    # every pod is selected by exactly one cluster policy: the one of its own cluster
    clusters: dict[str, list[str]] = {}
    for where, labels in pods:
        selecting = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        assert len(selecting) == 1, where
        clusters.setdefault(selecting[0]["metadata"]["name"], []).append(where)
    assert len(clusters) == len(policies) == 4  # the RayCluster + 3 own-cluster RayJobs
    # the long-lived cluster's policy covers its head, worker and both on-cluster submitters
    shared = clusters["ray-raycluster-raytrain"]
    assert sorted(shared) == sorted(["raycluster", "raycluster", "rayjob-finetune-qwen-on-cluster submitter",
                                     "rayjob-smoke-on-cluster submitter"])
    for policy in policies:
        members = [labels for _, labels in pods if selects(policy["spec"]["podSelector"], labels)]
        outsiders = [labels for _, labels in pods if not selects(policy["spec"]["podSelector"], labels)]
        (rule,) = policy["spec"]["ingress"]
        (peer,) = rule["from"]
        assert set(peer) == {"podSelector"}  # this namespace only
        assert all(selects(peer["podSelector"], m) for m in members)
        assert not any(selects(peer["podSelector"], o) for o in outsiders)
        assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_namespace_policies_deny_by_default_and_admit_two_callers(default_synth):
    ns = default_synth.env.ray.namespace
    operator_ns = ADDONS_BY_KEY["kuberay_operator"].namespace
    deny, dashboard, metrics = namespace_policies(ns, operator_ns)
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}
    pods = pods_of(default_synth)
    heads = [labels for _, labels in pods if labels.get("ray.io/node-type") == "head"]
    others = [labels for _, labels in pods if labels.get("ray.io/node-type") != "head"]
    # the job API (dashboard) from the operator's namespace, on heads only, on its port only
    assert heads and all(selects(dashboard["spec"]["podSelector"], h) for h in heads)
    assert not any(selects(dashboard["spec"]["podSelector"], o) for o in others)
    (rule,) = dashboard["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_ns}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}]
    # Prometheus in the monitoring namespace scrapes the metrics port of every Ray pod
    assert all(selects(metrics["spec"]["podSelector"], labels) for _, labels in pods)
    (rule,) = metrics["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": RAY_METRICS_PORT}]
    assert all(RAY_PEER_LABEL in labels for _, labels in pods)
