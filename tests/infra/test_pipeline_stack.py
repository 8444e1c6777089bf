"""The pipeline stack's template: stages in order, the digest variable, the watcher's schedule,
and permissions scoped to what each part needs. ONE synth of the whole app (cdk-nag runs as a
validation plugin during it and fails on any unacknowledged finding).

The test spec enables the pipeline with account 111122223333 and a syntactically valid but
fictitious connection ARN (test data only).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import infra_variants
import pytest

from environment.contract import DEPLOYER_GROUP
from environment.model import MAX_APPLY_WAIT_MINUTES
from infra.lambdas.image_watcher import watcher as watcher_module
from infra.stacks import pipeline as pipeline_module
from infra.stacks.pipeline_builds import fingerprint

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = infra_variants.ACCOUNT
CONNECTION = infra_variants.PIPELINE_CONNECTION
DIGEST = infra_variants.PIPELINE_DIGEST
SCHEDULE = infra_variants.PIPELINE_SCHEDULE


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    from infra.build import build_app, new_app
    from environment import environment_from_dict

    # private endpoint: the richer path (kubectl builds inside the VPC) is the one synthesized
    env = environment_from_dict(infra_variants.pipeline_raw(), "pipeline-test.toml")
    outdir = tmp_path_factory.mktemp("cdk-pipeline")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(outdir)))
        built.app.synth()  # raises on an unacknowledged cdk-nag finding
    template = json.loads((outdir / f"{built.pipeline.stack_name}.template.json").read_text())
    return env, built, template


def resources(template: dict, type_name: str) -> dict:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def the(template: dict, type_name: str) -> dict:
    [resource] = resources(template, type_name).values()
    return resource["Properties"]


def policy_statements(template: dict, role_id_part: str) -> list[dict]:
    """Every statement of the policies attached to the role whose logical ID contains the part."""
    roles = [k for k in resources(template, "AWS::IAM::Role") if role_id_part in k]
    assert len(roles) == 1, roles
    return [s for p in resources(template, "AWS::IAM::Policy").values()
            if {"Ref": roles[0]} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def buildspec(template: dict, project_id_part: str) -> dict:
    import yaml

    [project] = [v for k, v in resources(template, "AWS::CodeBuild::Project").items() if project_id_part in k]
    return yaml.safe_load(project["Properties"]["Source"]["BuildSpec"])


def test_pipeline_is_v2_with_the_digest_variable_and_stages_in_order(synthesized):
    env, _, template = synthesized
    pipeline = the(template, "AWS::CodePipeline::Pipeline")
    assert pipeline["PipelineType"] == "V2" and pipeline["ExecutionMode"] == "QUEUED"
    [variable] = pipeline["Variables"]
    assert (variable["Name"], variable["DefaultValue"]) == ("IMAGE_DIGEST", "spec")
    assert [s["Name"] for s in pipeline["Stages"]] == ["Source", "Synth", "Release"]
    # Deploy, Smoke, Apply, Promote: ordered actions of ONE stage, so one QUEUED stage lock holds
    # them all ("each stage can process only one execution at a time", CodePipeline user guide,
    # concepts-how-it-works): no execution's Deploy lands under another's Smoke or Apply
    release = pipeline["Stages"][2]["Actions"]
    assert [(a["Name"], a["RunOrder"]) for a in release] == [
        ("HoldDeploy", 1), ("DeployStacks", 2), ("SmokeRun", 3), ("ApplyManifests", 4), ("PromoteDigest", 5)]
    # Hold: Apply's wait before a deploy that rolls or replaces a GPU group, in Apply's role
    hold = next(a for a in release if a["Name"] == "HoldDeploy")
    assert [c for c in buildspec(template, "HoldDeploy")["phases"]["build"]["commands"]] == [
        f'HOLD_PASSED_AT="$(python -m raytrain_eks.pipeline hold --template cdk.out/{env.cluster.name}-cluster.template.json)"']
    assert "ApplyRole" in json.dumps(template["Resources"][hold["Configuration"]["ProjectName"]["Ref"]]["Properties"]["ServiceRole"])
    [source] = pipeline["Stages"][0]["Actions"]
    assert source["ActionTypeId"]["Provider"] == "CodeStarSourceConnection"
    # a full clone: the manifests' identity (the commit) needs .git, which the default zip lacks
    assert source["Configuration"] == {"ConnectionArn": CONNECTION, "FullRepositoryId": "example-org/raytrain-eks",
                                       "BranchName": "release", "OutputArtifactFormat": "CODEBUILD_CLONE_REF"}
    # the watcher and the stack agree on the variable's name
    assert watcher_module.DIGEST_VARIABLE == pipeline_module.DIGEST_VARIABLE == "IMAGE_DIGEST"


def test_synth_chooses_and_pins_the_digest_then_tests_without_torch_and_synthesizes(synthesized):
    _, _, template = synthesized
    pipeline = the(template, "AWS::CodePipeline::Pipeline")
    [synth] = pipeline["Stages"][1]["Actions"]
    variables = {v["name"]: v["value"] for v in json.loads(synth["Configuration"]["EnvironmentVariables"])}
    assert variables["IMAGE_DIGEST"] == "#{variables.IMAGE_DIGEST}"
    assert variables["PROMOTED_DIGEST_PARAMETER"] == "/raytrain/raytrain/image/promoted-digest"
    spec = buildspec(template, "Synth")
    install = spec["phases"]["install"]["commands"]
    assert any("-c requirements.lock -e '.[synth]'" in c for c in install)
    assert not any("make install" in c or "[dev]" in c for c in install)  # no torch, no Ray
    commands = spec["phases"]["build"]["commands"]
    check = next(i for i, c in enumerate(commands) if "raytrain_eks.pipeline check-run" in c)
    pin = next(i for i, c in enumerate(commands) if "scripts/pipeline/synth.sh" in c)
    tests = next(i for i, c in enumerate(commands) if "pytest" in c)
    # refuse first, then test what was committed, then pin and synthesize
    assert check == 0 < tests < pin < next(i for i, c in enumerate(commands) if "cdk synth" in c)
    assert "-m 'not slow'" in commands[tests] and "tests/training" not in commands[tests]
    assert spec["phases"]["install"]["runtime-versions"]["nodejs"] == "22"  # Node 20 is past its end of life
    assert variables["PIPELINE_CONFIG"] == fingerprint(synthesized[0])
    assert variables["EXECUTION_ID"] == "#{codepipeline.PipelineExecutionId}"
    assert spec["env"]["exported-variables"] == ["IMAGE_DIGEST"]
    # the SSM description carries no tag: a tag change must not reset the promoted digest
    parameter = the(template, "AWS::SSM::Parameter")
    assert env_tag(synthesized) not in parameter["Description"] and parameter["Value"] == "none"


def env_tag(synthesized) -> str:
    return synthesized[0].image.tag


def test_smoke_then_apply_then_promote_with_the_proven_digest(synthesized):
    env, built, template = synthesized
    [fresh, record, deploy] = buildspec(template, "DeployStacks")["phases"]["build"]["commands"]
    # first of all, the hold this Deploy runs on must be its own and fresh (a retry reruns Deploy alone)
    assert fresh == '.venv/bin/python -m raytrain_eks.pipeline check-hold --passed-at "$HOLD_PASSED_AT"'
    # the existing GPU groups are recorded before the deploy synthesizes (no DesiredSize reset)
    assert record == ".venv/bin/python -m raytrain_eks.pipeline record-groups"
    assert deploy.endswith(f"{built.storage.stack_name} {built.cluster.stack_name}") and "cdk deploy" in deploy
    assert built.pipeline.stack_name not in deploy  # the pipeline never redeploys itself mid-run
    smoke = buildspec(template, "SmokeRun")
    upload = (f'aws s3 cp --only-show-errors dist/code/ "s3://{env.bucket_name}/code/" --recursive '
              '--exclude "*" --include "training-*.zip"')
    # the smoke job's code archive is uploaded before the job that names it runs
    assert smoke["phases"]["build"]["commands"] == [
        upload,
        'SMOKE_RECORD="$(python -m raytrain_eks.pipeline smoke --digest "$IMAGE_DIGEST")"',
        'python -m raytrain_eks.pipeline gate --digest "$IMAGE_DIGEST" --record "$SMOKE_RECORD" '
        "--required-transport efa"]
    assert smoke["env"]["exported-variables"] == ["SMOKE_RECORD"]
    apply = buildspec(template, "ApplyManifests")["phases"]["build"]["commands"]
    assert apply == [upload, 'python -m raytrain_eks.pipeline apply --digest "$IMAGE_DIGEST"']
    # Promote is a build in the kubectl role: a failure after Apply is rolled back right there
    promote = buildspec(template, "PromoteDigest")["phases"]["build"]["commands"]
    assert promote == ['python -m raytrain_eks.pipeline promote --digest "$IMAGE_DIGEST" --record "$SMOKE_RECORD" '
                       "--required-transport efa"]
    stages = the(template, "AWS::CodePipeline::Pipeline")["Stages"]
    for action in [a for a in stages[2]["Actions"] if a["Name"] != "DeployStacks"]:  # the kubectl builds
        assert action["ActionTypeId"]["Provider"] == "CodeBuild"
        variables = {v["name"]: v["value"] for v in json.loads(action["Configuration"]["EnvironmentVariables"])}
        assert variables["IMAGE_DIGEST"] == "#{Synth.IMAGE_DIGEST}"
        assert variables["HISTORY_TABLE"] == "raytrain-image-promotions"
    assert variables["SMOKE_RECORD"] == "#{Smoke.SMOKE_RECORD}"
    handlers = [v["Properties"].get("Handler", "") for v in resources(template, "AWS::Lambda::Function").values()]
    assert [h for h in handlers if h.startswith("image_watcher.")] == ["image_watcher.watcher.watch"]


def test_watcher_runs_on_the_spec_schedule_with_its_environment(synthesized):
    env, _, template = synthesized
    [rule] = [v["Properties"] for v in resources(template, "AWS::Events::Rule").values()
              if "ScheduleExpression" in v["Properties"]]
    assert rule["ScheduleExpression"] == SCHEDULE and rule["State"] == "ENABLED"
    functions = resources(template, "AWS::Lambda::Function")
    [watcher_id] = [k for k, v in functions.items() if v["Properties"]["Handler"] == "image_watcher.watcher.watch"]
    assert rule["Targets"][0]["Arn"] == {"Fn::GetAtt": [watcher_id, "Arn"]}
    props = functions[watcher_id]["Properties"]
    assert props["Runtime"].startswith("python3.")
    [(table_id, table)] = resources(template, "AWS::DynamoDB::Table").items()
    [(parameter_id, parameter)] = resources(template, "AWS::SSM::Parameter").items()
    assert props["Environment"]["Variables"] == {
        "IMAGE_REPOSITORY": env.image.repository, "IMAGE_TAG": env.image.tag,
        "PROMOTED_DIGEST_PARAMETER": {"Ref": parameter_id}, "HISTORY_TABLE": {"Ref": table_id},
        "PIPELINE_NAME": "raytrain-image-redeploy", "MAX_ATTEMPTS": str(env.pipeline.max_attempts),
        "MAINTENANCE_WINDOW": "sat,sun 02:00-06:00"}
    assert table["Properties"]["TableName"] == "raytrain-image-promotions"
    assert [k["AttributeName"] for k in table["Properties"]["KeySchema"]] == ["image", "at"]
    assert table["Properties"]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["DeletionPolicy"] == "Retain"  # the promotion history outlives the stack
    # the parameter starts as a placeholder, never a digest (CloudFormation never rewrites it)
    assert parameter["Properties"]["Name"] == "/raytrain/raytrain/image/promoted-digest"
    assert parameter["Properties"]["Value"] == "none"


def _arn(resource: str) -> dict:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, resource]]}


def test_watcher_may_only_read_the_parameter_use_the_table_and_start_this_pipeline(synthesized):
    _, _, template = synthesized
    statements = {s.get("Sid"): s for s in policy_statements(template, "WatcherImageWatcherRole")}
    assert set(statements) == {"WriteOwnLogs", "ReadPromotedDigest", "ReadHistory", "RecordHistory", "StartPipeline"}
    assert statements["ReadPromotedDigest"]["Action"] == "ssm:GetParameter"
    assert statements["StartPipeline"]["Action"] == ["codepipeline:StartPipelineExecution",
                                                     "codepipeline:GetPipelineExecution"]
    assert statements["StartPipeline"]["Resource"] == _arn(f":codepipeline:us-east-1:{ACCOUNT}:raytrain-image-redeploy")
    assert statements["ReadHistory"]["Action"] == "dynamodb:Query"
    # it records in the image's partition only: never the promoted-digest item's
    assert statements["RecordHistory"]["Action"] == "dynamodb:PutItem"
    assert statements["RecordHistory"]["Condition"] == {"ForAllValues:StringEquals": {
        "dynamodb:LeadingKeys": [f"{synthesized[0].image.repository}:{synthesized[0].image.tag}"]}}
    assert all(s["Resource"] != "*" for s in statements.values())


def test_resource_star_only_where_iam_has_no_resource_level_permissions(synthesized):
    _, _, template = synthesized
    star_actions = set()
    for policy in resources(template, "AWS::IAM::Policy").values():
        for s in policy["Properties"]["PolicyDocument"]["Statement"]:
            if s["Resource"] == "*" or "*" in (s["Resource"] if isinstance(s["Resource"], list) else []):
                star_actions |= set([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    assert star_actions == {
        # CodeBuild inside the VPC (private endpoint only): ENI lifecycle and VPC lookups
        "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces", "ec2:DeleteNetworkInterface",
        "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeDhcpOptions", "ec2:DescribeVpcs"}


def test_private_endpoint_kubectl_builds_run_in_the_vpc_admitted_on_443(synthesized):
    _, _, template = synthesized
    [(group_id, _)] = resources(template, "AWS::EC2::SecurityGroup").items()
    ingress = the(template, "AWS::EC2::SecurityGroupIngress")
    assert (ingress["IpProtocol"], ingress["FromPort"], ingress["ToPort"]) == ("tcp", 443, 443)
    assert ingress["SourceSecurityGroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}
    assert "ClusterSecurityGroupId" in json.dumps(ingress["GroupId"])  # the EKS cluster security group
    in_vpc = {k for k, v in resources(template, "AWS::CodeBuild::Project").items() if "VpcConfig" in v["Properties"]}
    assert sorted(k.rstrip("0123456789ABCDEF") for k in in_vpc) == ["ApplyManifests", "HoldDeploy", "PromoteDigest", "SmokeRun"]


def test_kubectl_builds_join_the_vpc_whenever_the_private_endpoint_is_on():
    """With public_and_private the public endpoint admits only public_access_cidrs, which
    CodeBuild's addresses are not in: the kubectl builds must reach the private endpoint."""
    from environment import environment_from_dict
    from infra.stacks.pipeline_builds import kubectl_in_vpc

    raw = tomllib.loads((REPO / "environment.toml").read_text())
    for access, cidrs, in_vpc in (("private", [], True), ("public_and_private", ["203.0.113.0/24"], True),
                                  ("public", ["0.0.0.0/0"], False)):  # a narrowed public-only endpoint is refused by the spec
        raw["cluster"].update(endpoint_access=access, public_access_cidrs=cidrs)
        assert kubectl_in_vpc(environment_from_dict(raw)) is in_vpc, access


