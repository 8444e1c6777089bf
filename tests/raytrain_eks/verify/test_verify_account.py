"""verify's image-cache check, against botocore's Stubber: every request and response is checked
against botocore's own ECR and CloudFormation service models (botocore/data/ecr/2015-09-21/
service-2.json: DescribePullThroughCacheRules answers PullThroughCacheRuleNotFoundException for
a prefix with no rule)."""
from __future__ import annotations

import copy

import boto3
from botocore.stub import Stubber

from environment import environment_from_dict
from raytrain_eks.verify.account import check_image_cache
from spec_template import template_raw

PREFIX = "raytrain-ecr-public"


def _env(cache: bool = True):
    raw = copy.deepcopy(template_raw())
    raw["cluster"]["account"] = "111122223333"
    raw["image"]["pull_through_cache"] = cache
    return environment_from_dict(raw)


def _clients(stack_exists: bool, rule: bool | None):
    cfn = boto3.client("cloudformation", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    ecr = boto3.client("ecr", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    cfn_stub, ecr_stub = Stubber(cfn), Stubber(ecr)
    if stack_exists:
        cfn_stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": "raytrain-cluster", "CreationTime": "2026-12-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE"}]},
            {"StackName": "raytrain-cluster"})
    else:
        cfn_stub.add_client_error("describe_stacks", "ValidationError", "Stack with id raytrain-cluster does not exist")
    if rule is True:
        ecr_stub.add_response("describe_pull_through_cache_rules", {"pullThroughCacheRules": [{
            "ecrRepositoryPrefix": PREFIX, "upstreamRegistryUrl": "public.ecr.aws"}]},
            {"ecrRepositoryPrefixes": [PREFIX]})
    elif rule is False:
        ecr_stub.add_client_error("describe_pull_through_cache_rules", "PullThroughCacheRuleNotFoundException",
                                  "not found", expected_params={"ecrRepositoryPrefixes": [PREFIX]})
    cfn_stub.activate()
    ecr_stub.activate()
    return cfn, ecr, (cfn_stub, ecr_stub)


def test_a_rule_with_the_prefix_outside_the_stack_fails_the_first_deploy():
    cfn, ecr, stubs = _clients(stack_exists=False, rule=True)
    [finding] = check_image_cache(_env(), cfn, ecr)
    assert not finding.ok and f"rule {PREFIX} (upstream public.ecr.aws) already exists" in finding.line()
    assert f"delete-pull-through-cache-rule --ecr-repository-prefix {PREFIX}" in finding.fix
    for stub in stubs:
        stub.assert_no_pending_responses()


def test_no_rule_in_the_way_or_the_stacks_own_rule_passes():
    cfn, ecr, _ = _clients(stack_exists=False, rule=False)
    [finding] = check_image_cache(_env(), cfn, ecr)
    assert finding.ok and "no rule" in finding.message
    cfn, ecr, stubs = _clients(stack_exists=True, rule=None)  # ECR is not asked
    [finding] = check_image_cache(_env(), cfn, ecr)
    assert finding.ok and "belongs to the cluster stack" in finding.message
    stubs[1].assert_no_pending_responses()


def test_with_the_cache_off_nothing_is_asked():
    cfn, ecr, _ = _clients(stack_exists=False, rule=None)
    assert check_image_cache(_env(cache=False), cfn, ecr) == []


# ray.mlflow_tracking_server_arn: verify fails when the pods could not log to it (botocore's
# SageMaker model, sagemaker/2017-07-24/service-2.json: DescribeMlflowTrackingServer answers
# IsActive Active/Inactive and ResourceNotFound for an unknown name).
SERVER = "arn:aws:sagemaker:us-east-1:111122223333:mlflow-tracking-server/team"


def _tracking_env(arn: str = SERVER):
    raw = copy.deepcopy(template_raw())
    raw["cluster"]["account"] = "111122223333"
    raw.setdefault("ray", {})["mlflow_tracking_server_arn"] = arn
    return environment_from_dict(raw)


def _sagemaker(answer):
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if answer is None:
        stub.add_client_error("describe_mlflow_tracking_server", "ResourceNotFound", "not found",
                              expected_params={"TrackingServerName": "team"})
    elif answer != "skip":
        stub.add_response("describe_mlflow_tracking_server", {"TrackingServerArn": SERVER, "IsActive": answer,
                                                              "TrackingServerStatus": "Started" if answer == "Active" else "Stopped"},
                          {"TrackingServerName": "team"})
    stub.activate()
    return client


def test_verify_passes_an_active_tracking_server_and_fails_one_the_pods_cannot_use():
    from raytrain_eks.verify.account import check_tracking_server

    [ok] = check_tracking_server(_tracking_env(), _sagemaker("Active"))
    assert ok.ok
    [stopped] = check_tracking_server(_tracking_env(), _sagemaker("Inactive"))
    assert not stopped.ok and "start-mlflow-tracking-server" in stopped.fix
    [missing] = check_tracking_server(_tracking_env(), _sagemaker(None))
    assert not missing.ok and "no such tracking server" in missing.message
    [elsewhere] = check_tracking_server(_tracking_env(SERVER.replace("us-east-1", "eu-west-1")), _sagemaker("skip"))
    assert not elsewhere.ok and "cannot reach it" in elsewhere.message
    assert check_tracking_server(environment_from_dict(copy.deepcopy(template_raw())), None) == []
