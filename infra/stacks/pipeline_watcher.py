"""The watcher Lambda of the redeploy pipeline (code in infra/lambdas/image_watcher/) with a
least-privilege role: it may touch exactly the parameter, table and pipeline it needs. (Promotion
is a CodeBuild step, raytrain_eks/pipeline/apply_promote.py: a failure after Apply must roll the
cluster back, which needs kubectl.)

The asset holds ``image_watcher/`` (with the registry client the ``lock`` command also uses) and
the repository packages it imports (``environment`` for the digest format, and what that imports),
found by following the imports at synth time (infra/lambda_asset.py): no copy lives in the repository.
"""
from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stage, aws_dynamodb as dynamodb, aws_iam as iam
from aws_cdk import aws_lambda as lambda_, aws_logs as logs, aws_ssm as ssm
from constructs import Construct

from infra.lambda_asset import stage_function
from infra.lambdas.image_watcher.registry import REQUEST_TIMEOUT_S

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME = lambda_.Runtime.PYTHON_3_14
"""The newest Lambda Python (cdk-nag L1); the code is valid on 3.11+."""


FUNCTION_DIR = REPO_ROOT / "infra" / "lambdas" / "image_watcher"
WATCH_HANDLER = "image_watcher.handler.watch"
"""The function the runtime calls; the asset carries every repository package its module imports."""


def stage_asset(into: Path) -> Path:
    """The watcher's asset folder under ``into``: ``image_watcher/`` and the repository packages it imports."""
    return stage_function(FUNCTION_DIR, [WATCH_HANDLER.rpartition(".")[0]], into)


# A watch makes at most 7 registry requests one after another (resolve_digest: HEAD, token, HEAD,
# GET; platform_problem: GET, token, GET), each bounded by REQUEST_TIMEOUT_S, then a few AWS calls:
# a slow registry must end in the watcher's own RegistryError, not in Lambda's "Task timed out".
WATCH_TIMEOUT_S = int(7 * REQUEST_TIMEOUT_S) + 60


class WatcherFunctions(Construct):
    """Exposes :attr:`watcher` (scheduled)."""

    def __init__(self, scope: Construct, construct_id: str, *, image_repository: str, image_tag: str,
                 parameter: ssm.StringParameter, table: dynamodb.Table, pipeline_arn: str,
                 pipeline_name: str, max_attempts: int, maintenance_window: str) -> None:
        super().__init__(scope, construct_id)
        code = lambda_.Code.from_asset(str(stage_asset(Path(Stage.of(self).outdir) / ".lambda-assets")))
        environment = {
            "IMAGE_REPOSITORY": image_repository, "IMAGE_TAG": image_tag,
            "PROMOTED_DIGEST_PARAMETER": parameter.parameter_name, "HISTORY_TABLE": table.table_name,
            "PIPELINE_NAME": pipeline_name, "MAX_ATTEMPTS": str(max_attempts),
            "MAINTENANCE_WINDOW": maintenance_window,
        }
        self.watcher = self._function("ImageWatcher", WATCH_HANDLER, code, environment,
                                      "Resolve the image tag; start the pipeline for a new digest", [
            iam.PolicyStatement(sid="ReadPromotedDigest", actions=["ssm:GetParameter"],
                                resources=[parameter.parameter_arn]),
            iam.PolicyStatement(sid="ReadHistory", actions=["dynamodb:Query"], resources=[table.table_arn]),
            # triggered / rejected / ended items, in the image's partition only (never the promoted digest's)
            iam.PolicyStatement(sid="RecordHistory", actions=["dynamodb:PutItem"], resources=[table.table_arn],
                                conditions={"ForAllValues:StringEquals": {
                                    "dynamodb:LeadingKeys": [f"{image_repository}:{image_tag}"]}}),
            # GetPipelineExecution: whether a digest's last run ended before Smoke (a retry)
            iam.PolicyStatement(sid="StartPipeline", actions=["codepipeline:StartPipelineExecution",
                                                              "codepipeline:GetPipelineExecution"],
                                resources=[pipeline_arn]),
        ])

    def _function(self, construct_id: str, handler: str, code: lambda_.Code, environment: dict,
                  description: str, statements: list[iam.PolicyStatement]) -> lambda_.Function:
        log_group = logs.LogGroup(self, f"{construct_id}Logs", retention=logs.RetentionDays.THREE_MONTHS,
                                  removal_policy=RemovalPolicy.DESTROY)
        # Our own role instead of AWSLambdaBasicExecutionRole: logs to this one group only.
        role = iam.Role(self, f"{construct_id}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=description)
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteOwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[log_group.log_group_arn]))
        for statement in statements:
            role.add_to_policy(statement)
        return lambda_.Function(
            self, construct_id, runtime=RUNTIME, handler=handler, code=code, role=role,
            environment=environment, description=description, log_group=log_group,
            # A retried or overlapping watch cannot start a digest twice: the start call carries
            # the digest as its idempotency token (watcher.py).
            architecture=lambda_.Architecture.ARM_64, memory_size=256, timeout=Duration.seconds(WATCH_TIMEOUT_S))