def test_connection_permissions_use_the_service_prefix_of_the_connection_arn(synthesized):
    _, _, template = synthesized
    synth = [s for s in policy_statements(template, "SynthRole") if s.get("Sid") == "CloneThroughConnection"]
    assert synth == [{"Sid": "CloneThroughConnection", "Effect": "Allow", "Resource": CONNECTION,
                      "Action": ["codeconnections:UseConnection", "codeconnections:GetConnectionToken"]}]
    source = policy_statements(template, "SourceCodePipelineActionRole")
    assert any(s.get("Action") == "codeconnections:UseConnection" and s["Resource"] == CONNECTION for s in source)
    old = "arn:aws:codestar-connections:us-east-1:111122223333:connection/x"
    assert pipeline_module.connection_actions(old, "UseConnection") == ["codestar-connections:UseConnection"]


def test_kubectl_builds_hold_a_namespaced_rbac_group_not_cluster_admin(synthesized):
    env, _, template = synthesized
    entries = resources(template, "AWS::EKS::AccessEntry").values()
    assert len(entries) == 3  # Smoke, Apply, Promote: a role each, one RBAC group
    for entry in entries:
        assert entry["Properties"]["KubernetesGroups"] == [DEPLOYER_GROUP] and "AccessPolicies" not in entry["Properties"]
    [manifest] = resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
    objects = json.loads(manifest["Properties"]["Manifest"])
    assert [o["kind"] for o in objects] == ["Role", "RoleBinding"]  # no ClusterRole
    assert {o["metadata"]["namespace"] for o in objects} == {env.ray.namespace}
    assert objects[1]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DEPLOYER_GROUP}]
    bucket, runs = env.bucket_name, env.storage.prefix
    for step in ("Smoke", "Apply", "Promote"):
        statements = {s["Sid"]: s for s in policy_statements(template, f"KubectlDeployers{step}Role") if "Sid" in s}
        assert statements["UpdateKubeconfig"]["Resource"] == _arn(f":eks:us-east-1:{ACCOUNT}:cluster/raytrain")
    smoke = {s["Sid"]: s for s in policy_statements(template, "KubectlDeployersSmokeRole") if "Sid" in s}
    assert smoke["UploadCodeArchive"]["Resource"] == _arn(f":s3:::{bucket}/code/*")
    assert smoke["ReadSmokeRuns"]["Resource"] == [
        _arn(f":s3:::{bucket}/{runs}/smoke-*/run.json"), _arn(f":s3:::{bucket}/{runs}/smoke-*/metrics.jsonl")]
    assert smoke["RecordSmokeImageAndReport"]["Resource"] == [
        _arn(f":s3:::{bucket}/{runs}/smoke-*/run.json"), _arn(f":s3:::{bucket}/{runs}/smoke-*/regression/*")]


