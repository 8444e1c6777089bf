"""`raytrain-eks verify` on ``cluster.existing``, as a user runs it: the CLI with AWS answered by
moto and the modelled EKS/EC2 tables (existing_cluster_doubles.py), and kubectl by a double
reading a cluster's lists (kubectl_cluster_double.py). A right spec passes and names what a
deploy would install, one line each; each way the spec and the cluster disagree is one FAIL
line with its fix."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from environment import environment_from_dict
from environment.addons import installed_addons
from environment.contract import PART_OF
from environment.queueing import KUEUE_RESOURCES
from existing_cluster_doubles import EC2_KEYS, EKS_KEYS, ModelledApi, helm_release_secret, team_cluster
from infra_variants import EXISTING_CLUSTER, EXISTING_GPU_GROUP, existing_raw
from raytrain_eks.verify.cluster_inventory import decode_release
import raytrain_eks.verify as verify_command
from test_verify_command import charts, failures, moto, registry, run_verify, write_spec  # noqa: F401
from verify_doubles import MOTO_ACCOUNT, stub_quotas

REGION = "us-east-1"
P_QUOTA = "L-417A185B"
KUBECTL = Path(__file__).parents[1] / "kubectl_cluster_double.py"


class Ec2:
    """Offerings and reservations from moto; the existing VPC's subnets, route tables and endpoints
    from the modelled table."""

    def __init__(self, moto_ec2, subnets: ModelledApi):
        for name in ("describe_instance_type_offerings", "describe_availability_zones", "get_paginator",
                     "describe_capacity_reservations"):
            setattr(self, name, getattr(moto_ec2, name))
        self.describe_subnets = subnets.describe_subnets
        self.describe_route_tables = subnets.describe_route_tables
        self.describe_vpc_endpoints = subnets.describe_vpc_endpoints


def spec(registry) -> dict:  # noqa: F811
    raw = existing_raw()
    raw["cluster"]["account"] = MOTO_ACCOUNT
    raw["image"].update(repository=f"{registry.host}/deep-learning-containers/ray", digest=registry.digests["v1"])
    return raw


@pytest.fixture
def world(tmp_path, monkeypatch, moto, registry):  # noqa: F811
    """The existing cluster, right in every field; tests edit ``world.tables`` before verify runs."""
    raw = spec(registry)
    env = environment_from_dict(raw, "existing.toml")
    tables = team_cluster(env)
    state = tmp_path / "kubectl.json"

    def make(service: str, region: str):
        if service == "eks":
            return ModelledApi("eks", region, tables["eks"], EKS_KEYS)
        if service == "ec2":
            return Ec2(moto.client("ec2", region), ModelledApi("ec2", region, tables["ec2"], EC2_KEYS))
        if service == "service-quotas":
            return stub_quotas(region, {P_QUOTA: 384.0})  # only the new p5 group needs room
        return moto.client(service, region)

    monkeypatch.setattr(verify_command, "make_client", make)
    monkeypatch.setattr(verify_command, "ROOT", tmp_path / "root")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\nexec {sys.executable} {KUBECTL} "$@"\n')
    (bin_dir / "kubectl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_STATE", str(state))

    class World:
        pass

    w = World()
    w.raw, w.env, w.tables, w.tmp = raw, env, tables, tmp_path

    def run(capsys, chart_url: str):
        state.write_text(json.dumps({"context_cluster": tables["context_cluster"], "lists": tables["lists"],
                                     "forbidden": tables.get("forbidden", False)}))
        return run_verify(capsys, write_spec(tmp_path, w.raw), chart_url)

    w.run = run
    return w


def test_a_right_spec_passes_and_names_what_a_deploy_installs(world, charts, capsys):  # noqa: F811
    rc, lines, err = world.run(capsys, charts[1])
    assert failures(lines) == [] and rc == 0, lines
    installs = [line.removeprefix("ok    install: ") for line in lines if line.startswith("ok    install: ")]
    # one line each: the handler's access, the namespace, the pod role, the new p5 group, and
    # exactly the add-ons the cluster lacks
    assert installs[:3] == [
        f"access entry for the kubectl handler's role (AmazonEKSClusterAdminPolicy) on {EXISTING_CLUSTER}",
        "namespace ray with its NetworkPolicies and service account ray-train",
        f"pod role + Pod Identity association ray/ray-train (bucket {world.env.bucket_name})"]
    assert installs[3] == "GPU node group p5: 0-2 x p5.48xlarge in us-east-1a"
    assert [i.rsplit("(", 1)[1].rstrip(")") for i in installs[4:]] == [a.key for a in installed_addons(world.env)]
    assert "kuberay_operator" not in " ".join(installs)
    checked = {line.split()[1].rstrip(":") for line in lines if line.startswith("ok")}
    assert {"cluster", "cluster-addons", "existing-groups", "addons", "namespace", "kubernetes"} <= checked
    assert "eks-addon" not in checked and "admins" not in checked  # the owner's, not checked here
    assert any("kuberay_operator: KubeRay 1.7.0 present (helm release kuberay-operator in kuberay-system" in line
               for line in lines)
    assert any("cluster_autoscaler: present (helm release autoscaler in kube-system, chart 9.59.0)" in line for line in lines)


def _one_failure(world, capsys, charts, *expected: str) -> str:  # noqa: F811
    rc, lines, err = world.run(capsys, charts[1])
    [line] = failures(lines)
    assert rc == 2 and " -- fix: " in line
    for text in expected:
        assert text in line, line
    return line


def test_a_cluster_on_another_kubernetes_version(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("describe_cluster", EXISTING_CLUSTER)]["cluster"]["version"] = "1.35"
    _one_failure(world, capsys, charts, "runs Kubernetes 1.35, the spec says 1.36", 'set cluster.kubernetes_version = "1.35"')


def test_a_cluster_that_takes_no_access_entries(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("describe_cluster", EXISTING_CLUSTER)]["cluster"]["accessConfig"] = {"authenticationMode": "CONFIG_MAP"}
    _one_failure(world, capsys, charts, "authentication mode is CONFIG_MAP",
                 "authenticationMode=API_AND_CONFIG_MAP")


def test_no_pod_identity_agent(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("list_addons", EXISTING_CLUSTER)]["addons"].remove("eks-pod-identity-agent")
    _one_failure(world, capsys, charts, "has no eks-pod-identity-agent add-on",
                 f"aws eks create-addon --cluster-name {EXISTING_CLUSTER} --addon-name eks-pod-identity-agent")


def test_no_node_monitoring_agent(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("list_addons", EXISTING_CLUSTER)]["addons"].remove("eks-node-monitoring-agent")
    _one_failure(world, capsys, charts, "has no eks-node-monitoring-agent add-on",
                 f"aws eks create-addon --cluster-name {EXISTING_CLUSTER} --addon-name eks-node-monitoring-agent "
                 "--configuration-values")


def test_a_node_monitoring_agent_that_does_not_tolerate_the_gpu_taint(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("describe_addon", "eks-node-monitoring-agent")]["addon"]["configurationValues"] = ""
    _one_failure(world, capsys, charts, "nodeAgent and dcgmAgent do not tolerate the GPU taint nvidia.com/gpu",
                 "aws eks update-addon")


def test_a_gpu_group_without_node_auto_repair(world, charts, capsys):  # noqa: F811
    del world.tables["eks"][("describe_nodegroup", EXISTING_GPU_GROUP)]["nodegroup"]["nodeRepairConfig"]
    _one_failure(world, capsys, charts, "node auto repair is off", "--node-repair-config enabled=true")


def test_network_policies_not_enforced(world, charts, capsys):  # noqa: F811
    world.tables["eks"][("describe_addon", "vpc-cni")]["addon"]["configurationValues"] = ""
    _one_failure(world, capsys, charts, "vpc-cni v1.20.1-eksbuild.3 does not enforce NetworkPolicies", "enableNetworkPolicy")


def test_an_addon_the_spec_would_install_is_already_there(world, charts, capsys):  # noqa: F811
    # the EFA plugin runs under another release name: a deploy would collide with it
    world.tables["lists"]["secrets"].append(
        helm_release_secret("efa", "kube-system", "aws-efa-k8s-device-plugin", "v0.5.30"))
    _one_failure(world, capsys, charts, "efa_device_plugin: the cluster runs it (helm release efa in kube-system, chart v0.5.30)",
                 "add 'efa_device_plugin' to cluster.present_addons")


def test_an_addon_the_spec_says_present_is_missing(world, charts, capsys):  # noqa: F811
    world.tables["lists"]["secrets"] = [s for s in world.tables["lists"]["secrets"]
                                        if s["metadata"]["labels"]["name"] != "nvidia-device-plugin"]
    _one_failure(world, capsys, charts, "nvidia_device_plugin: cluster.present_addons names it, the cluster does not run",
                 "remove 'nvidia_device_plugin' from cluster.present_addons")


def test_kuberay_at_another_version_or_installed_without_helm(world, charts, capsys):  # noqa: F811
    secrets = world.tables["lists"]["secrets"]
    secrets[0] = helm_release_secret("kuberay-operator", "kuberay-system", "kuberay-operator", "1.4.0", revision=3)
    _one_failure(world, capsys, charts, "the cluster runs KubeRay 1.4.0", "written for 1.7.0")
    # only its CRDs: found (a CRD chart of ours would collide), version unknown
    del secrets[0]
    _one_failure(world, capsys, charts, "its CRDs rayclusters.ray.io, rayjobs.ray.io", "cannot be read")


def test_a_superseded_release_revision_is_not_the_running_one(world, charts, capsys):  # noqa: F811
    # Helm keeps old revisions with status "superseded": only the deployed one counts
    world.tables["lists"]["secrets"].insert(0, helm_release_secret(
        "kuberay-operator", "kuberay-system", "kuberay-operator", "1.4.0", revision=1, status="superseded"))
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == []


def test_nodes_without_the_spec_labels_or_gpus(world, charts, capsys):  # noqa: F811
    [_, gpu] = world.tables["lists"]["nodes"]
    gpu["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    _one_failure(world, capsys, charts, "gpu (team-l4): node ip-10-0-1-2 offers nvidia.com/gpu=0, the spec counts 4")


def test_the_ray_namespace_already_exists(world, charts, capsys):  # noqa: F811
    world.tables["lists"]["namespaces"].append({"metadata": {"name": "ray"}})
    _one_failure(world, capsys, charts, "namespace ray already exists and is not this app's", "set ray.namespace")


def test_kubectl_pointed_at_another_cluster_reads_nothing(world, charts, capsys):  # noqa: F811
    world.tables["context_cluster"] = f"arn:aws:eks:{REGION}:{MOTO_ACCOUNT}:cluster/someone-else"
    line = _one_failure(world, capsys, charts, "kubernetes: cannot read cluster team-gpu",
                        f"aws eks update-kubeconfig --name {EXISTING_CLUSTER}")
    assert "someone-else" in line


def test_decode_release_is_helms_decode_release():
    """helm/helm v3 pkg/storage/driver/util.go: ``decodeRelease`` base64-decodes, then gunzips
    only when the gzip magic header is there (releases stored before compression are plain)."""
    import base64

    secret = helm_release_secret("r", "ns", "chart", "1.2.3")
    assert decode_release(secret["data"]["release"])["chart"]["metadata"]["version"] == "1.2.3"
    plain = base64.b64encode(base64.b64encode(b'{"name": "old"}')).decode()
    assert decode_release(plain) == {"name": "old"}


RAY_FRAMEWORKS = ["ray.io/rayjob", "ray.io/raycluster"]
"""What a team's Kueue must manage: the kueue chart v0.19.2's default list has both (values.yaml:166-178)."""


def _kueue_present(world, frameworks, served=("v1beta1", "v1beta2"), image_tag="v0.19.2", feature_gates="",
                   **config_extra):
    """The team runs Kueue v0.19.2 by Helm in kueue-system (the spec says present), with its
    manager ConfigMap (kueue chart templates/manager/manager-config.yaml), its manager Deployment
    (templates/manager/manager.yaml: container ``manager``, image ``registry.k8s.io/kueue/kueue:<tag>``,
    args ``--config``, ``--zap-log-level`` and, with controllerManager.featureGates set,
    ``--feature-gates=Name=bool,...``: templates/_helpers.tpl ``kueue.featureGates``) and CRDs."""
    world.raw.setdefault("queueing", {})["enabled"] = True
    world.raw["cluster"]["present_addons"] = [*world.raw["cluster"]["present_addons"], "kueue"]
    lists = world.tables["lists"]
    lists["secrets"].append(helm_release_secret("kueue", "kueue-system", "kueue", "0.19.2"))
    lists["customresourcedefinitions"] += [
        {"metadata": {"name": f"{plural}.kueue.x-k8s.io"},
         "spec": {"versions": [{"name": v, "served": True} for v in served]}}
        for plural in ("clusterqueues", "localqueues", "resourceflavors", "workloadpriorityclasses", "workloads")]
    config = {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "integrations": {"frameworks": frameworks}, **config_extra}
    args = ["--config=/controller_manager_config.yaml", "--zap-log-level=2",
            *([f"--feature-gates={feature_gates}"] if feature_gates else [])]
    lists["deployments"] = [*lists.get("deployments", []), {
        "kind": "Deployment", "metadata": {"name": "kueue-controller-manager", "namespace": "kueue-system",
                                           "labels": {"app.kubernetes.io/name": "kueue"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "manager", "image": f"registry.k8s.io/kueue/kueue:{image_tag}", "command": ["/manager"],
             "args": args}]}}}}]
    lists["configmaps"] = [{"metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
                            "data": {"controller_manager_config.yaml": json.dumps(config)}}]
    for plural in KUEUE_RESOURCES.values():  # the team's own queue objects: none yet
        lists[f"{plural}.kueue.x-k8s.io"] = []


def _team_object(world, kind: str, name: str, namespace: str = "", labels: dict | None = None) -> None:
    """One Kueue object of the team's, as kubectl lists it (``kind`` set on every item)."""
    meta = {"name": name, **({"namespace": namespace} if namespace else {}), **({"labels": labels} if labels else {})}
    world.tables["lists"][f"{KUEUE_RESOURCES[kind]}.kueue.x-k8s.io"].append(
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta})


