"""The stateful stack: the checkpoint bucket, on its own so that the cluster can be destroyed
and recreated without touching checkpoints (every resource here is RETAIN)."""
from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from infra.constructs.checkpoint_bucket import CheckpointBucket
from environment import Environment


class StorageStack(Stack):
    """Exposes :attr:`bucket` (named ``env.bucket_name``, so the manifests can name it too)."""

    def __init__(self, scope: Construct, construct_id: str, *, env_spec: Environment, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        checkpoints = CheckpointBucket(
            self, "Checkpoints", bucket_name=env_spec.bucket_name,
            noncurrent_version_days=env_spec.storage.noncurrent_version_days)
        self.bucket = checkpoints.bucket
        self.access_logs_bucket = checkpoints.access_logs
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name,
                  description="Checkpoint bucket (Ray Train storage_path is s3://<this>/<prefix>)")
        CfnOutput(self, "StorageUri", value=env_spec.storage_uri,
                  description="Ray Train storage_path of every run")
