"""Image-driven redeploys: a CodePipeline V2 that proves a new image digest on the cluster before
promoting it, and the scheduled watcher that starts it.

Stages, in this order (the logic is raytrain_eks/pipeline/); Deploy, Smoke, Apply and Promote are
ordered actions of ONE stage, ``Release``, so that they run under one stage lock:

``Source``   CodeConnections (``pipeline.connection_arn``/``repository``/``branch``), as a
             full clone (``CODEBUILD_CLONE_REF``): the run record's identity is the commit.
``Synth``    refuses the run CodePipeline starts by itself when the pipeline is created, and a
             pipeline stack deployed from another configuration (``check-run``); tests the
             committed tree; chooses the digest: the run's ``IMAGE_DIGEST`` when it carries one (the watcher,
             an explicit rollback), else the PROMOTED digest (SSM, the one source of truth: a
             push never undoes an automatic promotion), else the committed one when it is new
             to the pipeline; pins it with ``raytrain-eks lock --digest``; tests environment,
             infra, charts and the pipeline (no torch, no Ray); ``cdk synth``, ``cdk8s synth``
             (also the promoted digest's manifests into ``dist/promoted/``).
``Deploy``   (Release, run order 1: ``HoldDeploy``, Apply's wait when the update rolls or replaces
             nodes; 2: ``DeployStacks``) refuses a hold that passed over HOLD_MAX_AGE_MINUTES ago
             (a "Retry failed actions" reruns DeployStacks alone), records which GPU node groups
             exist (``record-groups``), then ``cdk deploy`` of the storage and cluster stacks
             through the CDK bootstrap roles.
``Smoke``    (2) the ``smoke`` RayJob, named per build (a retried stage keeps the execution id), on a RayCluster of its own from the new digest; the image IDs
             its pods report become run.json's ``image_ran`` (with Kueue it first waits in the queue, up to
             ``SMOKE_QUEUE_MINUTES``; its timeout counts from the admission); then the record gate (succeeded,
             every pod ran this digest, the transport) and the regression gate against the last
             promoted smoke run, whose side-by-side report lands next to the runs.
``Apply``    (3) unless another execution promoted since Synth, and once no RayJob runs on it
             (bounded wait, or deferred; ``pipeline.maintenance_window``): the long-lived RayCluster
             (``upgradeStrategy: Recreate``), waiting until it is ready with every pod Ready on
             the new image ID, by a build role with a namespaced RBAC group
             (infra/stacks/pipeline_access.py).
``Promote``  (4) re-reads the record version the gate judged; compare-and-swap on the promoted digest Synth saw (history
             item in the same transaction), then SSM. A CodeBuild step, not a Lambda: a failure
             here must put the cluster back, which takes kubectl.

A failed Smoke, Apply or Promote records a ``rolled-back`` history item with the reason and its
class (the image's failure shelves the digest; others let the watcher retry it) and publishes it
to the failure topic (:class:`PipelineNotifications`), which also gets every failed action and
the watcher's errors; the
long-lived cluster is re-applied only when it differs from the manifest the last promotion
applied (after a failed smoke it was never touched). The pipeline variable ``IMAGE_DIGEST`` (default
``spec``) carries an explicit digest; rolling back to an older one is an explicit run:
``--variables name=IMAGE_DIGEST,value=sha256:<previous>`` (README, "Rollback").

Failures reach a person: one SNS topic (``pipeline.notify_emails`` subscribe to it by e-mail) fed by

- the pipeline's steps: each failure, with its reason and class (image / infrastructure /
  deferred) and what follows (raytrain_eks/pipeline/rollback.py);
- an EventBridge rule on every FAILED action of the pipeline, with its stage, action and
  CodePipeline's own summary (a Synth or Deploy failure, a build killed by its timeout: what no
  step of ours can report). Action events carry ``execution-result.external-execution-summary``;
  pipeline-level ones carry no reason, so the rule matches the actions;
- a CloudWatch alarm on the watcher Lambda's ``Errors`` (a registry outage, an import error):
  the watcher is scheduled, nobody would see it fail.
"""
from __future__ import annotations

