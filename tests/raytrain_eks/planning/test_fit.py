"""The scheduling-fit check on the synthesized CDK app and manifests of one spec: every pod
the project creates gets a node, and the old system node (m7i.xlarge, EKS's 20 GiB disk, a
3-CPU head, KubeRay's default submitter) is refused with the pod, group and resource named."""
from __future__ import annotations

import copy
import shutil
import warnings
from pathlib import Path

import pytest
import yaml

from fixture_paths import FIXTURE_JOBS
from raytrain_eks.planning.fit import NodeGroup, Pod, allocatable, place
from raytrain_eks.planning.fit_inputs import fit_cases, read_manifests

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def dist(default, tmp_path_factory) -> Path:
    from charts.main import synth

    out = tmp_path_factory.mktemp("fit-dist")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        synth(default.env, out, root=REPO, jobs=FIXTURE_JOBS)
    return out


def test_every_pod_gets_a_node_in_every_case(default, dist):
    cases = {c.case: c for c in fit_cases(default.env, default.json("cluster"), dist)}
    assert {"long-lived RayCluster", "RayJob smoke alone",
            "long-lived RayCluster + RayJob smoke"} <= set(cases)
    assert [line for c in cases.values() for line in c.pending] == []
    together = cases["long-lived RayCluster + RayJob smoke"]
    placed = {pod for node in together.nodes for pod in node.pods}
    assert {"raytrain-head", "smoke-head", "smoke-submitter", "smoke-gpu-worker-0", "smoke-gpu-worker-1",
            "kuberay-operator", "cluster-autoscaler", "coredns-0"} <= placed
    # GPU workers land on GPU nodes, heads and submitters on the system node
    by_pod = {pod: node.group.name for node in together.nodes for pod in node.pods}
    assert by_pod["smoke-gpu-worker-0"] == "gpu" and by_pod["smoke-submitter"] == "system"


def _old_system_node(default, dist: Path, tmp_path: Path) -> tuple[dict, Path]:
    """The template and manifests as they were: m7i.xlarge, no disk size, the head at 3 CPU /
    13 GiB, no Ray autoscaler, no submitterPodTemplate (KubeRay's default submitter)."""
    template = copy.deepcopy(default.json("cluster"))
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::EKS::Nodegroup" and resource["Properties"]["Labels"].get("raytrain.io/role") == "system":
            resource["Properties"]["InstanceTypes"] = ["m7i.xlarge"]
            del resource["Properties"]["LaunchTemplate"]  # then: no launch template, EKS's default disk
    old = tmp_path / "dist"
    shutil.copytree(dist, old)
    for path in old.glob("*.k8s.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            spec = doc["spec"]
            spec.pop("submitterPodTemplate", None)
            cluster = spec.get("rayClusterSpec") or (spec if doc["kind"] == "RayCluster" else None)
            if cluster:
                cluster.pop("enableInTreeAutoscaling", None)  # no autoscaler sidecar then
                head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]
                head["requests"] = head["limits"] = {"cpu": "3", "memory": "13Gi"}
        path.write_text(yaml.safe_dump_all(docs))
    return template, old


def test_the_old_system_node_is_refused_naming_the_submitter(default, dist, tmp_path):
    template, old = _old_system_node(default, dist, tmp_path)
    cases = {c.case: c for c in fit_cases(default.env, template, old)}
    smoke = cases["RayJob smoke alone"].pending
    # 20 GiB cannot hold the DLC image: the head and the submitter both stay Pending
    assert any(line.startswith("pod smoke-submitter stays Pending: node group system (1 x m7i.xlarge) "
                               "is short of disk") for line in smoke)
    # with the disk fixed, a 3-CPU head no longer fits beside Kueue's controller (500m)
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::EKS::Nodegroup" and "LaunchTemplate" not in resource["Properties"]:
            resource["Properties"]["DiskSize"] = 100
    cases = {c.case: c for c in fit_cases(default.env, template, old)}
    assert cases["RayJob smoke alone"].pending[0] == (
        "pod smoke-head stays Pending: node group system (1 x m7i.xlarge) is short of cpu: "
        "needs 3 CPU, a node has 2.87 CPU left; kueue-controller-manager holds 0.5 CPU of the node's 3.92 CPU "
        "allocatable")
    assert any(line.startswith("pod smoke-head stays Pending: node group system (1 x m7i.xlarge) is short of cpu")
               for line in cases["long-lived RayCluster + RayJob smoke"].pending)


