"""Every Lambda function a stack creates, its own or one a CDK construct adds (the kubectl
provider's handler and its framework function, AwsCustomResource's singleton), writes to a log
group the stack owns, with a retention: left to Lambda, ``/aws/lambda/<name>`` is created on
the first invocation with no retention and outlives ``cdk destroy``."""
from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack, Token, aws_lambda, aws_logs as logs


def own_function_logs(stack: Stack, retention_days: int) -> None:
    """Give each function of ``stack`` that has no log group of its own a stack-owned one
    (Lambda's ``LoggingConfig.LogGroup``) kept ``retention_days`` and deleted with the stack."""
    for construct in stack.node.find_all():
        if not isinstance(construct, aws_lambda.CfnFunction):
            continue
        config = construct.logging_config
        if config is not None and not Token.is_unresolved(config) and getattr(config, "log_group", None):
            continue  # already chosen by its owner
        group = logs.CfnLogGroup(construct.node.scope, f"{construct.node.id}LogGroup",
                                 retention_in_days=retention_days)
        group.apply_removal_policy(RemovalPolicy.DESTROY)
        construct.add_property_override("LoggingConfig.LogGroup", group.ref)