from aws_cdk import (
    CfnOutput, Duration, RemovalPolicy, Stack, aws_cloudwatch as cloudwatch, aws_cloudwatch_actions as cw_actions,
    aws_codebuild as codebuild, aws_codepipeline as codepipeline, aws_codepipeline_actions as actions,
    aws_dynamodb as dynamodb, aws_events as events, aws_events_targets as targets, aws_iam as iam,
    aws_lambda as lambda_, aws_s3 as s3, aws_sns as sns, aws_sns_subscriptions as subscriptions, aws_ssm as ssm,
)
from constructs import Construct

from infra.stacks import pipeline_access, pipeline_builds
from infra.stacks.pipeline_builds import CONFIG_VARIABLE, HOLD_VARIABLE, fingerprint, kubectl_in_vpc, required_transport
from infra.lambdas.image_watcher.history import pointer_key
from infra.nag import acknowledge
from infra.stacks.pipeline_watcher import WatcherFunctions
from environment.contract import CODE_PREFIX
from environment.image_source import cache_prefix
from environment import Environment

DIGEST_VARIABLE = "IMAGE_DIGEST"
"""Must equal infra/lambdas/image_watcher/watcher.py DIGEST_VARIABLE (a test checks)."""
DIGEST_FROM_SPEC = "spec"
"""Default of IMAGE_DIGEST: deploy the digest committed in environment.toml."""
RELEASE_STAGE = "Release"
"""Deploy, Smoke, Apply and Promote: one stage, so one lock (QUEUED mode: "each stage can process
only one execution at a time", https://docs.aws.amazon.com/codepipeline/latest/userguide/concepts-how-it-works.html)."""
# The CDK bootstrap's default qualifier: `cdk deploy` in the Deploy stage assumes its roles.
BOOTSTRAP_QUALIFIER = "hnb659fds"


def connection_actions(connection_arn: str, *names: str) -> list[str]:
    """IAM actions on a connection, in the service prefix of its ARN (``codeconnections`` for
    connections created since July 2024, ``codestar-connections`` before): a policy's prefix
    must match the resource's. Both when the ARN is not literal."""
    service = connection_arn.split(":")[2] if connection_arn.count(":") >= 5 else ""
    prefixes = [service] if service in CONNECTION_SERVICES else list(CONNECTION_SERVICES)
    return [f"{prefix}:{name}" for prefix in prefixes for name in names]


CONNECTION_SERVICES = ("codeconnections", "codestar-connections")


ACTION_EVENT = "CodePipeline Action Execution State Change"
"""EventBridge detail-type of an action's state change (CodePipeline user guide, "Monitoring
CodePipeline events": ``detail.state`` FAILED with ``detail.execution-result``)."""


