"""Drift: the CDK app and the cdk8s app, synthesized from ONE spec, must agree.

For each spec variant (the repository's environment.toml, and the same with 4 x g6.48xlarge
and an account) both apps are synthesized once (the CDK synth costs ~20-40 s on 2 cores, so
one per variant), then the facts one side relies on are read from the other side's output:

- the GPU node group's instance type   <-> the worker nodeSelector (and its labels, taints)
- GPUs and EFA interfaces of that type <-> the worker pod's limits (and the launch template's EFA NICs)
- the GPU limit                        <-> ``rayStartParams.num-gpus``
- the spec's Ray version               <-> every ``rayVersion``
- worker replicas x GPUs               <-> the job's ``--workers`` (its world size) and the node group size
- the Pod Identity association         <-> the pods' service account and namespace
- the KubeRay operator chart           <-> the CRDs the bindings were generated from
- the pod role's S3 policy             <-> the checkpoint storage and the code archive the jobs name
"""
from __future__ import annotations

import copy
import fnmatch
import json
import shlex
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from charts.main import NETWORK_POLICY_CHART
from infra.constructs.node_groups import EFA_INTERFACE_TYPES
from fixture_paths import FIXTURE_JOBS
from training.__main__ import parse_args

ROOT = Path(__file__).resolve().parents[1]
ACCOUNT = "111122223333"


