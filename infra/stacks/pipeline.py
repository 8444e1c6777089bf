"""Image-driven redeploys: a CodePipeline V2 that proves a new image digest on the cluster before
promoting it, and the scheduled watcher that starts it.

Stages (each a separate action, in this order):

``Source``   CodeConnections (``pipeline.connection_arn``/``repository``/``branch``); a push runs
             the pipeline with the digest committed in environment.toml.
``Synth``    ``raytrain-eks lock --digest $IMAGE_DIGEST`` when the run carries one (the watcher's
             runs and manual rollbacks), then ``make test``, ``cdk synth``, ``cdk8s synth``.
``Deploy``   ``cdk deploy`` of the storage and cluster stacks (and what they depend on) from the
             synthesized cloud assembly, through the CDK bootstrap roles.
``Apply``    ``kubectl apply --server-side`` of the manifests, by a build role that holds an EKS
             access entry bound to a namespaced RBAC role (infra/stacks/pipeline_access.py).
``Smoke``    (re)creates the ``smoke`` RayJob with the new image, waits for its result, exports
             where its run record is.
``Promote``  a Lambda that reads the run record and promotes the digest only if the run
             succeeded, on this digest, over the required transport (the transport gate):
             SSM parameter + one DynamoDB history item.

The pipeline variable ``IMAGE_DIGEST`` (default ``spec``) carries the digest. Rollback: run
``raytrain-eks lock --digest sha256:<previous>`` and push, or start the pipeline with
``--variables name=IMAGE_DIGEST,value=sha256:<previous>`` (README, "Rollback").
"""
from __future__ import annotations

from aws_cdk import (
    CfnOutput, Duration, RemovalPolicy, Stack, aws_codebuild as codebuild,
    aws_codepipeline as codepipeline, aws_codepipeline_actions as actions, aws_dynamodb as dynamodb,
    aws_events as events, aws_events_targets as targets, aws_iam as iam,
    aws_s3 as s3, aws_ssm as ssm,
)
from constructs import Construct

from infra.stacks import pipeline_access, pipeline_builds
from infra.stacks.pipeline_watcher import WatcherFunctions
from environment.contract import CODE_PREFIX
from environment import Environment

DIGEST_VARIABLE = "IMAGE_DIGEST"
"""Must equal infra/lambdas/image_watcher/watcher.py DIGEST_VARIABLE (a test checks)."""
DIGEST_FROM_SPEC = "spec"
"""Default of IMAGE_DIGEST: deploy the digest committed in environment.toml."""
# The CDK bootstrap's default qualifier: `cdk deploy` in the Deploy stage assumes its roles.
BOOTSTRAP_QUALIFIER = "hnb659fds"


def required_transport(env: Environment) -> str:
    """What the smoke run must prove: EFA between nodes when the group has EFA and several nodes."""
    group = env.primary_gpu_group
    return "efa" if group.efa_per_node and group.desired_nodes > 1 else "any"