class PipelineNotifications(Construct):
    """The failure topic and what feeds it. Exposes :attr:`topic`."""

    def __init__(self, scope: Construct, construct_id: str, *, emails: tuple[str, ...], pipeline_name: str) -> None:
        super().__init__(scope, construct_id)
        self.topic = sns.Topic(self, "Topic", display_name=f"{pipeline_name} failures", enforce_ssl=True)
        acknowledge(self.topic, "AwsSolutions-SNS2",
                    "Messages hold digests, stage names and failure reasons, no secrets; CloudWatch alarms and "
                    "EventBridge cannot publish to a topic encrypted with the AWS-managed SNS key.")
        for address in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(address))
        self.pipeline_name = pipeline_name

    def on_failed_actions(self, pipeline_name: str) -> events.Rule:
        """Every FAILED action of the pipeline, with CodePipeline's summary of why."""
        field = events.EventField.from_path
        return events.Rule(
            self, "ActionFailed", description=f"Failed actions of {pipeline_name}, to the failure topic",
            event_pattern=events.EventPattern(source=["aws.codepipeline"], detail_type=[ACTION_EVENT],
                                              detail={"pipeline": [pipeline_name], "state": ["FAILED"]}),
            targets=[targets.SnsTopic(self.topic, message=events.RuleTargetInput.from_text(
                f"{pipeline_name}: action {field('$.detail.stage')}/{field('$.detail.action')} FAILED in "
                f"execution {field('$.detail.execution-id')}: "
                f"{field('$.detail.execution-result.external-execution-summary')} "
                f"({field('$.detail.execution-result.external-execution-url')})"))])

    def alarm_on_errors(self, function: lambda_.IFunction) -> cloudwatch.Alarm:
        """An alarm on any error of ``function`` (Sum of Errors >= 1 in 5 minutes)."""
        alarm = cloudwatch.Alarm(
            self, "WatcherErrors", metric=function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"The image watcher of {self.pipeline_name} failed: new digests are not being "
                              "detected (see its log group)")
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        # The topic has a policy of its own (enforce_ssl, EventBridge's grant), which replaces SNS's
        # default same-account one: without this grant CloudWatch's publish is denied and the
        # alarm fires into nothing ("... is not authorized to perform: SNS:Publish").
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="AlarmsPublish", actions=["sns:Publish"], resources=[self.topic.topic_arn],
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            conditions={"ArnLike": {"aws:SourceArn": alarm.alarm_arn},
                        "StringEquals": {"aws:SourceAccount": Stack.of(self).account}}))
        return alarm


