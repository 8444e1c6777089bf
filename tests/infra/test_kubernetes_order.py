"""Order and time limits of every Kubernetes object the cluster stack installs, read from the
synthesized template, judged by what the real deploy does with them.

Oracle 1 (order): CloudFormation creates a resource only after everything it names in
``DependsOn``, ``Ref`` or ``Fn::GetAtt`` (AWS CloudFormation User Guide, "DependsOn attribute"
and "Ref"); aws-cdk-lib 2.275's aws_eks_v2 makes each Kubernetes custom resource depend only on
the kubectl barrier (aws-eks-v2/lib/cluster.js ``_dependOnKubectlBarrier``), which holds no node.

Oracle 2 (time): aws-cdk-lib 2.275 aws-eks-v2/lib/helm-chart.js sends ``Timeout`` only when
``timeout`` is set (and ``Wait`` false by default); its handler
(custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/helm/__init__.py ``helm()``) appends
``--timeout`` only for a set Timeout, and Helm then waits its own default, 300 s
(helm/helm v3 cmd/helm/install.go ``--timeout``, ``300*time.Second``), for each hook Job. The
handler runs in a Lambda function of 15 minutes (aws-eks-v2/lib/kubectl-provider.js).
"""
from __future__ import annotations

import json
import re

import pytest

from environment.addons import ADDONS, HANDLER_LIMIT_S, HOOK_JOBS_TIMEOUT_S
from infra.constructs.cluster_addons import KUBERNETES_RESOURCE_TYPES

HELM_DEFAULT_TIMEOUT_S = 300
"""helm/helm v3 cmd/helm/install.go: ``f.DurationVar(&client.Timeout, "timeout", 300*time.Second, ...)``."""


def _references(value) -> set[str]:
    """Logical ids a property value names through Ref / Fn::GetAtt (CloudFormation's implicit
    dependencies)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                found.add(inner[0] if isinstance(inner, list) else inner.split(".")[0])
            else:
                found |= _references(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _references(inner)
    return found


def _prerequisites(resources: dict) -> dict[str, set[str]]:
    """logical id -> every resource CloudFormation creates before it (transitively)."""
    direct = {}
    for rid, body in resources.items():
        depends = body.get("DependsOn", [])
        depends = {depends} if isinstance(depends, str) else set(depends)
        direct[rid] = (depends | _references(body.get("Properties", {}))) & resources.keys()
    closed: dict[str, set[str]] = {}

    def walk(rid: str) -> set[str]:
        if rid not in closed:
            closed[rid] = set()
            for dep in direct[rid]:
                closed[rid] |= {dep} | walk(dep)
        return closed[rid]

    for rid in resources:
        walk(rid)
    return closed


def _system_nodegroup_and_coredns(resources: dict) -> tuple[str, str]:
    [nodegroup] = [rid for rid, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"
                   and r["Properties"]["AmiType"] != "AL2023_x86_64_NVIDIA"]
    [coredns] = [rid for rid, r in resources.items() if r["Type"] == "AWS::EKS::Addon"
                 and r["Properties"]["AddonName"] == "coredns"]
    return nodegroup, coredns


def test_every_chart_and_manifest_waits_for_the_system_nodes_and_coredns(variant):
    resources = variant.json("cluster")["Resources"]
    before = _prerequisites(resources)
    nodegroup, coredns = _system_nodegroup_and_coredns(resources)
    kubernetes = [rid for rid, r in resources.items() if r["Type"] in KUBERNETES_RESOURCE_TYPES]
    assert len(kubernetes) >= 5  # the charts, CRD charts, the Ray namespace, the dashboards
    early = [f"{rid} ({resources[rid]['Type']}) lacks {', '.join(n for n in (nodegroup, coredns) if n not in before[rid])}"
             for rid in kubernetes if not {nodegroup, coredns} <= before[rid]]
    assert early == []


def test_the_oracle_sees_a_chart_that_waits_only_for_the_barrier():
    # given a chart that names only the barrier, the walk reports it (the check can fail)
    resources = {
        "Barrier": {"Type": "AWS::CloudFormation::WaitConditionHandle"},
        "Nodes": {"Type": "AWS::EKS::Nodegroup", "Properties": {"AmiType": "AL2023_x86_64_STANDARD"}},
        "Dns": {"Type": "AWS::EKS::Addon", "Properties": {"AddonName": "coredns", "X": {"Ref": "Nodes"}}},
        "Chart": {"Type": "Custom::AWSCDK-EKS-HelmChart", "DependsOn": ["Barrier"], "Properties": {}},
        "Later": {"Type": "Custom::AWSCDK-EKS-HelmChart", "Properties": {"A": {"Fn::GetAtt": ["Dns", "Arn"]}}},
    }
    before = _prerequisites(resources)
    assert {"Nodes", "Dns"} - before["Chart"] == {"Nodes", "Dns"}
    assert {"Nodes", "Dns"} <= before["Later"]


def _effective_helm_timeout_s(properties: dict) -> int:
    """What Helm waits for one release: the handler's ``--timeout`` when the resource carries a
    Timeout (``"600s"``, as helm-chart.js writes it), else Helm's default."""
    timeout = properties.get("Timeout")
    if timeout is None:
        return HELM_DEFAULT_TIMEOUT_S
    match = re.fullmatch(r"(\d+)s", timeout)
    assert match, f"helm-chart.js writes seconds, not {timeout!r}"
    return int(match.group(1))