def test_a_teams_kueue_that_manages_rayjobs_is_used_as_it_is(world, charts, capsys):  # noqa: F811
    _kueue_present(world, ["batch/job", *RAY_FRAMEWORKS])
    rc, lines, err = world.run(capsys, charts[1])
    assert failures(lines) == [] and rc == 0, lines
    assert any("kueue: present (helm release kueue in kueue-system, chart 0.19.2), manages ray.io/rayjob, "
               "ray.io/raycluster" in line
               for line in lines)


def test_a_teams_kueue_that_does_not_manage_rayjobs_fails(world, charts, capsys):  # noqa: F811
    _kueue_present(world, ["batch/job", "ray.io/raycluster"])
    _one_failure(world, capsys, charts, "does not manage ray.io/rayjob (", "queued RayJobs would never be admitted",
                 "add ray.io/rayjob to integrations.frameworks")


def test_a_teams_kueue_that_does_not_manage_rayclusters_fails(world, charts, capsys):  # noqa: F811
    # the long-lived RayCluster carries Kueue's elastic-job scheduling gate: nothing would lift it
    _kueue_present(world, ["ray.io/rayjob"])
    _one_failure(world, capsys, charts, "does not manage ray.io/raycluster",
                 "the long-lived RayCluster's pods would stay gated, never scheduled",
                 "add ray.io/raycluster to integrations.frameworks")


