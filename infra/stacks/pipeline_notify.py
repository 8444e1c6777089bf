"""Failures of the image pipeline reach a person: one SNS topic (``pipeline.notify_emails``
subscribe to it by e-mail) fed by

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

from aws_cdk import Duration, Stack, aws_cloudwatch as cloudwatch, aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_events as events, aws_events_targets as targets, aws_lambda as lambda_
from aws_cdk import aws_sns as sns, aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.nag import acknowledge

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