def test_preflight_runs_the_fit_check_and_refuses_in_one_line(default, dist, tmp_path):
    from raytrain_eks.planning.preflight import render, run_preflight
    from training.config import load_job_config

    job = load_job_config(str(FIXTURE_JOBS / "smoke.toml"), ["parallel.num_workers=8", "parallel.workers_per_node=4"])
    plan = run_preflight(default.env, job, dist_dir=dist, cdk_out=default.outdir, installed_ray="2.58.0")
    [fit] = [c for c in plan.checks if c.name == "scheduling fit"]
    assert fit.ok and "every pod gets a node" in fit.message
    assert "smoke-submitter" in render(plan)
    template, old = _old_system_node(default, dist, tmp_path)
    cdk_out = tmp_path / "cdk.out"
    cdk_out.mkdir()
    import json
    (cdk_out / f"{default.env.cluster.name}-cluster.template.json").write_text(json.dumps(template))
    plan = run_preflight(default.env, job, dist_dir=old, cdk_out=cdk_out, installed_ray="2.58.0")
    assert plan.refusal and "stays Pending: node group system (1 x m7i.xlarge) is short of" in plan.refusal
    assert "\n" not in plan.refusal


def test_allocatable_follows_the_eks_al2023_formulas():
    small = allocatable("m7i.xlarge")
    assert small["cpu"] == pytest.approx(3.92)  # 4 - (60 + 10 + 2 x 5) millicores
    assert allocatable("m7i.2xlarge")["cpu"] == pytest.approx(7.91)
    # 16 GiB less 5% kernel, 255 + 11 x 58 MiB kube-reserved, 100 MiB eviction
    assert small["memory"] / 2 ** 20 == pytest.approx(16 * 1024 * 0.95 - 255 - 11 * 58 - 100)
    assert (small["pods"], "nvidia.com/gpu" in small) == (58, False)
    gpu = allocatable("p5.48xlarge")
    assert (gpu["nvidia.com/gpu"], gpu["vpc.amazonaws.com/efa"], gpu["pods"]) == (8, 32, 100)


def test_taints_selectors_and_limits_are_enforced():
    gpu = NodeGroup(name="gpu", instance_type="g6.12xlarge", nodes=1, labels={"role": "gpu"},
                    taints=(("nvidia.com/gpu", "true", "NoSchedule"),), image_disk_gib=3000)
    untolerated = Pod(name="p", requests={"cpu": 1.0})
    tolerated = Pod(name="w", requests={"nvidia.com/gpu": 4.0},
                    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},))
    result = place("t", [gpu], [untolerated, tolerated, tolerated])
    assert result.pending[0].startswith("pod w stays Pending: node group gpu (1 x g6.12xlarge) is short of nvidia.com/gpu")
    assert "taint nvidia.com/gpu=true:NoSchedule not tolerated" in result.pending[1]
    selected = Pod(name="s", node_selector={"role": "system"})
    assert "nodeSelector role=system" in place("t", [gpu], [selected]).pending[0]
    full = place("t", [gpu], [Pod(name=f"q{i}", tolerations=tolerated.tolerations) for i in range(235)])
    assert full.pending == ["pod q234 stays Pending: node group gpu (1 x g6.12xlarge) is short of pods: "
                            "needs 1 pods, a node has 0 pods left"]


def test_submitter_and_heads_are_explicit_in_every_rayjob(dist):
    _, jobs = read_manifests(dist)
    assert jobs
    for job in jobs:
        submitter = job["spec"]["submitterPodTemplate"]["spec"]
        assert submitter["nodeSelector"]["raytrain.io/role"] == "system"
        assert submitter["containers"][0]["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}


def test_an_existing_clusters_own_groups_are_placed_beside_the_new_ones(existing):
    # on cluster.existing the template holds only the new p5 group: the system group and the
    # L4 group the cluster already has come from the spec, so the Ray heads still have a node
    from raytrain_eks.planning.fit_inputs import existing_node_groups, node_groups

    groups = node_groups(existing.json("cluster")) + existing_node_groups(existing.env)
    assert sorted(g.name for g in groups) == ["gpu", "p5", "system"]
    [system] = [g for g in groups if g.name == "system"]
    assert system.labels["raytrain.io/role"] == "system" and system.taints == ()
    [l4] = [g for g in groups if g.name == "gpu"]
    assert l4.taints == (("nvidia.com/gpu", "true", "NoSchedule"),) and l4.nodes == 2