def test_a_teams_kueue_that_serves_an_older_api_fails(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS, served=("v1beta1",))
    rc, lines, err = world.run(capsys, charts[1])
    assert rc == 2 and all("the queue objects are kueue.x-k8s.io/v1beta2" in line for line in failures(lines)), lines
    assert {line.split(" serves ")[1].split(" at ")[0] for line in failures(lines)} == {
        "ClusterQueue", "LocalQueue", "ResourceFlavor", "WorkloadPriorityClass"}


@pytest.mark.parametrize("kind, name, namespace, fix", [
    ("ClusterQueue", "raytrain", "", 'set queueing.name_prefix (e.g. "raytrain-")'),
    ("ResourceFlavor", "gpu-gpu", "", "named <prefix>gpu-gpu"),
    ("WorkloadPriorityClass", "short", "", "rename short in queueing.priorities"),
])
def test_a_teams_kueue_object_with_the_name_of_one_of_ours_fails(world, charts, capsys, kind, name, namespace, fix):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS)
    _team_object(world, kind, name, namespace)
    _one_failure(world, capsys, charts, f"queue-objects: {kind} {name} already exists on {EXISTING_CLUSTER} and is not "
                 "this app's (no label app.kubernetes.io/part-of=raytrain-eks): the deploy would fail creating it", fix)


