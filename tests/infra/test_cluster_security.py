"""Least privilege around the nodes: EKS managed add-ons at pinned versions (the CNI on its own
Pod Identity role, enforcing network policies), node role without CNI permissions, IMDS out of
reach of pods, the public endpoint limited to the spec's CIDRs, the namespace's network
policies, and KubeRay's CRDs upgraded with its chart version."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest

from environment.addons import ADDONS_BY_KEY, EKS_ADDONS_BY_NAME
from environment.contract import POD_SECURITY_LABELS
from environment.network_policy import namespace_policies

CNI_POLICY = "AmazonEKS_CNI_Policy"


def _resources(synth, type_name):
    return synth.resources("cluster", type_name)


def _role_policies(role: dict) -> str:
    return json.dumps(role["Properties"].get("ManagedPolicyArns", []))


def test_managed_addons_pinned_for_the_kubernetes_version(variant):
    addons = {a["Properties"]["AddonName"]: a["Properties"] for a in _resources(variant, "AWS::EKS::Addon").values()}
    version = variant.env.cluster.kubernetes_version
    assert {name: a["AddonVersion"] for name, a in addons.items()} == {
        name: EKS_ADDONS_BY_NAME[name].versions[version]
        for name in ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "eks-node-monitoring-agent")}
    # no self-managed bootstrap copies next to them
    [cluster] = _resources(variant, "AWS::EKS::Cluster").values()
    assert cluster["Properties"]["BootstrapSelfManagedAddons"] is False
    # the CNI enforces NetworkPolicies (the string "true") on its own Pod Identity role
    cni = addons["vpc-cni"]
    assert json.loads(cni["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}
    [association] = cni["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "aws-node"
    role = variant.json("cluster")["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
    [trust] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert CNI_POLICY in _role_policies(role)


def test_nodes_have_no_cni_permissions_and_no_imds_for_pods(variant):
    resources = variant.json("cluster")["Resources"]
    nodegroups = [n["Properties"] for n in _resources(variant, "AWS::EKS::Nodegroup").values()]
    assert len(nodegroups) == 1 + len(variant.env.gpu_node_groups)
    roles = {json.dumps(n["NodeRole"]) for n in nodegroups}
    assert len(roles) == 1  # one node role for every group
    node_role = resources[nodegroups[0]["NodeRole"]["Fn::GetAtt"][0]]
    assert "AmazonEKSWorkerNodePolicy" in _role_policies(node_role)
    assert CNI_POLICY not in _role_policies(node_role)
    # only the CNI's own role carries the CNI policy
    with_cni = [k for k, r in resources.items() if r["Type"] == "AWS::IAM::Role" and CNI_POLICY in _role_policies(r)]
    assert len(with_cni) == 1
    for nodegroup in nodegroups:  # every node, system and GPU: IMDSv2, hop limit 1
        template = resources[nodegroup["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
        assert template["MetadataOptions"] == {
            "HttpEndpoint": "enabled", "HttpTokens": "required", "HttpPutResponseHopLimit": 1}
        # nodes wait for the CNI, kube-proxy and the agent (they cannot become Ready before)
    # (CoreDNS and the node monitoring agent run ON the nodes: they come after them)
    addon_ids = {k for k, r in resources.items() if r["Type"] == "AWS::EKS::Addon"
                 and r["Properties"]["AddonName"] not in ("coredns", "eks-node-monitoring-agent")}
    for key, r in resources.items():
        if r["Type"] == "AWS::EKS::Nodegroup":
            assert addon_ids <= set(r.get("DependsOn", [])), key


def test_public_endpoint_admits_only_the_spec_cidrs(default, alternative):
    vpc = lambda synth: next(iter(_resources(synth, "AWS::EKS::Cluster").values()))["Properties"]["ResourcesVpcConfig"]
    assert vpc(default)["PublicAccessCidrs"] == list(default.env.cluster.public_access_cidrs) == ["0.0.0.0/0"]
    assert "PublicAccessCidrs" not in vpc(alternative)  # private endpoint: no public CIDRs


def test_endpoint_cidrs_follow_the_spec():
    from aws_cdk import Stack
    from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks

    from infra.stacks.cluster import endpoint_access

    stack = Stack()
    cluster = eks.Cluster(stack, "C", version=eks.KubernetesVersion.of("1.36"),
                          default_capacity_type=eks.DefaultCapacityType.NODEGROUP, default_capacity=0,
                          vpc=ec2.Vpc(stack, "V", max_azs=2),
                          endpoint_access=endpoint_access("public_and_private", ("203.0.113.0/24", "198.51.100.7/32")))
    props = stack.resolve(cluster.node.default_child.resources_vpc_config)
    assert props["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.7/32"]


def _namespace_manifest(synth) -> list[dict]:
    for r in _resources(synth, "Custom::AWSCDK-EKS-KubernetesResource").values():
        manifest = r["Properties"]["Manifest"]
        docs = json.loads(manifest) if isinstance(manifest, str) else manifest
        if any(d.get("kind") == "Namespace" for d in docs):
            return docs
    raise AssertionError("no namespace manifest")


def test_namespace_comes_with_its_network_policies_and_no_token_automount(variant):
    docs = _namespace_manifest(variant)
    ns = variant.env.ray.namespace
    # the long-lived cluster's service account and the pipeline's smoke runs' (each run's own: submit)
    assert [d["kind"] for d in docs] == ["Namespace", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy",
                                         "ServiceAccount", "ServiceAccount"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for policy in policies:  # the kubectl provider's own pruning label aside
        policy["metadata"]["labels"] = {k: v for k, v in policy["metadata"]["labels"].items()
                                        if not k.startswith("aws.cdk.eks/prune-")}
    assert policies == namespace_policies(ns, ADDONS_BY_KEY["kuberay_operator"].namespace)
    for doc in docs:
        kubernetes_validate.validate(doc, f"{variant.env.cluster.kubernetes_version}.0", strict=True)
    assert [d["automountServiceAccountToken"] for d in docs[-2:]] == [False, False]
    # Pod Security: baseline enforced (tests/charts/test_pod_security_admission.py proves every
    # pod KubeRay creates passes it), restricted warned and audited
    labels = docs[0]["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("pod-security.kubernetes.io/")} == POD_SECURITY_LABELS
    assert POD_SECURITY_LABELS["pod-security.kubernetes.io/enforce"] == "baseline"
    assert POD_SECURITY_LABELS["pod-security.kubernetes.io/warn"] == POD_SECURITY_LABELS["pod-security.kubernetes.io/audit"] == "restricted"


def test_kuberay_crds_come_from_a_chart_of_their_own_before_the_operator(default):
    resources = default.json("cluster")["Resources"]
    charts = {k: r for k, r in resources.items() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"}
    [(crd_id, crds)] = [(k, r) for k, r in charts.items() if r["Properties"].get("Release") == "kuberay-operator-crds"]
    assert "ChartAssetURL" in crds["Properties"] and "Chart" not in crds["Properties"]
    [operator] = [r for r in charts.values() if r["Properties"].get("Chart") == "kuberay-operator"]
    assert crd_id in operator["DependsOn"]


def test_a_kuberay_version_bump_changes_the_applied_crds(tmp_path):
    from infra.constructs.cluster_addons import write_crd_chart

    addon = ADDONS_BY_KEY["kuberay_operator"]
    old = tmp_path / "kuberay-v1.7.0.yaml"
    new = tmp_path / "kuberay-v1.8.0.yaml"
    old.write_text(addon.crds("1.7.0").read_text())
    new.write_text(old.read_text().replace("controller-gen.kubebuilder.io/version: v0.16.5",
                                           "controller-gen.kubebuilder.io/version: v0.17.0"))
    before = write_crd_chart(addon, "1.7.0", old, tmp_path / "out")
    after = write_crd_chart(addon, "1.8.0", new, tmp_path / "out")
    # a different chart (asset) with the new CRDs as templates: `helm upgrade` applies them
    assert before != after
    assert (after / "templates" / "crds.yaml").read_text() == new.read_text()
    assert "version: 1.8.0" in (after / "Chart.yaml").read_text()
    assert "version: 1.7.0" in (before / "Chart.yaml").read_text()
    assert "{{" not in new.read_text()  # nothing Helm would try to render


def test_a_version_without_pinned_crds_is_refused(tmp_path):
    import copy

    from infra_variants import default_raw, synthesize

    from environment import SpecError

    raw = copy.deepcopy(default_raw())
    raw["versions"]["kuberay_operator"] = "1.99.0"
    with pytest.raises(SpecError, match=r"versions.kuberay_operator: '1.99.0' has no pinned CRDs \(add kuberay-v1.99.0.yaml"):
        synthesize(raw, tmp_path, "environment.toml")


def test_every_supported_kubernetes_version_has_pinned_managed_addons():
    from environment.addons import EKS_ADDONS
    from environment.contract import KUBERNETES_VERSIONS

    for addon in EKS_ADDONS:
        assert set(KUBERNETES_VERSIONS) <= set(addon.versions), addon.name
        assert all(v.startswith("v") and "-eksbuild." in v for v in addon.versions.values()), addon.name


def _admission_manifest(synth) -> list[dict]:
    for r in _resources(synth, "Custom::AWSCDK-EKS-KubernetesResource").values():
        manifest = r["Properties"]["Manifest"]
        docs = json.loads(manifest) if isinstance(manifest, str) else manifest
        if any(d.get("kind") == "ValidatingAdmissionPolicy" for d in docs):
            return docs
    raise AssertionError("no ValidatingAdmissionPolicy in the cluster stack")


@pytest.mark.parametrize("which", ["default", "existing"])
def test_the_stack_installs_the_run_identity_admission_policy(which, request):
    """The policy the cluster tier proves on a real apiserver (tests/cluster/test_run_identity_admission.py),
    installed by the cluster stack and by the existing-cluster stack, bound to the Ray namespace."""
    from environment.contract import DEPLOYER_GROUP
    from infra.constructs.pod_identity import run_identity_admission

    synth = request.getfixturevalue(which)
    env = synth.env
    docs = _admission_manifest(synth)
    for doc in docs:
        doc["metadata"]["labels"] = {k: v for k, v in doc["metadata"]["labels"].items()
                                     if not k.startswith("aws.cdk.eks/prune-")}
    assert docs == run_identity_admission(
        namespace=env.ray.namespace, raycluster_name=env.cluster.name, cluster_account=env.ray.service_account,
        operator_namespace=ADDONS_BY_KEY["kuberay_operator"].namespace, pipeline_group=DEPLOYER_GROUP)
    policy, binding = docs
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": env.ray.namespace}}
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert set(rule["resources"]) == {"rayjobs", "rayclusters"} and set(rule["operations"]) == {"CREATE", "UPDATE"}
    for doc in docs:
        kubernetes_validate.validate(doc, f"{env.cluster.kubernetes_version}.0", strict=True)
