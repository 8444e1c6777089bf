"""A run reaches only its own data: the SYNTHESIZED pod policies, evaluated with IAM's own rules
(tests/iam_policy.py, ported from the IAM User Guide) in the request context EKS Pod Identity
creates (its session tags, Amazon EKS User Guide "Grant Pods access to AWS resources based on
tags"). Run A's identity is refused on run B's prefix, on the uploaded inputs (write) and on the
pipeline's evidence; the long-lived cluster's single-team role is refused on the pipeline's
smoke runs and the inputs whatever its Allow says; the trust policies admit only this cluster's
Ray namespace; MLflow only on the spec's tracking server."""
from __future__ import annotations

import pytest

from iam_policy import Request, allowed, assume_context, decide, pod_identity_context, resolve, role_policies
from environment.contract import SMOKE_SERVICE_ACCOUNT, run_folder
from infra_variants import ACCOUNT, TRACKING_SERVER

WRITE = ("s3:PutObject", "s3:DeleteObject")


def _output_role(synth, output: str) -> str:
    return synth.json("cluster")["Outputs"][output]["Value"]["Fn::GetAtt"][0]


def _account(synth) -> str:
    return synth.env.cluster.account or ACCOUNT


def _policies(synth, output: str) -> list[dict]:
    return role_policies(synth.json("cluster"), _output_role(synth, output), account=_account(synth))


def _object(synth, key: str) -> str:
    return f"arn:aws:s3:::{synth.env.bucket_name}/{key}"


def _as_run(synth, run: str, action: str, key: str, **context) -> str:
    ctx = pod_identity_context(run=run, account=_account(synth), cluster=synth.env.cluster.eks_name, **context)
    return decide(_policies(synth, "RunRoleArn"), Request(action=action, resource=_object(synth, key), context=ctx))


def test_run_a_reads_and_writes_its_own_prefix_only(variant):
    prefix = variant.env.storage.prefix
    for action in ("s3:GetObject", *WRITE, "s3:AbortMultipartUpload"):
        assert _as_run(variant, "run-a", action, f"{prefix}/run-a/checkpoint_000002/__0_0.distcp") == "Allow", action
        assert _as_run(variant, "run-a", action, f"{prefix}/run-b/checkpoint_000002/__0_0.distcp") == "ImplicitDeny", action
        assert _as_run(variant, "run-a", action, f"{prefix}/run-b/run.json") == "ImplicitDeny", action
    # a name that only starts like run A's is another run
    assert _as_run(variant, "run-a", "s3:PutObject", f"{prefix}/run-ab/run.json") == "ImplicitDeny"
    # the pipeline's evidence is another run's prefix
    assert _as_run(variant, "run-a", "s3:PutObject", f"{prefix}/smoke-exec-1/run.json") == "Deny"


def test_run_a_reads_but_never_writes_the_inputs_and_read_only_prefixes(variant):
    prefix = variant.env.storage.prefix
    keys = [f"{prefix}/_inputs/0123456789abcdef/data.jsonl"] + [f"{ro}/x/y" for ro in variant.env.storage.read_only_prefixes]
    for key in keys:
        assert _as_run(variant, "run-a", "s3:GetObject", key) == "Allow", key
        for action in WRITE:  # the inputs: an explicit Deny; the read-only prefixes: no Allow
            assert _as_run(variant, "run-a", action, key) in ("Deny", "ImplicitDeny"), (action, key)
    # nothing outside: another prefix of the bucket, another bucket, a same-named bucket elsewhere
    assert _as_run(variant, "run-a", "s3:GetObject", "other/x") == "ImplicitDeny"
    ctx = pod_identity_context(run="run-a", account=_account(variant), cluster=variant.env.cluster.eks_name)
    elsewhere = Request(action="s3:GetObject", resource=_object(variant, f"{prefix}/run-a/run.json"),
                        context={**ctx, "s3:ResourceAccount": "999999999999"})
    assert not allowed(_policies(variant, "RunRoleArn"), elsewhere)


def test_a_session_without_the_run_tag_reaches_no_run(variant):
    """Session tags can be turned off per association (``disableSessionTags``): then the policy
    variable has no value and the run statement matches nothing."""
    prefix = variant.env.storage.prefix
    ctx = pod_identity_context(run="run-a", account=_account(variant), cluster=variant.env.cluster.eks_name)
    del ctx["aws:PrincipalTag/kubernetes-service-account"]
    request = Request(action="s3:GetObject", resource=_object(variant, f"{prefix}/run-a/run.json"), context=ctx)
    assert decide(_policies(variant, "RunRoleArn"), request) == "ImplicitDeny"


