"""The stateful stack: the checkpoint bucket, on its own so that the cluster can be destroyed
and recreated without touching checkpoints (every bucket and bucket policy here is RETAIN).

The bucket is encrypted, TLS only, private, versioned, access-logged and retained. After a
``cdk destroy`` the retained bucket keeps its name and its policy; deploying again with
``storage.existing_bucket = true`` adopts it by name instead of failing on "already exists",
and puts its protections back (:class:`AdoptedCheckpointBucket`)."""
from __future__ import annotations

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack, aws_iam as iam, aws_logs as logs, aws_s3 as s3, \
    custom_resources as cr
from constructs import Construct

from infra.nag import MANAGED, acknowledge
from environment.contract import CODE_PREFIX, INPUTS_PREFIX

ACCESS_LOG_PREFIX = "checkpoint-bucket/"
_COMMON = dict(
    encryption=s3.BucketEncryption.S3_MANAGED,
    enforce_ssl=True,
    block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
    object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
    removal_policy=RemovalPolicy.RETAIN,
)


def _access_log_bucket(scope: Construct) -> s3.Bucket:
    bucket = s3.Bucket(
        scope, "AccessLogs",
        lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(365))],
        **_COMMON)
    acknowledge(bucket, "AwsSolutions-S1",
                "This bucket IS the access-log destination of the checkpoint bucket; logging "
                "it into itself would loop and into a third bucket adds nothing.")
    return bucket


def retain_policy(bucket: s3.IBucket) -> None:
    """Keep a retained bucket's policy with it: without this, ``cdk destroy`` (or a redeploy
    that adopts the bucket) deletes the AWS::S3::BucketPolicy, and the kept bucket loses its
    TLS-only deny and its log-delivery grant (DeletionPolicy defaults to Delete)."""
    bucket.policy.apply_removal_policy(RemovalPolicy.RETAIN)


class CheckpointBucket(Construct):
    """A retained S3 bucket for Ray Train checkpoints plus the bucket its access logs go to.

    Both buckets and both policies survive ``cdk destroy`` (RETAIN): checkpoints outlive
    clusters, and the access log is the audit trail of who read or wrote them.
    """

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str,
                 noncurrent_version_days: int, write_once_keys: tuple[str, ...] = ()) -> None:
        super().__init__(scope, construct_id)
        # Log delivery through a bucket policy instead of the legacy LogDeliveryWrite ACL, so
        # both buckets can keep ACLs disabled (BucketOwnerEnforced). Set before any child exists.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        self.access_logs = _access_log_bucket(self)
        self.bucket = s3.Bucket(
            self, "Bucket",
            bucket_name=bucket_name,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix=ACCESS_LOG_PREFIX,
            lifecycle_rules=[
                # A killed upload of a multi-GB checkpoint leaves parts that cost money forever.
                s3.LifecycleRule(id="abort-incomplete-multipart-uploads",
                                 abort_incomplete_multipart_upload_after=Duration.days(1)),
                s3.LifecycleRule(id="expire-noncurrent-versions",
                                 noncurrent_version_expiration=Duration.days(noncurrent_version_days)),
            ],
            **_COMMON)
        if write_once_keys:
            # Code archives and uploaded inputs are named by their content's hash, which anyone who
            # submits can compute, and pods run them without hashing again: a put there must carry
            # If-None-Match: * (condition key s3:if-none-match, Amazon S3 User Guide "Enforce
            # conditional writes on Amazon S3 buckets"), so a key, once written, is never replaced,
            # by anyone. A negated operator holds when the key is absent: no header, Deny. Only
            # on the requests that create the object (s3:ObjectCreationOperation: PutObject,
            # CompleteMultipartUpload), as that guide's multipart example has it: CreateMultipartUpload
            # and UploadPart are s3:PutObject too but take no condition header. The uploader
            # (raytrain_eks/runs/results.py, put_once) sends it on the put or the completion.
            self.bucket.add_to_resource_policy(iam.PolicyStatement(
                sid="WriteOnceCodeAndInputs", effect=iam.Effect.DENY, actions=["s3:PutObject"],
                principals=[iam.AnyPrincipal()],
                resources=[self.bucket.arn_for_objects(p) for p in write_once_keys],
                conditions={"StringNotEquals": {"s3:if-none-match": "*"},
                            "Bool": {"s3:ObjectCreationOperation": "true"}}))
        retain_policy(self.bucket)
        retain_policy(self.access_logs)