def test_a_teams_local_queue_of_the_same_name_clashes_only_in_the_ray_namespace(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS)
    _team_object(world, "LocalQueue", "ray-jobs", "team-a")  # another namespace: no clash
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == [], lines
    _team_object(world, "LocalQueue", "ray-jobs", "ray")
    world.tables["lists"]["namespaces"].append({"metadata": {"name": "ray"}})
    rc, lines, _ = world.run(capsys, charts[1])
    [queue] = [line for line in failures(lines) if "queue-objects:" in line]
    assert "LocalQueue ray/ray-jobs already exists" in queue and "set queueing.local_queue" in queue, queue


def test_our_own_queue_objects_from_an_earlier_deploy_pass(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS)
    _team_object(world, "ClusterQueue", "raytrain", labels=dict(PART_OF))
    _team_object(world, "WorkloadPriorityClass", "short", labels=dict(PART_OF))
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == [], lines
    assert any(line.startswith("ok    queue-objects: no Kueue object of") for line in lines), lines


def test_a_prefix_moves_our_cluster_wide_names_off_the_teams(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS)
    _team_object(world, "ClusterQueue", "raytrain")
    _team_object(world, "ResourceFlavor", "system")
    world.raw["queueing"]["name_prefix"] = "ml-"
    rc, lines, _ = world.run(capsys, charts[1])
    assert rc == 0 and failures(lines) == [], lines


