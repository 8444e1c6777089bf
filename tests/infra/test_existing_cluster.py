"""The stacks of an environment installed onto an EKS cluster a team already has
(``cluster.existing``; infra/stacks/attached.py): nothing that exists is created, what is
missing is, and ``cdk destroy`` can remove only what the stacks created.

The rules of aws-cdk-lib 2.275.0's aws_eks_v2 that decide the outcome are ported below, each
citing its file in the installed package (``aws-cdk-lib/aws-eks-v2/lib/``, read from jsii's
package cache of 2.275.0).
"""
from __future__ import annotations

import copy

import pytest

from environment import environment_from_dict
from environment.addons import ADDONS, ADDONS_BY_KEY, installed_addons
from environment.contract import SMOKE_SERVICE_ACCOUNT
from infra.build import resolved_addons
from infra.constructs.cluster_addons import KUBERNETES_RESOURCE_TYPES, crd_chart_name
from infra_variants import (
    EXISTING_CLUSTER, EXISTING_PRESENT, EXISTING_SECURITY_GROUP, EXISTING_SUBNETS, existing_raw,
)

OWNED_BY_THE_CLUSTER = (
    # What an existing cluster already has: none of these may be in any stack of the app.
    "AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::NatGateway", "AWS::EC2::InternetGateway",
    "AWS::EC2::RouteTable", "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog",
    "AWS::EKS::Cluster", "AWS::EKS::Addon", "AWS::IAM::OIDCProvider",
)


def _all_resources(synth) -> dict[str, dict]:
    out = {}
    for stack in (synth.built.storage, synth.built.cluster):
        out |= {f"{stack.stack_name}/{k}": v for k, v in synth.json(
            "storage" if stack is synth.built.storage else "cluster")["Resources"].items()}
    return out


def test_nothing_that_exists_is_created(existing):
    # given a spec naming an existing cluster, its VPC, system group, an L4 group it has and
    # three add-ons it runs; when the app is synthesized
    assert existing.built.network is None
    resources = _all_resources(existing)
    assert [k for k, v in resources.items() if v["Type"] in OWNED_BY_THE_CLUSTER] == []
    # then the one node group is the new p5 group (no system group, not the existing L4 group)
    groups = existing.resources("cluster", "AWS::EKS::Nodegroup")
    assert [g["Properties"]["Labels"]["raytrain.io/node-group"] for g in groups.values()] == ["p5"]
    [group] = groups.values()
    assert group["Properties"]["ClusterName"] == EXISTING_CLUSTER
    # in the spec's private subnet of the GPU AZ, beside the cluster's own security group
    assert group["Properties"]["Subnets"] == [EXISTING_SUBNETS[0]]
    templates = existing.resources("cluster", "AWS::EC2::LaunchTemplate")
    [template] = templates.values()
    [interface] = template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][:1]
    assert EXISTING_SECURITY_GROUP in interface["Groups"]


def test_no_addon_the_spec_marks_present_is_installed(existing):
    releases = {v["Properties"]["Release"] for v in existing.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()}
    for key in EXISTING_PRESENT:
        addon = ADDONS_BY_KEY[key]
        assert addon.release not in releases and crd_chart_name(addon) not in releases
    # and every add-on the cluster lacks is installed (with its CRD chart where it has one)
    expected = set()
    for addon in installed_addons(existing.env):
        expected |= {addon.release} | ({crd_chart_name(addon)} if addon.crds else set())
    assert releases == expected and expected
    # cluster-autoscaler is present: no role or association for one is made here
    associations = existing.resources("cluster", "AWS::EKS::PodIdentityAssociation")
    # (the long-lived cluster's pods and the pipeline's smoke runs have theirs)
    assert sorted(a["Properties"]["ServiceAccount"] for a in associations.values()) == sorted(
        [existing.env.ray.service_account, SMOKE_SERVICE_ACCOUNT])
    assert existing.built.cluster.autoscaler is None