def test_only_promote_may_write_the_promoted_digest(synthesized):
    """Least privilege by stage: Smoke and Apply record history in the image's partition only
    (dynamodb:LeadingKeys), never the promoted-digest item (its own partition), never SSM; only
    Promote swaps the item, writes SSM, and reads the smoke record by version."""
    from infra.lambdas.image_watcher.history import pointer_key

    env, _, template = synthesized
    image = f"{env.image.repository}:{env.image.tag}"

    def actions(step: str) -> dict[str, dict]:
        out = {}
        for s in policy_statements(template, f"KubectlDeployers{step}Role"):
            for action in [s["Action"]] if isinstance(s["Action"], str) else s["Action"]:
                out.setdefault(action, []).append(s)
        return out

    smoke, apply, promote = actions("Smoke"), actions("Apply"), actions("Promote")
    for granted in (smoke, apply):
        assert "ssm:PutParameter" not in granted and "dynamodb:UpdateItem" not in granted
        [put] = granted["dynamodb:PutItem"]
        assert put["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [image]}}
    assert "s3:PutObject" not in promote and "s3:GetObject" not in apply
    [swap] = promote["dynamodb:UpdateItem"]
    assert swap["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [pointer_key(image)]}}
    assert pointer_key(image) != image
    assert "ssm:PutParameter" in promote and "s3:GetObjectVersion" in promote
    [list_runs] = promote["s3:ListBucket"]  # so a missing record reads 404, and 403 means unreadable
    assert list_runs["Resource"] == _arn(f":s3:::{env.bucket_name}")
    # the folder pattern IAM scopes the records to is the smoke step's run name
    from infra.stacks.pipeline_access import SMOKE_RUNS
    from raytrain_eks.pipeline.smoke import run_name

    assert run_name("exec", "7").startswith(SMOKE_RUNS.rstrip("*"))


def test_failures_reach_a_person(synthesized):
    """One SNS topic with the spec's e-mail subscriptions, fed by an alarm on the watcher's
    Errors, by every FAILED action of this pipeline (CodePipeline's summary as the reason) and by
    the kubectl steps (their role may publish; the topic's ARN is in their environment)."""
    env, built, template = synthesized
    [(topic_id, _)] = resources(template, "AWS::SNS::Topic").items()
    subs = sorted(v["Properties"]["Endpoint"] for v in resources(template, "AWS::SNS::Subscription").values())
    assert subs == sorted(env.pipeline.notify_emails) and subs
    [alarm] = resources(template, "AWS::CloudWatch::Alarm").values()
    a = alarm["Properties"]
    assert (a["MetricName"], a["Namespace"], a["Statistic"], a["Threshold"]) == ("Errors", "AWS/Lambda", "Sum", 1)
    assert a["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and a["AlarmActions"] == [{"Ref": topic_id}]
    [watcher] = [k for k, v in resources(template, "AWS::Lambda::Function").items()
                 if v["Properties"].get("Handler") == "image_watcher.watcher.watch"]
    assert a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": watcher}}]
    [rule] = [v["Properties"] for v in resources(template, "AWS::Events::Rule").values()
              if "EventPattern" in v["Properties"]]
    assert rule["EventPattern"] == {"source": ["aws.codepipeline"],
                                    "detail-type": ["CodePipeline Action Execution State Change"],
                                    "detail": {"pipeline": ["raytrain-image-redeploy"], "state": ["FAILED"]}}
    [target] = rule["Targets"]
    assert target["Arn"] == {"Ref": topic_id}
    assert "$.detail.execution-result.external-execution-summary" in json.dumps(target["InputTransformer"])
    for step in ("Smoke", "Apply", "Promote"):
        [publish] = [s for s in policy_statements(template, f"KubectlDeployers{step}Role") if s.get("Sid") == "NotifyFailures"]
        assert publish["Action"] == "sns:Publish" and publish["Resource"] == {"Ref": topic_id}
    for project in ("SmokeRun", "ApplyManifests", "PromoteDigest"):
        [props] = [v["Properties"] for k, v in resources(template, "AWS::CodeBuild::Project").items() if project in k]
        variables = {v["Name"]: v["Value"] for v in props["Environment"]["EnvironmentVariables"]}
        assert variables["NOTIFY_TOPIC_ARN"] == {"Ref": topic_id}


def test_every_service_that_feeds_the_topic_may_publish_to_it(synthesized):
    """A topic policy replaces SNS's default same-account policy: each AWS service that publishes
    (EventBridge's rule, CloudWatch's alarm) needs its own Allow, or SNS denies the publish
    (the CodeBuild roles publish through their IAM policies, same account)."""
    _, _, template = synthesized
    [(topic_id, _)] = resources(template, "AWS::SNS::Topic").items()
    [policy] = resources(template, "AWS::SNS::TopicPolicy").values()
    allowed = {s["Principal"]["Service"] for s in policy["Properties"]["PolicyDocument"]["Statement"]
               if s["Effect"] == "Allow" and "sns:Publish" in json.dumps(s["Action"]) and "Service" in s.get("Principal", {})}
    feeders = {"cloudwatch.amazonaws.com" for a in resources(template, "AWS::CloudWatch::Alarm").values()
               if {"Ref": topic_id} in a["Properties"].get("AlarmActions", [])}
    feeders |= {"events.amazonaws.com" for r in resources(template, "AWS::Events::Rule").values()
                if any(t["Arn"] == {"Ref": topic_id} for t in r["Properties"].get("Targets", []))}
    assert feeders == {"cloudwatch.amazonaws.com", "events.amazonaws.com"} and feeders <= allowed


def test_deploy_may_only_assume_the_cdk_bootstrap_roles(synthesized):
    env, _, template = synthesized
    [assume] = [s for s in policy_statements(template, "DeployStacksRole") if s.get("Sid") == "AssumeCdkBootstrapRoles"]
    assert assume["Resource"] == [
        _arn(f":iam::{ACCOUNT}:role/cdk-hnb659fds-{kind}-role-{ACCOUNT}-us-east-1")
        for kind in ("deploy", "file-publishing", "lookup")]
    # record-groups reads this cluster's node groups, nothing else
    statements = {s.get("Sid"): s for s in policy_statements(template, "DeployStacksRole")}
    assert statements["ReadNodeGroups"]["Action"] == ["eks:DescribeCluster", "eks:ListNodegroups"]
    assert statements["ReadNodeGroups"]["Resource"] == _arn(f":eks:us-east-1:{ACCOUNT}:cluster/{env.cluster.name}")
    assert statements["DescribeNodeGroups"]["Action"] == "eks:DescribeNodegroup"
    assert statements["DescribeNodeGroups"]["Resource"] == _arn(f":eks:us-east-1:{ACCOUNT}:nodegroup/{env.cluster.name}/*/*")
    # and the cluster stack's state (the record counts only while the stack is unchanged)
    assert statements["ReadClusterStackState"]["Action"] == "cloudformation:DescribeStacks"
    assert statements["ReadClusterStackState"]["Resource"] == _arn(
        f":cloudformation:us-east-1:{ACCOUNT}:stack/{env.cluster.name}-cluster/*")


def test_no_build_outlives_codepipelines_limit_on_a_codebuild_action(synthesized):
    """CodePipeline fails a CodeBuild action after 8 hours (its quotas page); Apply's build, which
    waits for running jobs, must end first even at the longest wait the spec allows (the fixture's)."""
    env, _, template = synthesized
    assert env.pipeline.apply_wait_minutes == MAX_APPLY_WAIT_MINUTES
    timeouts = {k: v["Properties"]["TimeoutInMinutes"] for k, v in resources(template, "AWS::CodeBuild::Project").items()}
    assert max(timeouts.values()) <= 480, timeouts


def test_each_kubectl_build_outlives_its_wait_plus_a_rollback(synthesized):
    _, _, template = synthesized
    projects = resources(template, "AWS::CodeBuild::Project")
    stages = the(template, "AWS::CodePipeline::Pipeline")["Stages"]
    env = synthesized[0]
    for action in [a for a in stages[2]["Actions"] if a["Name"] != "DeployStacks"]:  # the kubectl builds
        variables = {v["name"]: v["value"] for v in json.loads(action["Configuration"]["EnvironmentVariables"])}
        project = projects[action["Configuration"]["ProjectName"]["Ref"]]["Properties"]
        waits = int(variables["TIMEOUT_SECONDS"]) + int(variables["ROLLBACK_TIMEOUT_SECONDS"])
        waits += int(variables.get("QUEUE_TIMEOUT_SECONDS", 0))  # Smoke: first waits in Kueue's queue
        if action["Name"] == "ApplyManifests":  # first waits for the jobs running on the cluster
            waits += 60 * env.pipeline.apply_wait_minutes
        if action["Name"] == "HoldDeploy":  # only Apply's wait for the jobs: it rolls nothing back
            waits = 60 * env.pipeline.apply_wait_minutes
        assert project["TimeoutInMinutes"] * 60 >= waits + 10 * 60, action["Name"]


def test_with_the_pull_through_cache_smoke_may_warm_it_and_promote_tag_it(tmp_path):
    """Smoke warms the cache by tag before its pods pull the new digest (raytrain_eks/pipeline/smoke.py
    warm_cache): a registry login (ecr:GetAuthorizationToken: no resource-level permissions) and a
    pull through the rule, as a node's (BatchGetImage, BatchImportUpstreamImage, CreateRepository:
    Amazon ECR User Guide, "IAM permissions required to sync an upstream registry"), under the
    rule's prefix only. The synth runs cdk-nag: an unacknowledged wildcard fails it."""
    from infra.build import build_app, new_app
    from environment import environment_from_dict

    raw = tomllib.loads((REPO / "environment.toml").read_text())
    raw["cluster"].update(account=ACCOUNT, admin_principal_arns=[f"arn:aws:iam::{ACCOUNT}:role/admin"])
    raw["image"].update(digest=DIGEST, pull_through_cache=True)
    raw["pipeline"].update(connection_arn=CONNECTION, repository="example-org/raytrain-eks", branch="release")
    env = environment_from_dict(raw, "pipeline-test.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_app(env, new_app(env, outdir=str(tmp_path)))
        built.app.synth()
    template = json.loads((tmp_path / f"{built.pipeline.stack_name}.template.json").read_text())
    smoke = {s.get("Sid"): s for s in policy_statements(template, "SmokeRole")}
    assert smoke["RegistryLogin"]["Action"] == "ecr:GetAuthorizationToken" and smoke["RegistryLogin"]["Resource"] == "*"
    warm = smoke["WarmPullThroughCache"]
    assert sorted(warm["Action"]) == ["ecr:BatchGetImage", "ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    assert json.dumps(warm["Resource"]).endswith(f':repository/{env.cluster.name}-ecr-public/*"]]}}'), warm["Resource"]
    # Promote tags the digest it promotes there, so the cache's lifecycle policy keeps it
    # (raytrain_eks/pipeline/apply_promote.py keep_in_cache): the manifest read and put back, nothing else
    promote = [s for s in policy_statements(template, "PromoteRole") if "ecr:" in json.dumps(s.get("Action"))]
    assert [(s["Sid"], sorted(s["Action"])) for s in promote] == [("TagPromotedInCache", ["ecr:BatchGetImage", "ecr:PutImage"])]
    assert promote[0]["Resource"] == warm["Resource"]
    assert not any("ecr:" in json.dumps(s.get("Action")) for s in policy_statements(template, "ApplyRole"))


def test_a_deploy_retried_alone_after_its_hold_refuses_to_deploy(synthesized):
    """The retry sequence: HoldDeploy passes (no GPU job runs), DeployStacks fails, hours pass
    and a fine-tune starts, then an operator presses "Retry failed actions". RetryStageExecution
    with ``retryMode`` FAILED_ACTIONS "retries all failed actions in the stage" (CodePipeline
    user guide, pipelines-actions-retry: "retrying a failed stage retries all actions in the
    stage from the first action"; API_RetryStageExecution, retryMode FAILED_ACTIONS |
    ALL_ACTIONS): DeployStacks runs again, the HoldDeploy that succeeded does not, and its
    exported variables are this execution's. Deploy must judge that hold's age itself: a pass
    older than the bound is no licence to roll nodes, and the refusal names ALL_ACTIONS."""
    import os
    import time

    _, _, template = synthesized
    release = the(template, "AWS::CodePipeline::Pipeline")["Stages"][2]["Actions"]
    hold, deploy = (next(a for a in release if a["Name"] == n) for n in ("HoldDeploy", "DeployStacks"))
    # what FAILED_ACTIONS reruns after a failed DeployStacks: it and the actions after it
    rerun = [a["Name"] for a in release if a["RunOrder"] >= deploy["RunOrder"]]
    assert "HoldDeploy" not in rerun and "DeployStacks" in rerun
    commands = buildspec(template, "DeployStacks")["phases"]["build"]["commands"]
    before = commands[:next(i for i, c in enumerate(commands) if "record-groups" in c or "cdk deploy" in c)]

    def deploy_gate(passed_at: str) -> subprocess.CompletedProcess:
        # Deploy's commands before it touches AWS, as CodeBuild runs them (bash, in the source tree)
        env = {**os.environ, "HOLD_PASSED_AT": passed_at, "PATH": f"{REPO / '.venv/bin'}:{os.environ['PATH']}"}
        return subprocess.run(["bash", "-ec", "\n".join(before) or "true"], cwd=REPO, env=env,
                              capture_output=True, text=True)

    # the first run: Deploy right after its hold deploys
    assert deploy_gate(f"{time.time():.0f}").returncode == 0
    # the retry, hours later (a job may run now, the window may have closed): refused, one line
    late = deploy_gate(f"{time.time() - 3 * 3600:.0f}")
    assert late.returncode != 0, "a DeployStacks retried alone 3 h after its hold would deploy"
    from raytrain_eks.pipeline.apply_promote import HOLD_MAX_AGE_MINUTES

    [line] = [l for l in late.stderr.splitlines() if l.startswith("error:")]
    assert "Retry stage" in line and "ALL_ACTIONS" in line and f"{HOLD_MAX_AGE_MINUTES} min" in line
    # no pass at all (an execution started before the hold exported one): refused too
    assert deploy_gate("").returncode != 0
    # the hold's pass reaches Deploy as an exported variable of THIS execution's HoldDeploy
    namespace = hold.get("Namespace", "")
    assert "HOLD_PASSED_AT" in buildspec(template, "HoldDeploy")["env"].get("exported-variables", [])
    variables = {v["name"]: v["value"] for v in json.loads(deploy["Configuration"].get("EnvironmentVariables", "[]"))}
    assert variables.get("HOLD_PASSED_AT") == f"#{{{namespace}.HOLD_PASSED_AT}}"