@pytest.mark.parametrize("tag", ["v0.17.0", "v0.18.3", "v0.19.0"])
def test_a_teams_kueue_older_than_the_ungater_fixes_fails_naming_the_minimum(world, charts, capsys, tag):  # noqa: F811
    """Kueue's own rules at the versions a team may run (pkg/features/kube_features.go: the elastic
    gate is off before v0.18; the ungater's fixes arrive in v0.19.1). Before the fix verify passed
    these: it looked only at the served API versions."""
    _kueue_present(world, RAY_FRAMEWORKS, image_tag=tag)
    _one_failure(world, capsys, charts, f"the cluster runs Kueue {tag}", "needs v0.19.1 or later", "upgrade Kueue to")


def test_a_teams_kueue_with_the_elastic_gate_turned_off_fails(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS, feature_gates="TopologyAwareScheduling=true,ElasticJobsViaWorkloadSlices=false")
    _one_failure(world, capsys, charts, "--feature-gates ElasticJobsViaWorkloadSlices=false",
                 "scale-up pods would stay gated", "remove ElasticJobsViaWorkloadSlices=false")


def test_a_teams_kueue_managing_unlabelled_jobs_in_the_ray_namespace_fails(world, charts, capsys):  # noqa: F811
    """Kueue v0.19.2 jobframework/utils.go WorkloadShouldBeSuspended :147-156: an unlabelled
    RayJob is suspended where manageJobsWithoutQueueName is true and the namespace selector
    matches; KubeRay refuses a suspended clusterSelector RayJob (ValidationFailed for ever)."""
    _kueue_present(world, RAY_FRAMEWORKS, manageJobsWithoutQueueName=True)
    _one_failure(world, capsys, charts, "sets manageJobsWithoutQueueName: true", "ValidationFailed",
                 "give managedJobsNamespaceSelector a selector that leaves out namespace")