class AdoptedCheckpointBucket(Construct):
    """The bucket a previous deploy retained, adopted by name (``storage.existing_bucket``):
    a new retained access-log bucket with its delivery grant, and the adopted bucket's logging
    pointed at it (S3 PutBucketLogging, a custom resource: CloudFormation has no resource for
    one bucket property of a bucket it does not own). No bucket policy: the retained one (with
    its TLS-only deny) is still on the bucket, and S3 holds one policy per bucket, so creating
    another fails with "Bucket Policy Already Exists" (tests/update_oracle.py); `raytrain-eks
    verify` checks the kept policy still denies non-TLS access. The retained access-log bucket of
    the old deploy keeps what it holds; its generated name is not derivable."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket.from_bucket_name(self, "Bucket", bucket_name)
        self.access_logs = _access_log_bucket(self)
        # The grant CDK writes for a bucket it creates (aws-s3 bucket.ts, allowLogDelivery).
        self.access_logs.add_to_resource_policy(iam.PolicyStatement(
            actions=["s3:PutObject"], principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")],
            resources=[self.access_logs.arn_for_objects(f"{ACCESS_LOG_PREFIX}*")],
            conditions={"ArnLike": {"aws:SourceArn": self.bucket.bucket_arn},
                        "StringEquals": {"aws:SourceAccount": Stack.of(self).account}}))
        retain_policy(self.access_logs)
        call = cr.AwsSdkCall(
            service="S3", action="putBucketLogging",
            parameters={"Bucket": bucket_name, "BucketLoggingStatus": {"LoggingEnabled": {
                "TargetBucket": self.access_logs.bucket_name, "TargetPrefix": ACCESS_LOG_PREFIX}}},
            physical_resource_id=cr.PhysicalResourceId.of(f"{bucket_name}-access-logging"))
        # No on_delete: a destroy leaves the logging (and the log bucket, retained) as it is.
        self.logging = cr.AwsCustomResource(
            self, "Logging", on_create=call, on_update=call, install_latest_aws_sdk=False,
            # Its function's log group is the stack's, with a retention (Lambda's own has none).
            log_group=logs.LogGroup(self, "LoggingLogs", retention=logs.RetentionDays.ONE_MONTH,
                                    removal_policy=RemovalPolicy.DESTROY),
            policy=cr.AwsCustomResourcePolicy.from_statements([iam.PolicyStatement(
                actions=["s3:PutBucketLogging"], resources=[self.bucket.bucket_arn])]))
        self.logging.node.add_dependency(self.access_logs.policy)
        # The function is a singleton at the stack's root (aws-cdk-lib custom-resources).
        singleton = Stack.of(self).node.find_child("AWS679f53fac002430cb0da5b7982bd2287")
        acknowledge(singleton, MANAGED.format("service-role/AWSLambdaBasicExecutionRole"),
                    "aws-cdk-lib's AwsCustomResource function writes its own CloudWatch logs with it; "
                    "its one call is scoped to s3:PutBucketLogging on the adopted bucket.")


class StorageStack(Stack):
    """Exposes :attr:`bucket` (named ``bucket_name``, so the manifests can name it too) and
    :attr:`access_logs_bucket` (for an adopted bucket: the new one its logging now goes to)."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str, storage_uri: str,
                 noncurrent_version_days: int, existing_bucket: bool = False, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        if existing_bucket:
            checkpoints = AdoptedCheckpointBucket(self, "Checkpoints", bucket_name=bucket_name)
        else:
            prefix = storage_uri.removeprefix("s3://").partition("/")[2].strip("/")
            checkpoints = CheckpointBucket(
                self, "Checkpoints", bucket_name=bucket_name, noncurrent_version_days=noncurrent_version_days,
                # <hash>/<name> under the inputs: <run>.json beside them is rewritten at each resume
                write_once_keys=(f"{CODE_PREFIX}/*", "/".join(filter(None, (prefix, INPUTS_PREFIX, "*/*")))))
        self.bucket = checkpoints.bucket
        self.access_logs_bucket = checkpoints.access_logs
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name,
                  description="Checkpoint bucket (Ray Train storage_path is s3://<this>/<prefix>)")
        CfnOutput(self, "StorageUri", value=storage_uri, description="Ray Train storage_path of every run")