def test_helm_timeouts_fit_what_each_chart_does_and_the_handler(variant):
    charts = [r["Properties"] for r in variant.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()]
    by_release = {p["Release"]: _effective_helm_timeout_s(p) for p in charts}
    hooks = {a.release for a in ADDONS if a.helm_timeout_s == HOOK_JOBS_TIMEOUT_S}
    for release, timeout in by_release.items():
        # the handler also runs update-kubeconfig (and a chart download) inside its 15 minutes
        assert timeout <= HANDLER_LIMIT_S - 120, release
        if release in hooks:
            # two hook Jobs, each scheduled and pulling its image on a fresh node
            assert timeout > HELM_DEFAULT_TIMEOUT_S, release
    # no chart is left to Helm's silent default: every release names its time limit
    assert all("Timeout" in p for p in charts)


@pytest.mark.parametrize("release", ["kube-prometheus-stack"])
def test_the_hook_chart_is_known_to_run_hook_jobs(release):
    # kube-prometheus-stack 88.5.3: prometheus-operator's admission-webhook certificate Jobs
    # (charts/kube-prometheus-stack/templates/prometheus-operator/admission-webhooks/job-patch/,
    # "helm.sh/hook": pre-install,pre-upgrade / post-install,post-upgrade) are on by default.
    [addon] = [a for a in ADDONS if a.release == release]
    assert addon.helm_timeout_s == HOOK_JOBS_TIMEOUT_S


def test_the_ray_namespace_is_deleted_while_the_kuberay_operator_runs(variant):
    # ray-project/kuberay tag v1.7.0 ray-operator/controllers/ray/rayjob_controller.go: every RayJob
    # gets the finalizer ray.io/rayjob-finalizer (utils.RayJobStopJobFinalizer), which only the
    # operator removes; aws-cdk-lib 2.275's kubectl handler deletes a manifest with a plain
    # `kubectl delete -f` (apply/__init__.py), which waits for finalizers. CloudFormation deletes
    # in the reverse order of creation, so the namespace must come after the operator's chart.
    resources = variant.json("cluster")["Resources"]
    before = _prerequisites(resources)
    [namespace] = [rid for rid, r in resources.items() if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
                   and '"kind":"Namespace"' in json.dumps(r["Properties"].get("Manifest", "")).replace('\\"', '"').replace(" ", "")]
    [operator] = [rid for rid, r in resources.items() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
                  and r["Properties"].get("Chart") == "kuberay-operator"]
    assert operator in before[namespace]