def default_raw() -> dict:
    raw = tomllib.loads((ROOT / "environment.toml").read_text())
    # what the CDK app requires the user to choose: who administers the cluster, and an
    # account (it names the bucket)
    raw["cluster"].update(account=ACCOUNT, admin_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/admin"])
    return raw


def large_raw() -> dict:
    raw = copy.deepcopy(default_raw())
    raw["gpu_node_groups"][0].update(instance_type="g6.48xlarge", min_nodes=4, desired_nodes=4, max_nodes=4)
    return raw


@dataclass
class Both:
    env: object
    resources: dict
    """The CDK cluster stack's resources (logical id -> resource)."""
    manifests: dict
    """cdk8s chart name -> its one object."""
    plans: list
    dist: Path

    def of_type(self, type_name: str) -> list[dict]:
        return [r for r in self.resources.values() if r["Type"] == type_name]


def synthesize_both(raw: dict, source: str, tmp: Path) -> Both:
    from charts.main import synth
    from infra.build import build_app, new_app
    from environment import environment_from_dict

    env = environment_from_dict(raw, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unlocked image warns; both sides label it
        built = build_app(env, new_app(env, outdir=str(tmp / "cdk.out")))
        assembly = built.app.synth()
        result = synth(env, tmp / "dist", root=ROOT, jobs=FIXTURE_JOBS)
    template = assembly.get_stack_by_name(built.cluster.stack_name).template
    manifests = {name: yaml.safe_load(path.read_text()) for name, path in result.files.items()
                 if name != NETWORK_POLICY_CHART}  # one file of many policies, no Ray objects
    return Both(env=env, resources=template["Resources"], manifests=manifests, plans=result.plans,
                dist=tmp / "dist")


@pytest.fixture(scope="module", params=["environment.toml", "4x-g6.48xlarge"])
def both(request, tmp_path_factory) -> Both:
    raw = default_raw() if request.param == "environment.toml" else large_raw()
    return synthesize_both(raw, request.param, tmp_path_factory.mktemp("drift"))


def cluster_specs(both: Both):
    """(chart, RayCluster spec) of the RayCluster and of every RayJob with its own cluster."""
    for chart, obj in both.manifests.items():
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"].get("rayClusterSpec")
        if spec:
            yield chart, spec


def worker(spec):
    (group,) = spec["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    return group, group["template"]["spec"], container


def nodegroup_for(both: Both, node_selector: dict) -> dict:
    """The one managed node group whose labels satisfy the selector (instance type aside)."""
    wanted = {k: v for k, v in node_selector.items() if k != "node.kubernetes.io/instance-type"}
    found = [ng["Properties"] for ng in both.of_type("AWS::EKS::Nodegroup")
             if wanted.items() <= ng["Properties"].get("Labels", {}).items()]
    assert len(found) == 1, f"{len(found)} node groups match {wanted}"
    return found[0]


def resolve(value) -> str:
    """A CloudFormation string with Fn::Join/Ref AWS::Partition, as the deployed text."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(resolve(p) for p in parts)
    if value == {"Ref": "AWS::Partition"}:
        return "aws"
    return json.dumps(value)  # an unresolvable token: never matches an ARN


def allowed(both: Both, action: str, arn: str) -> bool:
    """Does an Allow statement of the cluster stack's policies grant ``action`` on ``arn``?"""
    for policy in both.of_type("AWS::IAM::Policy"):
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            if st["Effect"] == "Allow" and any(fnmatch.fnmatchcase(action, a) for a in actions) \
                    and any(fnmatch.fnmatchcase(arn, resolve(r)) for r in resources):
                return True
    return False


def test_worker_node_selector_matches_the_gpu_node_group(both):
    for chart, spec in cluster_specs(both):
        _, pod, _ = worker(spec)
        ng = nodegroup_for(both, pod["nodeSelector"])
        assert ng["InstanceTypes"] == [pod["nodeSelector"]["node.kubernetes.io/instance-type"]], chart
        assert ng["InstanceTypes"] == [both.env.primary_gpu_group.instance_type]
        # Every taint of the node group is tolerated by the worker pods.
        for taint in ng.get("Taints", []):
            effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
                      "PREFER_NO_SCHEDULE": "PreferNoSchedule"}[taint["Effect"]]
            assert {"key": taint["Key"], "operator": "Equal", "value": taint["Value"],
                    "effect": effect} in pod["tolerations"], chart


def test_head_runs_on_the_system_node_group(both):
    for chart, spec in cluster_specs(both):
        head_pod = spec["headGroupSpec"]["template"]["spec"]
        ng = nodegroup_for(both, head_pod["nodeSelector"])
        assert ng["InstanceTypes"] == [both.env.system_node_group.instance_type], chart
        assert "Taints" not in ng


def test_gpu_and_efa_counts_match_the_instance_and_launch_template(both):
    from environment import INSTANCE_TYPES

    templates = {lid: r for lid, r in both.resources.items() if r["Type"] == "AWS::EC2::LaunchTemplate"}
    for chart, spec in cluster_specs(both):
        group, pod, container = worker(spec)
        ng = nodegroup_for(both, pod["nodeSelector"])
        instance = INSTANCE_TYPES[ng["InstanceTypes"][0]]
        limits = container["resources"]["limits"]
        if group["rayStartParams"]["num-gpus"] == "0":  # a CPU job's cluster: its CPUs only
            assert not {"nvidia.com/gpu", "vpc.amazonaws.com/efa"} & set(limits), chart
            continue
        assert int(limits["nvidia.com/gpu"]) == instance.gpus, chart
        assert group["rayStartParams"]["num-gpus"] == limits["nvidia.com/gpu"], chart
        lt_id = ng["LaunchTemplate"]["Id"]["Ref"]
        nics = templates[lt_id]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
        efa_nics = [n for n in nics if n.get("InterfaceType") in EFA_INTERFACE_TYPES]
        assert int(limits["vpc.amazonaws.com/efa"]) == len(efa_nics) == instance.max_efa_interfaces, chart


def test_ray_version_matches_the_spec(both):
    for chart, spec in cluster_specs(both):
        assert spec["rayVersion"] == both.env.image.ray_version, chart


def test_world_size_fits_the_node_group(both):
    for plan in both.plans:
        if not plan.uses_gpu:
            continue
        rayjob = both.manifests[f"rayjob-{plan.name}"]
        group, pod, container = worker(rayjob["spec"]["rayClusterSpec"])
        args = parse_args(shlex.split(rayjob["spec"]["entrypoint"])[3:])  # the job's own parser
        world = group["replicas"] * int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert args.world.num_workers == world == plan.config.parallel.num_workers, plan.name
        ng = nodegroup_for(both, pod["nodeSelector"])
        assert group["replicas"] <= ng["ScalingConfig"]["MaxSize"], plan.name
    # the long-lived cluster: no GPU worker while idle, at most what the group can scale to
    group, pod, _ = worker(both.manifests["raycluster"]["spec"])
    assert group.get("replicas", 0) == 0  # left to Ray's autoscaler; the CRD defaults it to 0
    assert group["maxReplicas"] == nodegroup_for(both, pod["nodeSelector"])["ScalingConfig"]["MaxSize"]


def test_every_pod_gets_a_node(both):
    # the scheduling-fit check on these very outputs: every case places every pod
    from raytrain_eks.planning.fit_inputs import fit_cases

    cases = fit_cases(both.env, {"Resources": both.resources}, both.dist)
    assert len(cases) >= 3
    assert [line for c in cases for line in c.pending] == []


def test_service_account_matches_the_pod_identity_association(both):
    """The long-lived RayCluster's pods run under the service account the stack associates;
    a RayJob's own cluster under one named after the run (submit associates it with the run
    role, whose grants name the run's folder through that name)."""
    (assoc,) = [a["Properties"] for a in both.of_type("AWS::EKS::PodIdentityAssociation")
                if a["Properties"]["ServiceAccount"] == both.env.ray.service_account]
    for chart, obj in both.manifests.items():
        assert obj["metadata"]["namespace"] == assoc["Namespace"], chart
    for chart, spec in cluster_specs(both):
        obj = both.manifests[chart]
        expected = assoc["ServiceAccount"] if obj["kind"] == "RayCluster" else obj["metadata"]["name"]
        for template in (spec["headGroupSpec"]["template"], worker(spec)[0]["template"]):
            assert template["spec"]["serviceAccountName"] == expected, chart


def test_kuberay_operator_matches_the_crds_of_the_bindings(both):
    charts = [r["Properties"] for r in both.resources.values()
              if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"].get("Chart") == "kuberay-operator"]
    assert [c["Version"] for c in charts] == [both.env.versions.kuberay_operator]
    crds = yaml.load_all((ROOT / "charts" / "crds" / f"kuberay-v{charts[0]['Version']}.yaml").read_text(),
                         Loader=yaml.CSafeLoader)  # libyaml: the 2.3 MB file in pure Python takes seconds
    assert {c["metadata"]["name"] for c in crds if c} == {"rayclusters.ray.io", "rayjobs.ray.io"}


def test_pod_role_can_write_checkpoints_where_the_jobs_put_them(both):
    """Each RayJob's own pods (service account = the run) may write under ``<storage>/<run>/``,
    judged by IAM's rules with the session tags EKS Pod Identity sets (tests/iam_policy.py)."""
    from iam_policy import Request, allowed as iam_allowed, pod_identity_context, resolve as deployed

    storage = both.env.storage_uri.removeprefix("s3://")
    [role] = [k for k, r in both.resources.items() if r["Type"] == "AWS::IAM::Role"
              and r["Properties"].get("RoleName") == f"{both.env.cluster.eks_name}-ray-runs"]
    account = both.env.cluster.account or "123456789012"
    policies = [deployed(r["Properties"]["PolicyDocument"], account=account) for r in both.of_type("AWS::IAM::Policy")
                if {"Ref": role} in r["Properties"]["Roles"]]
    for chart, obj in both.manifests.items():
        if obj["kind"] != "RayJob" or "clusterSelector" in obj["spec"]:
            continue
        run = obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"]
        context = pod_identity_context(run=run, account=account, cluster=both.env.cluster.eks_name)
        for action in ("s3:PutObject", "s3:GetObject", "s3:DeleteObject"):
            request = Request(action=action, resource=f"arn:aws:s3:::{storage}/{run}/checkpoint_000001/model.pt",
                              context=context)
            assert iam_allowed(policies, request), (chart, action)


def objects_the_jobs_read(both: Both) -> list[tuple[str, str]]:
    """(who, s3 object) the pods must read: each RayJob's code archive (Ray's runtime-env agent
    downloads working_dir with the pod's credentials) and each job's model and data in S3."""
    reads = []
    for chart, obj in both.manifests.items():
        if obj["kind"] == "RayJob":
            reads.append((chart, yaml.safe_load(obj["spec"]["runtimeEnvYAML"])["working_dir"]))
    for plan in both.plans:
        for field in ("model.path", "model.tokenizer", "data.path"):
            section, key = field.split(".")
            uri = getattr(getattr(plan.config, section), key)
            if uri.startswith("s3://"):
                reads.append((f"{plan.config_path} {field}", uri.rstrip("/") + "/part-0.jsonl"))
    return reads


# Drift this test found once: the pod role could touch only s3://<bucket>/<storage.prefix>/*
# while every RayJob's working_dir is s3://<bucket>/code/... (fixed: storage.read_only_prefixes).
def test_pod_role_can_read_what_the_jobs_read(both):
    reads = objects_the_jobs_read(both)
    assert len(reads) >= 5
    denied = [f"{who}: {uri}" for who, uri in reads
              if not allowed(both, "s3:GetObject", "arn:aws:s3:::" + uri.removeprefix("s3://"))]
    assert denied == []
