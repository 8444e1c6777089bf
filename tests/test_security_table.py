"""docs/security.md's table of who reaches what, checked against the SYNTHESIZED policies: for
each row with an AWS identity, every S3 location its Reads cell lists is readable
(``s3:GetObject``) and every one its Writes cell lists writable (``s3:PutObject``), and every
other location the table names is refused, judged by IAM's evaluation rules
(tests/iam_policy.py) in the request context of that identity (EKS Pod Identity's session tags
for the pods). One synth of the shipped spec with a pipeline, people who submit and an MLflow
tracking server: the cluster and pipeline stacks."""
from __future__ import annotations

import json
import re
import tomllib
import warnings
from pathlib import Path

import pytest

from iam_policy import Request, allowed, pod_identity_context, resolve, role_policies

ROOT = Path(__file__).resolve().parents[1]
ACCOUNT = "111122223333"
CONNECTION = f"arn:aws:codeconnections:us-east-1:{ACCOUNT}:connection/0f3c2b1a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
TRACKING = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:mlflow-tracking-server/team"
RUN, OTHER = "run-a", "run-b"
LOCATIONS = {
    # a location of the table -> one object key in it
    "runs/<run>/": f"runs/{RUN}/checkpoint_000001/__0_0.distcp",
    "runs/<another run>/": f"runs/{OTHER}/checkpoint_000001/__0_0.distcp",
    "runs/on-cluster_<run>/": f"runs/on-cluster_{OTHER}/checkpoint_000001/COMPLETE.json",
    "runs/smoke-*/": "runs/smoke-e1-1/checkpoint_000001/__0_0.distcp",
    "runs/smoke-*/run.json": "runs/smoke-e1-1/run.json",
    "runs/smoke-*/metrics.jsonl": "runs/smoke-e1-1/metrics.jsonl",
    "runs/smoke-*/regression/": "runs/smoke-e1-1/regression/report.md",
    "runs/_inputs/": "runs/_inputs/0123456789abcdef/chats.jsonl",
    "code/": "code/training-0123456789abcdef.zip",
    "models/": "models/qwen/config.json",
    "data/": "data/chats.jsonl",
}


