"""The stateful stack: the checkpoint bucket, on its own so that the cluster can be destroyed
and recreated without touching checkpoints (every bucket and bucket policy here is RETAIN).

After a ``cdk destroy`` the retained bucket keeps its name and its policy; deploying again with
``storage.existing_bucket = true`` adopts it by name instead of failing on "already exists",
and puts its protections back (infra/constructs/checkpoint_bucket.py)."""
from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from infra.constructs.checkpoint_bucket import AdoptedCheckpointBucket, CheckpointBucket


class StorageStack(Stack):
    """Exposes :attr:`bucket` (named ``bucket_name``, so the manifests can name it too) and
    :attr:`access_logs_bucket` (for an adopted bucket: the new one its logging now goes to)."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str, storage_uri: str,
                 noncurrent_version_days: int, existing_bucket: bool = False, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        if existing_bucket:
            checkpoints = AdoptedCheckpointBucket(self, "Checkpoints", bucket_name=bucket_name)
        else:
            checkpoints = CheckpointBucket(
                self, "Checkpoints", bucket_name=bucket_name, noncurrent_version_days=noncurrent_version_days)
        self.bucket = checkpoints.bucket
        self.access_logs_bucket = checkpoints.access_logs
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name,
                  description="Checkpoint bucket (Ray Train storage_path is s3://<this>/<prefix>)")
        CfnOutput(self, "StorageUri", value=storage_uri, description="Ray Train storage_path of every run")
