"""Lambda entry points (``image_watcher.handler.watch`` / ``image_watcher.handler.promote``).

Only wiring: environment variables -> boto3 clients -> the logic in watcher.py / promote.py.
"""
from __future__ import annotations

import json
import os

from .history import PromotionHistory
from .promote import CodePipelineJobResults, promote as promote_digest
from .watcher import CodePipelineStarter, WatcherConfig, check


def _client(name: str):
    import boto3  # in the Lambda runtime; imported here so the logic modules stay importable

    return boto3.client(name)


def _history(config: WatcherConfig) -> PromotionHistory:
    return PromotionHistory(client=_client("dynamodb"), table_name=config.table_name, image=config.image)


def watch(event, context):
    """Scheduled by EventBridge (pipeline.watch_schedule)."""
    config = WatcherConfig.from_environ()
    result = check(config, ssm=_client("ssm"), history=_history(config),
                   starter=CodePipelineStarter(_client("codepipeline"), config.pipeline_name))
    print(json.dumps(result))
    return result


def promote(event, context):
    """Invoked by the pipeline's Promote stage."""
    config = WatcherConfig.from_environ()
    item = promote_digest(event, ssm=_client("ssm"), s3=_client("s3"), parameter_name=config.parameter_name,
                          history=_history(config), results=CodePipelineJobResults(_client("codepipeline")),
                          required_transport=os.environ.get("REQUIRED_TRANSPORT", "efa"))
    print(json.dumps({"promoted": item}))
    return item