def table() -> list[dict[str, str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")))) for line in lines[2:]]
    assert header == ["Who", "Identity", "Reads", "Writes", "Runs"] and len(rows) >= 8
    return rows


def locations(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+/[^`]*)`", cell)) & set(LOCATIONS)


def covered(location: str, listed: set[str]) -> bool:
    """A folder listed covers what lies in it (``runs/smoke-*/`` covers its ``run.json``)."""
    return any(location == item or (item.endswith("/") and location.startswith(item)) for item in listed)


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    from environment import environment_from_dict
    from infra.build import build_app, new_app

    raw = tomllib.loads((ROOT / "environment.toml").read_text())
    raw["cluster"].update(account=ACCOUNT, admin_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/admin"],
                          submitter_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/ml-team"])
    raw["ray"]["mlflow_tracking_server_arn"] = TRACKING
    raw["image"]["digest"] = "sha256:" + "5" * 64
    raw["pipeline"].update(connection_arn=CONNECTION, repository="example-org/raytrain-eks")
    env = environment_from_dict(raw, "security-table.toml")
    assert (env.storage.prefix, env.storage.read_only_prefixes) == ("runs", ("code", "models", "data"))
    outdir = tmp_path_factory.mktemp("cdk-security")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(outdir)))
        built.app.synth()
    load = lambda stack: json.loads((outdir / f"{stack.stack_name}.template.json").read_text())  # noqa: E731
    return env, load(built.cluster), load(built.pipeline)


def identity(env, cluster: dict, pipeline: dict, cell: str) -> tuple[list[dict], dict[str, str]] | None:
    """(policy documents, request context) of the identity a row names; None for one not managed here."""
    name = re.search(r"`([^`]+)`", cell).group(1) if "`" in cell else ""
    pods = {"RunRoleArn": RUN, "PodRoleArn": env.ray.service_account, "SmokeRoleArn": "raytrain-smoke"}
    if name in pods:
        role = cluster["Outputs"][name]["Value"]["Fn::GetAtt"][0]
        context = pod_identity_context(run=pods[name], account=ACCOUNT, cluster=env.cluster.eks_name)
        return role_policies(cluster, role, account=ACCOUNT, strict=False), context
    context = {"s3:ResourceAccount": ACCOUNT}
    if name == "SubmitRunsPolicyArn":
        policy = cluster["Resources"][cluster["Outputs"][name]["Value"]["Ref"]]
        return [resolve(policy["Properties"]["PolicyDocument"], account=ACCOUNT, strict=False)], context
    if name.startswith("pipeline:"):
        step = name.split(":")[1]
        [role] = [k for k, r in pipeline["Resources"].items() if r["Type"] == "AWS::IAM::Role"
                  and r["Properties"].get("Description", "").startswith(f"Pipeline {step} build")]
        return role_policies(pipeline, role, account=ACCOUNT, strict=False), context
    assert "AmazonEKSClusterAdminPolicy" in cell, cell  # the admins: their own IAM
    return None


def test_every_row_of_the_table_is_what_the_policies_grant(synthesized):
    env, cluster, pipeline = synthesized
    rows = table()
    named = set().union(*(locations(r["Reads"]) | locations(r["Writes"]) for r in rows))
    assert named == set(LOCATIONS)
    checked = 0
    for row in rows:
        found = identity(env, cluster, pipeline, row["Identity"])
        if found is None:
            continue
        policies, context = found
        bucket = env.bucket_name
        for cell, action in (("Reads", "s3:GetObject"), ("Writes", "s3:PutObject")):
            listed = locations(row[cell])
            for location, key in LOCATIONS.items():
                request = Request(action=action, resource=f"arn:aws:s3:::{bucket}/{key}", context=context)
                assert allowed(policies, request) == covered(location, listed), (row["Who"], cell, location)
                checked += 1
    assert checked >= 7 * 2 * len(LOCATIONS)


def test_the_mlflow_claim_holds_for_the_jobs(synthesized):
    env, cluster, _ = synthesized
    [row] = [r for r in table() if r["Who"] == "A job on a cluster of its own"]
    assert "ray.mlflow_tracking_server_arn" in row["Runs"]
    policies, context = identity(env, cluster, {}, row["Identity"])
    assert allowed(policies, Request(action="sagemaker-mlflow:LogBatch", resource=TRACKING, context=context))
    assert not allowed(policies, Request(action="sagemaker-mlflow:LogBatch", resource=TRACKING + "x", context=context))


def test_submitters_delete_only_the_pod_identity_associations_raytrain_made(synthesized):
    """eks:DeletePodIdentityAssociation on the podidentityassociation resource type, which takes
    aws:ResourceTag/${TagKey} (Service Authorization Reference, Amazon EKS): submit tags each
    association it makes (raytrain_eks/backends/eks.py), and the delete needs that tag, so a
    submitter cannot remove another tool's or an add-on's association in the cluster."""
    from environment.contract import PART_OF

    env, cluster, pipeline = synthesized
    policies, context = identity(env, cluster, pipeline, "`SubmitRunsPolicyArn`")
    arn = f"arn:aws:eks:{env.cluster.region}:{ACCOUNT}:podidentityassociation/{env.cluster.eks_name}/a-123"
    [(key, value)] = PART_OF.items()
    ours = {**context, f"aws:ResourceTag/{key}": value}
    assert allowed(policies, Request(action="eks:DeletePodIdentityAssociation", resource=arn, context=ours))
    assert not allowed(policies, Request(action="eks:DeletePodIdentityAssociation", resource=arn, context=context))
    assert allowed(policies, Request(action="eks:DescribePodIdentityAssociation", resource=arn, context=context))
