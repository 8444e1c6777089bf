"""The checkpoint bucket: encrypted, TLS only, private, versioned, access-logged, retained."""
from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, aws_s3 as s3
from constructs import Construct

from infra.nag import acknowledge


class CheckpointBucket(Construct):
    """A retained S3 bucket for Ray Train checkpoints plus the bucket its access logs go to.

    Both buckets survive ``cdk destroy`` (RETAIN): checkpoints outlive clusters, and the access
    log is the audit trail of who read or wrote them.
    """

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str,
                 noncurrent_version_days: int) -> None:
        super().__init__(scope, construct_id)
        # Log delivery through a bucket policy instead of the legacy LogDeliveryWrite ACL, so
        # both buckets can keep ACLs disabled (BucketOwnerEnforced). Set here, before any
        # child exists, so it holds whatever app builds this construct.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        common = dict(
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.access_logs = s3.Bucket(
            self, "AccessLogs",
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(365))],
            **common)
        acknowledge(
            self.access_logs, "AwsSolutions-S1",
            "This bucket IS the access-log destination of the checkpoint bucket; logging "
            "it into itself would loop and into a third bucket adds nothing.")
        self.bucket = s3.Bucket(
            self, "Bucket",
            bucket_name=bucket_name,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="checkpoint-bucket/",
            lifecycle_rules=[
                # A killed upload of a multi-GB checkpoint leaves parts that cost money forever.
                s3.LifecycleRule(id="abort-incomplete-multipart-uploads",
                                 abort_incomplete_multipart_upload_after=Duration.days(1)),
                s3.LifecycleRule(id="expire-noncurrent-versions",
                                 noncurrent_version_expiration=Duration.days(noncurrent_version_days)),
            ],
            **common)