class PipelineStack(Stack):
    """The redeploy pipeline, the watcher, the promoted-digest parameter and the history table.

    Exposes :attr:`pipeline`, :attr:`watcher`, :attr:`promoter`, :attr:`promoted_digest`,
    :attr:`history_table`, :attr:`kubectl_role` and :attr:`pipeline_name`.
    """

    def __init__(self, scope: Construct, construct_id: str, *, env_spec: Environment,
                 cluster_stack, storage_stack, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        env = env_spec
        cluster = cluster_stack.cluster
        name = env.cluster.name
        # Fixed names: the watcher's environment names the pipeline, and the pipeline invokes the
        # promoter, so generated names would form a reference cycle.
        self.pipeline_name = f"{name}-image-redeploy"

        self.history_table = dynamodb.Table(
            self, "PromotionHistory", table_name=f"{name}-image-promotions",
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
            self, "PromotedDigest", parameter_name=f"/raytrain/{name}/image/promoted-digest",
            string_value="none", description=f"Digest of {env.image.repository}:{env.image.tag} "
                                             "last proven by the smoke run (written by the pipeline)")

        image = f"{env.image.repository}:{env.image.tag}"
        # Built from the spec's name like the pod role does: no export pins the stateful stack.
        bucket_arn = f"arn:{self.partition}:s3:::{env.bucket_name}"
        functions = WatcherFunctions(
            self, "Watcher", image_repository=env.image.repository, image_tag=env.image.tag,
            parameter=self.promoted_digest, table=self.history_table,
            pipeline_arn=self.format_arn(service="codepipeline", resource=self.pipeline_name),
            pipeline_name=self.pipeline_name, required_transport=required_transport(env),
            smoke_bucket_arn=bucket_arn,
            smoke_prefix=env.storage.prefix)
        self.watcher, self.promoter = functions.watcher, functions.promoter
        self.schedule = events.Rule(
            self, "WatchSchedule", schedule=events.Schedule.expression(env.pipeline.watch_schedule),
            description=f"Resolve {image} and start {self.pipeline_name} for a new digest",
            targets=[targets.LambdaFunction(self.watcher, retry_attempts=2)])

        artifacts = s3.Bucket(
            self, "Artifacts", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(30),
                                              noncurrent_version_expiration=Duration.days(1))],
            removal_policy=RemovalPolicy.RETAIN)
        pipeline_access.acknowledge_artifact_bucket(artifacts)

        private = env.cluster.endpoint_access == "private"
        vpc_args = pipeline_access.private_endpoint_access(self, cluster) if private else {}
        self.kubectl_role = pipeline_access.KubectlDeployer(
            self, "KubectlDeployer", cluster=cluster, namespace=env.ray.namespace,
            cluster_arn=self.format_arn(service="eks", resource="cluster", resource_name=name),
            bucket_arn=bucket_arn, code_prefix=CODE_PREFIX, runs_prefix=env.storage.prefix).role

        common = {"CLUSTER_NAME": name, "NAMESPACE": env.ray.namespace,
                  "KUBERNETES_VERSION": env.cluster.kubernetes_version}
        synth = pipeline_builds.project(self, "Synth", pipeline_builds.synth_spec(),
                                        compute=codebuild.ComputeType.LARGE)
        deploy = pipeline_builds.project(self, "DeployStacks", pipeline_builds.deploy_spec(
            [storage_stack.stack_name, cluster_stack.stack_name]))
        deploy.add_to_role_policy(iam.PolicyStatement(
            sid="AssumeCdkBootstrapRoles", actions=["sts:AssumeRole"],
            resources=[self.format_arn(service="iam", region="", resource="role",
                                       resource_name=f"cdk-{BOOTSTRAP_QUALIFIER}-{kind}-role-{self.account}-{self.region}")
                       for kind in ("deploy", "file-publishing", "lookup")]))
        apply = pipeline_builds.project(self, "ApplyManifests", pipeline_builds.apply_spec(env.bucket_name),
                                        role=self.kubectl_role, **vpc_args)
        smoke = pipeline_builds.project(self, "SmokeRun", pipeline_builds.smoke_spec(env),
                                        role=self.kubectl_role, timeout=Duration.minutes(
                                            pipeline_builds.SMOKE_TIMEOUT_MINUTES + 15), **vpc_args)

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
                {DIGEST_VARIABLE: digest_variable.reference(), "ENV_FILE": "environment.toml"}))
        smoke_action = actions.CodeBuildAction(
            action_name="SmokeRun", project=smoke, input=built, variables_namespace="Smoke",
            environment_variables=env_vars({
                "EXECUTION_ID": "#{codepipeline.PipelineExecutionId}",
                "IMAGE_DIGEST": synth_action.variable("IMAGE_DIGEST")}))
        self.pipeline = codepipeline.Pipeline(
            self, "Pipeline", pipeline_name=self.pipeline_name,
            pipeline_type=codepipeline.PipelineType.V2, variables=[digest_variable],
            # One run at a time, none dropped: a watcher run must not be superseded by a push.
            execution_mode=codepipeline.ExecutionMode.QUEUED,
            artifact_bucket=artifacts, cross_account_keys=False, restart_execution_on_update=False,
            stages=[
                codepipeline.StageProps(stage_name="Source", actions=[actions.CodeStarConnectionsSourceAction(
                    action_name="Source", connection_arn=env.pipeline.connection_arn, owner=owner,
                    repo=repo, branch=env.pipeline.branch, output=source_output)]),
                codepipeline.StageProps(stage_name="Synth", actions=[synth_action]),
                codepipeline.StageProps(stage_name="Deploy", actions=[actions.CodeBuildAction(
                    action_name="DeployStacks", project=deploy, input=built)]),
                codepipeline.StageProps(stage_name="Apply", actions=[actions.CodeBuildAction(
                    action_name="ApplyManifests", project=apply, input=built,
                    environment_variables=env_vars({}))]),
                codepipeline.StageProps(stage_name="Smoke", actions=[smoke_action]),
                codepipeline.StageProps(stage_name="Promote", actions=[actions.LambdaInvokeAction(
                    action_name="Promote", lambda_=self.promoter, user_parameters={
                        "digest": synth_action.variable("IMAGE_DIGEST"),
                        "smoke_record": smoke_action.variable("SMOKE_RECORD"),
                        "execution_id": "#{codepipeline.PipelineExecutionId}"})]),
            ])
        pipeline_access.acknowledge_pipeline(
            self, artifacts=artifacts, projects=[synth, deploy, apply, smoke], promoter=self.promoter,
            bucket_name=env.bucket_name, code_prefix=CODE_PREFIX, runs_prefix=env.storage.prefix,
            in_vpc=private)

        CfnOutput(self, "PipelineName", value=self.pipeline_name)
        CfnOutput(self, "PromotedDigestParameter", value=self.promoted_digest.parameter_name)
        CfnOutput(self, "PromotionHistoryTable", value=self.history_table.table_name,
                  description=f"List promotions: aws dynamodb query --table-name {name}-image-promotions "
                              f"--no-scan-index-forward --key-condition-expression 'image = :i' "
                              f"--expression-attribute-values '{{\":i\":{{\"S\":\"{image}\"}}}}'")