@pytest.mark.parametrize("key", [a.key for a in ADDONS])
def test_every_row_of_the_addon_table_is_skipped_where_present(key):
    # the rule is the table's, not a list of names: any row (one added later included) that
    # the spec marks present is not installed, and the others are
    raw = existing_raw()
    raw["cluster"]["present_addons"] = [key]
    env = environment_from_dict(raw, "existing.toml")
    keys = [r.addon.key for r in resolved_addons(env)]
    assert key not in keys
    assert keys == [a.key for a in ADDONS if a.enabled(env) and a.key != key]


def test_the_kubectl_handler_gets_the_access_a_new_cluster_gives_it(existing):
    """aws-cdk-lib 2.275.0 aws-eks-v2/lib/cluster.js: a new ``Cluster`` makes its
    ``KubectlProvider`` and calls ``grantClusterAdmin("ClusterAdminRoleAccess", provider.role.roleArn)``
    (an AccessEntry with AmazonEKSClusterAdminPolicy, cluster scope) and puts that entry in its
    kubectl barrier; ``ImportedCluster`` does neither. The stack grants the same, once."""
    entries = existing.resources("cluster", "AWS::EKS::AccessEntry")
    [(entry_id, entry)] = entries.items()
    props = entry["Properties"]
    assert props["ClusterName"] == EXISTING_CLUSTER
    role = existing.json("cluster")["Resources"][props["PrincipalArn"]["Fn::GetAtt"][0]]
    assert role["Type"] == "AWS::IAM::Role"
    handler_roles = [f["Properties"]["Role"]["Fn::GetAtt"][0]
                     for f in existing.resources("cluster", "AWS::Lambda::Function").values()
                     if "kubectl resource provider" in f["Properties"].get("Description", "")]
    assert handler_roles == [props["PrincipalArn"]["Fn::GetAtt"][0]]
    [policy] = props["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert str(policy["PolicyArn"]).endswith("cluster-access-policy/AmazonEKSClusterAdminPolicy']]}")


def test_every_kubernetes_object_waits_for_the_handlers_access(existing):
    """aws-cdk-lib 2.275.0 aws-eks-v2/lib/kubectl-provider.js ``getKubectlProvider``:
    ``cluster instanceof Cluster && cluster._dependOnKubectlBarrier(scope)``: on an imported
    cluster no chart or manifest waits for anything; before its access entry exists, the
    handler's ``helm``/``kubectl`` is refused by the API server and the deploy fails."""
    [entry_id] = existing.resources("cluster", "AWS::EKS::AccessEntry")
    objects = {k: v for k, v in existing.json("cluster")["Resources"].items() if v["Type"] in KUBERNETES_RESOURCE_TYPES}
    assert objects
    assert [k for k, v in objects.items() if entry_id not in v.get("DependsOn", [])] == []


def test_the_handler_runs_in_the_clusters_vpc_when_the_private_endpoint_is_on(existing):
    """aws-cdk-lib 2.275.0 aws-eks-v2/lib/kubectl-provider.js: with ``privateSubnets`` the
    handler and the provider framework join ``cluster.vpc`` in those subnets, with
    ``cluster.clusterSecurityGroup`` when no security group is given."""
    assert existing.env.cluster.endpoint_access == "public_and_private"
    functions = existing.resources("cluster", "AWS::Lambda::Function").values()
    for function in functions:
        assert function["Properties"]["VpcConfig"] == {"SecurityGroupIds": [EXISTING_SECURITY_GROUP],
                                                       "SubnetIds": EXISTING_SUBNETS}


def test_an_imported_cluster_ignores_kubectl_provider_options():
    """aws-cdk-lib 2.275.0 aws-eks-v2/lib/cluster.js ``ImportedCluster``'s constructor sets
    ``this.kubectlProvider = props.kubectlProvider`` and never reads ``kubectlProviderOptions``;
    helm-chart.js then refuses: "Kubectl Provider is not defined in this cluster". Why the
    stack makes a ``KubectlProvider`` itself (infra/stacks/attached.py)."""
    import aws_cdk as cdk
    from aws_cdk import aws_eks_v2 as eks
    from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer

    stack = cdk.Stack(cdk.App(), "Probe", env=cdk.Environment(account="111122223333", region="us-east-1"))
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Imported", cluster_name="team-gpu",
        kubectl_provider_options=eks.KubectlProviderOptions(kubectl_layer=KubectlV36Layer(stack, "Layer")))
    with pytest.raises(Exception, match="Kubectl Provider is not defined in this cluster"):
        cluster.add_helm_chart("Probe", chart="probe", repository="https://example.com/charts")