def test_a_teams_kueue_managing_unlabelled_jobs_elsewhere_only_passes(world, charts, capsys):  # noqa: F811
    _kueue_present(world, RAY_FRAMEWORKS, manageJobsWithoutQueueName=True, managedJobsNamespaceSelector={
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-batch"]}]})
    rc, lines, err = world.run(capsys, charts[1])
    assert failures(lines) == [] and rc == 0, lines


def test_a_teams_kueue_with_the_elastic_gate_turned_off_in_its_config_fails(world, charts, capsys):  # noqa: F811
    """Kueue v0.19.2 apis/config/v1beta2/configuration_types.go:101-105: the manager config's
    ``featureGates`` map overrides a gate's default as ``--feature-gates`` does (cmd/kueue/main.go:161,
    pkg/config/validation.go:641-650 ``LoadAndValidateFeatureGates``: the map is used when the flag
    is empty). Before the fix verify read only the flag and passed this."""
    _kueue_present(world, RAY_FRAMEWORKS, featureGates={"ElasticJobsViaWorkloadSlices": False})
    _one_failure(world, capsys, charts, "featureGates ElasticJobsViaWorkloadSlices=false",
                 "scale-up pods would stay gated", "remove ElasticJobsViaWorkloadSlices")


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE"])
def test_a_teams_kueue_gate_turned_off_by_any_spelling_of_false_fails(world, charts, capsys, value):  # noqa: F811
    """k8s.io/component-base featuregate ``Set`` parses each value with Go's strconv.ParseBool,
    which takes 0, f, F, false, FALSE and False for false. Before the fix only "false" (any case) counted."""
    _kueue_present(world, RAY_FRAMEWORKS, feature_gates=f"ElasticJobsViaWorkloadSlices={value}")
    _one_failure(world, capsys, charts, "ElasticJobsViaWorkloadSlices=false",
                 "scale-up pods would stay gated", "remove ElasticJobsViaWorkloadSlices")


@pytest.mark.parametrize("tag, ok", [("v0.19.2@sha256:" + "a" * 64, True), ("v0.18.3@sha256:" + "b" * 64, False)])
def test_a_teams_kueue_pinned_by_tag_and_digest_is_read_by_its_tag(world, charts, capsys, tag, ok):  # noqa: F811
    """An image reference ``repo:tag@sha256:...`` (the kueue chart v0.19.2 manager.yaml:60 writes
    ``<repository>:<tag>``; a team that pins the digest sets tag ``v0.19.2@sha256:...``). Before the
    fix the digest's hex was taken for the tag: 'its version cannot be read' for either."""
    _kueue_present(world, RAY_FRAMEWORKS, image_tag=tag)
    if ok:
        rc, lines, _ = world.run(capsys, charts[1])
        assert rc == 0 and failures(lines) == [], lines
    else:
        _one_failure(world, capsys, charts, "the cluster runs Kueue v0.18.3", "needs v0.19.1 or later", "upgrade Kueue to")