def test_the_smoke_runs_write_their_folders_only(variant):
    prefix = variant.env.storage.prefix
    ctx = pod_identity_context(run=SMOKE_SERVICE_ACCOUNT, account=_account(variant), cluster=variant.env.cluster.eks_name)
    ask = lambda action, key: decide(_policies(variant, "SmokeRoleArn"),  # noqa: E731
                                     Request(action=action, resource=_object(variant, key), context=ctx))
    assert ask("s3:PutObject", f"{prefix}/smoke-exec-1/run.json") == "Allow"
    assert ask("s3:PutObject", f"{prefix}/run-a/run.json") == "ImplicitDeny"
    assert ask("s3:PutObject", f"{prefix}/_inputs/h/x") == "ImplicitDeny"


def test_the_long_lived_cluster_is_single_team_but_never_writes_the_pipeline_evidence_or_inputs(variant):
    prefix = variant.env.storage.prefix
    policies = _policies(variant, "PodRoleArn")
    ctx = pod_identity_context(run=variant.env.ray.service_account, account=_account(variant),
                               cluster=variant.env.cluster.eks_name)
    ask = lambda action, key: decide(policies, Request(action=action, resource=_object(variant, key), context=ctx))  # noqa: E731
    on_cluster = run_folder("run-a", on_cluster=True)
    assert ask("s3:PutObject", f"{prefix}/{on_cluster}/run.json") == "Allow"  # single-team: any run on it
    for key in (f"{prefix}/smoke-exec-1/run.json", f"{prefix}/smoke-exec-1/metrics.jsonl", f"{prefix}/_inputs/h/d.jsonl"):
        for action in WRITE:
            assert ask(action, key) == "Deny", (action, key)  # explicit: no Allow can undo it
    assert ask("s3:GetObject", f"{prefix}/_inputs/h/d.jsonl") == "Allow"


def test_an_on_cluster_job_cannot_touch_a_run_with_its_own_cluster(variant):
    """A run with its own cluster resumes by trusting its completion marker (COMPLETE.json, the
    sha256 of every file) and then unpickles DCP's ``.metadata`` (training/checkpointing/markers.py,
    restore.py): a role that may rewrite both runs code in that run. The long-lived cluster's role
    reaches only ``on-cluster_<run>`` folders, which no service account's name (the run role's
    folder) can equal: an underscore is not in a DNS subdomain."""
    prefix = variant.env.storage.prefix
    policies = _policies(variant, "PodRoleArn")
    ctx = pod_identity_context(run=variant.env.ray.service_account, account=_account(variant),
                               cluster=variant.env.cluster.eks_name)
    ask = lambda action, key: decide(policies, Request(action=action, resource=_object(variant, key), context=ctx))  # noqa: E731
    checkpoint = "checkpoint_000002"
    for name in ("COMPLETE.json", ".metadata", "__0_0.distcp"):
        for action in (*WRITE, "s3:GetObject"):
            assert ask(action, f"{prefix}/run-a/{checkpoint}/{name}") == "ImplicitDeny", (action, name)
            assert ask(action, f"{prefix}/{run_folder('run-a', on_cluster=True)}/{checkpoint}/{name}") == "Allow", \
                (action, name)
    # and a run's own role never reaches an on-cluster folder, whatever the run is named
    for run in ("run-a", "on-cluster", "on-cluster-run-a"):
        for action in (*WRITE, "s3:GetObject"):
            key = f"{prefix}/{run_folder('run-a', on_cluster=True)}/{checkpoint}/COMPLETE.json"
            assert _as_run(variant, run, action, key) == "ImplicitDeny", (run, action)


@pytest.mark.parametrize("output", ["RunRoleArn", "PodRoleArn", "SmokeRoleArn"])
def test_only_this_clusters_ray_namespace_may_assume_the_pod_roles(variant, output):
    role = variant.json("cluster")["Resources"][_output_role(variant, output)]["Properties"]
    trust = [resolve(role["AssumeRolePolicyDocument"], account=_account(variant))]
    name = variant.env.cluster.eks_name
    assume = lambda **kw: decide(trust, Request(action="sts:AssumeRole", resource="*",  # noqa: E731
                                                context=assume_context(**{"account": _account(variant), **kw})))
    # the run role: any run's account; the two fixed roles: their own account only
    own = {"RunRoleArn": "run-a", "PodRoleArn": variant.env.ray.service_account, "SmokeRoleArn": SMOKE_SERVICE_ACCOUNT}[output]
    assert assume(run=own, cluster=name) == "Allow"
    assert assume(run=own, cluster="another-cluster") == "ImplicitDeny"
    assert assume(run=own, cluster=name, namespace="default") == "ImplicitDeny"
    assert assume(run=own, cluster=name, account="999999999999") == "ImplicitDeny"
    if output != "RunRoleArn":
        assert assume(run="run-a", cluster=name) == "ImplicitDeny"


