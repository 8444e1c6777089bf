"""Lambda entry point (``image_watcher.handler.watch``).

Only wiring: environment variables -> boto3 clients -> the logic in watcher.py.
"""
from __future__ import annotations

import json

from .history import PromotionHistory
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