class PipelineStack(Stack):
    """The redeploy pipeline, the watcher, the promoted-digest parameter and the history table.

    Exposes :attr:`pipeline`, :attr:`watcher`, :attr:`promoted_digest`,
    :attr:`history_table`, :attr:`kubectl_roles`, :attr:`notifications` and :attr:`pipeline_name`.
    """

    def __init__(self, scope: Construct, construct_id: str, *, env_spec: Environment,
                 cluster_stack, storage_stack, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        env = env_spec
        name = env.cluster.name
        # Fixed names: the watcher's environment names the pipeline, and the pipeline invokes the
        # promoter, so generated names would form a reference cycle.
        self.pipeline_name = f"{name}-image-redeploy"
        table_name, parameter_name = self._promotion_state(name)
        image = f"{env.image.repository}:{env.image.tag}"
        self._watcher(env, image)
        artifacts = s3.Bucket(
            self, "Artifacts", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(30),
                                              noncurrent_version_expiration=Duration.days(1))],
            removal_policy=RemovalPolicy.RETAIN)
        pipeline_access.acknowledge_artifact_bucket(artifacts)

        in_vpc = kubectl_in_vpc(env)
        vpc_args = self._kubectl_access(env, cluster_stack.cluster, image, in_vpc)
        common = {"CLUSTER_NAME": name, "NAMESPACE": env.ray.namespace,
                  "KUBERNETES_VERSION": env.cluster.kubernetes_version,
                  # the fixed names, not tokens: the builds' variables stay plain JSON
                  "PROMOTED_DIGEST_PARAMETER": parameter_name, "HISTORY_TABLE": table_name}
        projects = self._build_projects(env, storage_stack, cluster_stack, vpc_args)
        self._pipeline(env, common, projects, artifacts)
        pipeline_access.acknowledge_pipeline(
            self, artifacts=artifacts, projects=list(projects.values()),
            bucket_name=env.bucket_name, code_prefix=CODE_PREFIX, runs_prefix=env.storage.prefix,
            in_vpc=in_vpc, cluster_name=name, cache_prefix=cache_prefix(name) if env.image.pull_through_cache else "")

        CfnOutput(self, "PipelineName", value=self.pipeline_name)
        CfnOutput(self, "PromotedDigestParameter", value=self.promoted_digest.parameter_name)
        CfnOutput(self, "PromotionHistoryTable", value=self.history_table.table_name,
                  description=f"List promotions: aws dynamodb query --table-name {name}-image-promotions "
                              f"--no-scan-index-forward --key-condition-expression 'image = :i' "
                              f"--expression-attribute-values '{{\":i\":{{\"S\":\"{image}\"}}}}'")

    def _promotion_state(self, name: str) -> tuple[str, str]:
        """The promotion history table and the promoted-digest parameter: what the watcher, the
        pipeline's steps and an operator read and the promoter writes. Returns their fixed names."""
        table_name, parameter_name = f"{name}-image-promotions", f"/raytrain/{name}/image/promoted-digest"
        self.history_table = dynamodb.Table(
            self, "PromotionHistory", table_name=table_name,
            partition_key=dynamodb.Attribute(name="image", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="at", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            # The audit trail of what ran in production outlives the stack.
            removal_policy=RemovalPolicy.RETAIN)
        # A placeholder, never a digest: CloudFormation writes it once at creation and never
        # again (the value in the template does not change), so promotions are not undone by
        # a stack update.
        self.promoted_digest = ssm.StringParameter(
            self, "PromotedDigest", parameter_name=parameter_name,
            # A constant description: CloudFormation rewrites Value on ANY property change, so a
            # description naming the tag would reset the promotion whenever the tag changed.
            string_value="none", description="Image digest last proven by the smoke run (written by the "
                                             "pipeline; CloudFormation only creates it)")
        return table_name, parameter_name

    def _watcher(self, env: Environment, image: str) -> None:
        """The failure topic, and the watcher that resolves the tag on a schedule and starts the
        pipeline for a new digest (its errors alarm into the topic)."""
        self.notifications = PipelineNotifications(self, "Notifications", emails=env.pipeline.notify_emails,
                                                   pipeline_name=self.pipeline_name)
        functions = WatcherFunctions(
            self, "Watcher", image_repository=env.image.repository, image_tag=env.image.tag,
            parameter=self.promoted_digest, table=self.history_table,
            pipeline_arn=self.format_arn(service="codepipeline", resource=self.pipeline_name),
            pipeline_name=self.pipeline_name, max_attempts=env.pipeline.max_attempts,
            maintenance_window=env.pipeline.maintenance_window)
        self.watcher = functions.watcher
        self.notifications.alarm_on_errors(self.watcher)
        self.schedule = events.Rule(
            self, "WatchSchedule", schedule=events.Schedule.expression(env.pipeline.watch_schedule),
            description=f"Resolve {image} and start {self.pipeline_name} for a new digest",
            targets=[targets.LambdaFunction(self.watcher, retry_attempts=2)])

    def _kubectl_access(self, env: Environment, cluster, image: str, in_vpc: bool) -> dict:
        """Each kubectl build's own role (:attr:`kubectl_roles`), and with a private endpoint the
        VPC arguments that put the builds inside it."""
        name = env.cluster.name
        # Built from the spec's name like the pod role does: no export pins the stateful stack.
        bucket_arn = f"arn:{self.partition}:s3:::{env.bucket_name}"
        vpc_args = pipeline_access.private_endpoint_access(self, cluster) if in_vpc else {}
        self.kubectl_roles = pipeline_access.KubectlDeployers(
            self, "KubectlDeployers", cluster=cluster, namespace=env.ray.namespace,
            resources=pipeline_access.PipelineResources(
                cluster_arn=self.format_arn(service="eks", resource="cluster", resource_name=name),
                bucket_arn=bucket_arn, code_prefix=CODE_PREFIX, runs_prefix=env.storage.prefix,
                table_arn=self.history_table.table_arn, history_key=image, pointer_key=pointer_key(image),
                parameter_arn=self.promoted_digest.parameter_arn, topic_arn=self.notifications.topic.topic_arn,
                cache_prefix=cache_prefix(name) if env.image.pull_through_cache else "")).roles
        return vpc_args

    def _build_projects(self, env: Environment, storage_stack, cluster_stack, vpc_args: dict) -> dict:
        """The CodeBuild projects of the steps (Synth, DeployStacks, ApplyManifests, SmokeRun,
        PromoteDigest), each with the rights its step needs and no more."""
        name = env.cluster.name
        synth = pipeline_builds.project(self, "Synth", pipeline_builds.synth_spec(),
                                        compute=codebuild.ComputeType.LARGE)
        pipeline_arn = self.format_arn(service="codepipeline", resource=self.pipeline_name)
        # check-run: the trigger of this execution, and stopping the creation run.
        synth.add_to_role_policy(iam.PolicyStatement(
            sid="StopCreationRun", actions=["codepipeline:GetPipelineExecution", "codepipeline:StopPipelineExecution"],
            resources=[pipeline_arn]))
        # The full clone (CODEBUILD_CLONE_REF): CDK grants the codestar-connections form only.
        synth.add_to_role_policy(iam.PolicyStatement(
            sid="CloneThroughConnection", resources=[env.pipeline.connection_arn],
            actions=connection_actions(env.pipeline.connection_arn, "UseConnection", "GetConnectionToken")))
        # The digest choice reads the promoted digest (the ~promoted item, else SSM) and what the
        # pipeline already handled. It writes nothing: Promote repairs SSM from the item.
        synth.add_to_role_policy(iam.PolicyStatement(
            sid="ReadPromotedDigest", actions=["ssm:GetParameter"], resources=[self.promoted_digest.parameter_arn]))
        synth.add_to_role_policy(iam.PolicyStatement(
            sid="ReadHistory", actions=["dynamodb:Query", "dynamodb:GetItem"], resources=[self.history_table.table_arn]))
        deploy = pipeline_builds.project(self, "DeployStacks", pipeline_builds.deploy_spec(
            [storage_stack.stack_name, cluster_stack.stack_name]))
        deploy.add_to_role_policy(iam.PolicyStatement(
            sid="AssumeCdkBootstrapRoles", actions=["sts:AssumeRole"],
            resources=[self.format_arn(service="iam", region="", resource="role",
                                       resource_name=f"cdk-{BOOTSTRAP_QUALIFIER}-{kind}-role-{self.account}-{self.region}")
                       for kind in ("deploy", "file-publishing", "lookup")]))
        # record-groups reads this cluster's node groups (raytrain_eks/verify/account.py record_node_groups).
        deploy.add_to_role_policy(iam.PolicyStatement(
            sid="ReadNodeGroups", actions=["eks:DescribeCluster", "eks:ListNodegroups"],
            resources=[self.format_arn(service="eks", resource="cluster", resource_name=name)]))
        deploy.add_to_role_policy(iam.PolicyStatement(
            sid="DescribeNodeGroups", actions=["eks:DescribeNodegroup"],
            resources=[self.format_arn(service="eks", resource="nodegroup", resource_name=f"{name}/*/*")]))
        # record-groups and app.py read the cluster stack's state (infra/verify_gate.py
        # stack_state): the record's groups count only while the stack is the one they were read from.
        deploy.add_to_role_policy(iam.PolicyStatement(
            sid="ReadClusterStackState", actions=["cloudformation:DescribeStacks"],
            resources=[self.format_arn(service="cloudformation", resource="stack",
                                       resource_name=f"{cluster_stack.stack_name}/*")]))
        # Each kubectl build's own role (pipeline_access.KubectlDeployers): only Promote may
        # write the promoted digest. The topic's ARN is a project variable (a token there is fine).
        notify = {"NOTIFY_TOPIC_ARN": codebuild.BuildEnvironmentVariable(value=self.notifications.topic.topic_arn)}
        # Apply first waits for the jobs running on the long-lived cluster (pipeline.apply_wait_minutes).
        apply = pipeline_builds.project(self, "ApplyManifests", pipeline_builds.apply_spec(env.bucket_name),
                                        role=self.kubectl_roles["Apply"], environment_variables=notify,
                                        timeout=Duration.minutes(env.pipeline.apply_wait_minutes
                                                                 + 2 * pipeline_builds.APPLY_TIMEOUT_MINUTES + 15),
                                        **vpc_args)
        smoke = pipeline_builds.project(self, "SmokeRun", pipeline_builds.smoke_spec(env.bucket_name, required_transport(env)),
                                        role=self.kubectl_roles["Smoke"], environment_variables=notify,
                                        timeout=Duration.minutes(
                                            pipeline_builds.SMOKE_QUEUE_MINUTES + pipeline_builds.SMOKE_TIMEOUT_MINUTES
                                            + pipeline_builds.APPLY_TIMEOUT_MINUTES + 15), **vpc_args)
        promote = pipeline_builds.project(self, "PromoteDigest", pipeline_builds.promote_spec(required_transport(env)),
                                          role=self.kubectl_roles["Promote"], environment_variables=notify,
                                          timeout=Duration.minutes(
                                              pipeline_builds.PROMOTE_TIMEOUT_MINUTES
                                              + pipeline_builds.APPLY_TIMEOUT_MINUTES + 15), **vpc_args)
        # Hold runs in Apply's role (its cluster access, in the VPC where the endpoint is private)
        # and reads the deployed cluster template to compare Synth's with.
        self.kubectl_roles["Apply"].add_to_policy(iam.PolicyStatement(
            sid="ReadDeployedClusterTemplate", actions=["cloudformation:GetTemplate"],
            resources=[self.format_arn(service="cloudformation", resource="stack",
                                       resource_name=f"{cluster_stack.stack_name}/*")]))
        hold = pipeline_builds.project(self, "HoldDeploy", pipeline_builds.hold_spec(cluster_stack.stack_name),
                                       role=self.kubectl_roles["Apply"], environment_variables=notify,
                                       timeout=Duration.minutes(env.pipeline.apply_wait_minutes + 15), **vpc_args)
        return {"synth": synth, "hold": hold, "deploy": deploy, "apply": apply, "smoke": smoke, "promote": promote}

    def _pipeline(self, env: Environment, common: dict, projects: dict, artifacts: s3.Bucket) -> None:
        """The pipeline: Source, Synth, and one Release stage (Hold -> Deploy -> Smoke -> Apply -> Promote)."""
        synth, hold, deploy, apply, smoke, promote = (projects[k] for k in ("synth", "hold", "deploy", "apply", "smoke", "promote"))
        source_output = codepipeline.Artifact("Source")
        built = codepipeline.Artifact("Built")
        digest_variable = codepipeline.Variable(
            variable_name=DIGEST_VARIABLE, default_value=DIGEST_FROM_SPEC,
            description="sha256:... to deploy, or 'spec' for the digest committed in environment.toml")
        owner, repo = env.pipeline.repository.split("/", 1)

        def env_vars(extra: dict[str, str]) -> dict[str, codebuild.BuildEnvironmentVariable]:
            return {k: codebuild.BuildEnvironmentVariable(value=v) for k, v in {**common, **extra}.items()}

        synth_action = actions.CodeBuildAction(
            action_name="Synth", project=synth, input=source_output, outputs=[built],
            variables_namespace="Synth", environment_variables=env_vars(
                {DIGEST_VARIABLE: digest_variable.reference(), "ENV_FILE": "environment.toml",
                 "PIPELINE_NAME": self.pipeline_name, "EXECUTION_ID": "#{codepipeline.PipelineExecutionId}",
                 CONFIG_VARIABLE: fingerprint(env)}))
        kubectl_vars = env_vars({"EXECUTION_ID": "#{codepipeline.PipelineExecutionId}",
                                 "IMAGE_DIGEST": synth_action.variable("IMAGE_DIGEST"),
                                 "TIMEOUT_SECONDS": str(60 * pipeline_builds.SMOKE_TIMEOUT_MINUTES),
                                 # each project's timeout = its step's wait + a rollback's + 15 min
                                 "ROLLBACK_TIMEOUT_SECONDS": str(60 * pipeline_builds.APPLY_TIMEOUT_MINUTES)})
        smoke_action = actions.CodeBuildAction(
            action_name="SmokeRun", project=smoke, input=built, variables_namespace="Smoke",
            environment_variables={**kubectl_vars, "QUEUE_TIMEOUT_SECONDS": codebuild.BuildEnvironmentVariable(
                value=str(60 * pipeline_builds.SMOKE_QUEUE_MINUTES))}, run_order=3)
        hold_action = actions.CodeBuildAction(action_name="HoldDeploy", project=hold, input=built, run_order=1,
                                              variables_namespace="Hold", environment_variables=kubectl_vars)
        self.pipeline = codepipeline.Pipeline(
            self, "Pipeline", pipeline_name=self.pipeline_name,
            pipeline_type=codepipeline.PipelineType.V2, variables=[digest_variable],
            # None dropped (a watcher run must not be superseded by a push). QUEUED locks each
            # STAGE to one execution at a time, so everything that changes or tests the cluster is
            # ONE stage (Release); only Source and Synth overlap, hence Apply's superseded check.
            execution_mode=codepipeline.ExecutionMode.QUEUED,
            artifact_bucket=artifacts, cross_account_keys=False, restart_execution_on_update=False,
            stages=[
                codepipeline.StageProps(stage_name="Source", actions=[actions.CodeStarConnectionsSourceAction(
                    action_name="Source", connection_arn=env.pipeline.connection_arn, owner=owner,
                    repo=repo, branch=env.pipeline.branch, output=source_output,
                    code_build_clone_output=True)]),
                codepipeline.StageProps(stage_name="Synth", actions=[synth_action]),
                # Hold -> Deploy -> Smoke -> Apply -> Promote, in run order, under the one stage
                # lock: no execution's Deploy replaces nodes under another's Smoke or Apply, nor
                # (Hold, the same wait as Apply's) under running GPU jobs. The long-lived
                # cluster changes only after the image proved itself on its own cluster. A retry
                # of the stage (RetryStageExecution, FAILED_ACTIONS) reruns the failed action on,
                # not a HoldDeploy that passed: DeployStacks refuses a pass older than
                # HOLD_MAX_AGE_MINUTES (its exported HOLD_PASSED_AT), naming "Retry stage".
                codepipeline.StageProps(stage_name=RELEASE_STAGE, actions=[
                    hold_action,
                    actions.CodeBuildAction(
                        action_name="DeployStacks", project=deploy, input=built, run_order=2, environment_variables={
                            HOLD_VARIABLE: codebuild.BuildEnvironmentVariable(value=hold_action.variable(HOLD_VARIABLE))}),
                    smoke_action,
                    actions.CodeBuildAction(
                        action_name="ApplyManifests", project=apply, input=built, run_order=4,
                        environment_variables={**kubectl_vars, "TIMEOUT_SECONDS": codebuild.BuildEnvironmentVariable(
                            value=str(60 * pipeline_builds.APPLY_TIMEOUT_MINUTES))}),
                    actions.CodeBuildAction(
                        action_name="PromoteDigest", project=promote, input=built, run_order=5, environment_variables={
                            **kubectl_vars, "SMOKE_RECORD": codebuild.BuildEnvironmentVariable(
                                value=smoke_action.variable("SMOKE_RECORD")),
                            "TIMEOUT_SECONDS": codebuild.BuildEnvironmentVariable(
                                value=str(60 * pipeline_builds.PROMOTE_TIMEOUT_MINUTES))}),
                ]),
            ])
        self.notifications.on_failed_actions(self.pipeline_name)
        source_role = self.node.find_child("Pipeline").node.find_child("Source").node.find_child(
            "Source").node.find_child("CodePipelineActionRole")
        source_role.add_to_principal_policy(iam.PolicyStatement(
            sid="UseConnection", resources=[env.pipeline.connection_arn],
            actions=connection_actions(env.pipeline.connection_arn, "UseConnection")))