def test_the_ray_namespace_is_created_never_adopted(existing):
    """aws-cdk-lib 2.275.0 custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/apply/__init__.py:
    on Create, ``kubectl create`` unless ``Overwrite`` is "true" (then ``kubectl apply``, which
    adopts an object that exists); on Delete, ``kubectl delete`` of every object of the manifest.
    Without Overwrite a namespace the cluster already has fails the deploy instead of being
    adopted, so a destroy never deletes it."""
    manifests = existing.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource")
    [namespace] = [m for k, m in manifests.items() if "RayNamespaceAndServiceAccount" in k]
    assert '\\"kind\\":\\"Namespace\\"' in _text(namespace["Properties"]["Manifest"])
    assert str(namespace["Properties"].get("Overwrite", "false")).lower() != "true"


def test_destroy_removes_only_what_the_stacks_created(existing):
    # CloudFormation deletes the resources of its template and nothing else: no resource is
    # kept past a destroy (the storage stack's bucket aside, kept on purpose); the existing
    # cluster, VPC, subnets and security group are only referenced (test_nothing_that_exists_is_created)
    for stack_key, resource in _all_resources(existing).items():
        if stack_key.startswith(existing.built.storage.stack_name):
            continue
        assert resource.get("DeletionPolicy", "Delete") == "Delete", stack_key
        assert resource.get("UpdateReplacePolicy", "Delete") == "Delete", stack_key
    storage = existing.resources("storage", "AWS::S3::Bucket")
    assert storage and all(b["DeletionPolicy"] == "Retain" for b in storage.values())


def test_a_spec_without_existing_still_creates_the_cluster(default):
    assert default.built.network is not None
    assert default.resources("cluster", "AWS::EKS::Cluster")


def _text(value) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def test_existing_raw_is_the_documented_shape():
    # the fixture spec is valid and names one new and one existing GPU group
    env = environment_from_dict(copy.deepcopy(existing_raw()), "existing.toml")
    assert env.cluster.eks_name == EXISTING_CLUSTER
    assert [g.existing for g in env.gpu_node_groups] == ["team-l4", ""]


def test_a_cluster_autoscaler_and_kuberay_installed_here(tmp_path):
    # cluster-autoscaler finds ASGs tagged k8s.io/cluster-autoscaler/<EKS name> (EKS tags a managed
    # group's ASG so) and may scale only those: the EKS name is cluster.existing, not cluster.name.
    # KubeRay's CRD chart comes from an asset the handler reads (aws-eks-v2/lib/helm-chart.js:
    # ``chartAsset.bucket.grantRead(provider.role)``): the synth (cdk-nag included) passes.
    from infra_variants import synthesize

    raw = existing_raw()
    raw["cluster"]["present_addons"] = ["nvidia_device_plugin"]
    synth = synthesize(raw, tmp_path, "existing.toml")
    charts = synth.built.cluster.addons
    assert "kuberay_operator" in charts.crd_charts and "kuberay_operator" in charts.charts
    values = ADDONS_BY_KEY["cluster_autoscaler"].values(synth.env)
    assert values["autoDiscovery"]["clusterName"] == EXISTING_CLUSTER
    [policy] = [p for k, p in synth.resources("cluster", "AWS::IAM::Policy").items() if "ClusterAutoscaler" in k]
    [scale] = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "ScaleThisClustersGroups"]
    assert scale["Condition"] == {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{EXISTING_CLUSTER}": "owned"}}


def test_the_reset_warning_names_only_groups_this_app_writes():
    # a synth without a recent verify warns that it keeps DesiredSize on the groups it writes;
    # the existing cluster's own L4 group is in no template, so it is not named
    from infra.verify_gate import reset_warning

    env = environment_from_dict(existing_raw(), "existing.toml")
    line = reset_warning(env)
    assert "p5 keep(s) DesiredSize" in line and "gpu," not in line