def test_mlflow_only_on_the_named_tracking_server(alternative, default):
    ctx = pod_identity_context(run="run-a", account=_account(alternative), cluster=alternative.env.cluster.eks_name)
    for output in ("RunRoleArn", "PodRoleArn"):
        policies = _policies(alternative, output)
        for action in ("sagemaker-mlflow:CreateRun", "sagemaker-mlflow:LogBatch", "sagemaker-mlflow:GetExperimentByName"):
            assert allowed(policies, Request(action=action, resource=TRACKING_SERVER, context=ctx)), action
        other = TRACKING_SERVER.replace("/team", "/other")
        assert not allowed(policies, Request(action="sagemaker-mlflow:CreateRun", resource=other, context=ctx))
        assert not allowed(policies, Request(action="sagemaker:DeleteMlflowTrackingServer", resource=TRACKING_SERVER,
                                             context=ctx))
    # a spec without a tracking server: no MLflow right at all
    ctx = pod_identity_context(run="run-a", account=_account(default), cluster=default.env.cluster.eks_name)
    assert not allowed(_policies(default, "RunRoleArn"),
                       Request(action="sagemaker-mlflow:CreateRun", resource=TRACKING_SERVER, context=ctx))


# The evaluator's own rules, each from the IAM User Guide page tests/iam_policy.py names.
def test_the_evaluator_follows_iams_rules():
    allow = {"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::b/runs/${aws:PrincipalTag/t}/*"}
    deny = {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/runs/x/secret"}
    policies = [{"Statement": [allow, deny]}]
    ctx = {"aws:PrincipalTag/t": "x"}
    ask = lambda action, key, c=ctx: decide(policies, Request(action=action, resource=f"arn:aws:s3:::b/{key}", context=c))  # noqa: E731
    assert ask("S3:getobject", "runs/x/a") == "Allow"  # actions are case-insensitive
    assert ask("s3:GetObject", "runs/x/secret") == "Deny"  # an explicit Deny wins
    assert ask("s3:GetObject", "runs/y/a") == "ImplicitDeny"
    assert ask("s3:GetObject", "runs/x/a", {}) == "ImplicitDeny"  # the variable's key is absent
    assert ask("s3:PutObject", "runs/x/a") == "ImplicitDeny"
    # ${*} is a literal star, not a wildcard
    literal = [{"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/${*}"}]}]
    assert decide(literal, Request(action="s3:GetObject", resource="arn:aws:s3:::b/*")) == "Allow"
    assert decide(literal, Request(action="s3:GetObject", resource="arn:aws:s3:::b/a")) == "ImplicitDeny"
    # conditions: AND over keys, OR over values; IfExists and negated operators with an absent key
    cond = lambda c: [{"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": c}]}]  # noqa: E731
    req = lambda **c: Request(action="s3:GetObject", resource="arn:aws:s3:::b/k", context=c)  # noqa: E731
    two = cond({"StringEquals": {"k1": ["a", "b"], "k2": "c"}})
    assert allowed(two, req(k1="b", k2="c")) and not allowed(two, req(k1="b", k2="d")) and not allowed(two, req(k1="b"))
    assert allowed(cond({"StringLikeIfExists": {"k": "a*"}}), req())
    assert not allowed(cond({"StringLike": {"k": "a*"}}), req())
    assert allowed(cond({"StringNotEquals": {"k": "a"}}), req())
    assert not allowed(cond({"StringNotEquals": {"k": "a"}}), req(k="a"))


def test_the_inputs_folder_is_one_name_on_both_sides_of_the_layers():
    """infra may not import training (tests/test_layers.py): the folder the policies protect and
    the folder submit uploads into and the job reads are held equal here."""
    from environment.contract import INPUTS_PREFIX
    from training.contract import INPUTS_DIR

    assert INPUTS_PREFIX == INPUTS_DIR


def test_a_run_named_like_a_smoke_run_never_writes_the_pipeline_evidence(variant):
    # Run names (raytrain_eks/runs/manifest.py RUN_NAME) admit "smoke-<execution>-<build>": the
    # session tag then names the smoke run's folder, and the run role's own-folder Allow covers it.
    prefix = variant.env.storage.prefix
    for action in WRITE:
        assert _as_run(variant, "smoke-exec-1", action, f"{prefix}/smoke-exec-1/run.json") == "Deny", action
        assert _as_run(variant, "smoke-exec-1", action, f"{prefix}/smoke-exec-1/metrics.jsonl") == "Deny", action
