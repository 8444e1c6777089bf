"""Synth's two decisions (raytrain_eks/pipeline/synth.py).

``check-run``: the execution CodePipeline starts when a pipeline is created is stopped
(CodePipeline User Guide, "Start a pipeline in CodePipeline": "When a pipeline is created, a
pipeline execution starts automatically", trigger type ``CreatePipeline``, API
``ExecutionTrigger.triggerType``), and a pipeline stack deployed from another configuration
refuses to run. moto's CodePipeline reports no trigger, so a stub answers those two calls.

``choose-digest``: the promoted digest is the one source of truth; only an explicit digest or one
new to the pipeline overrides it."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from environment import environment_from_dict
from infra.stacks.pipeline_builds import fingerprint
from raytrain_eks.pipeline.synth import DigestError, RunRefused, check_run, choose

REPO = Path(__file__).resolve().parents[3]


class Pipeline:
    def __init__(self, trigger: str):
        self.trigger, self.stopped = trigger, []

    def get_pipeline_execution(self, *, pipelineName, pipelineExecutionId):
        return {"pipelineExecution": {"pipelineExecutionId": pipelineExecutionId,
                                      "trigger": {"triggerType": self.trigger}}}

    def stop_pipeline_execution(self, **kwargs):
        self.stopped.append(kwargs)


def check(client, deployed="f", committed="f"):
    return check_run(codepipeline=client, pipeline_name="p", execution_id="e-1", deployed=deployed,
                     committed=committed, stack_hint="cdk deploy raytrain-pipeline")


def test_the_creation_run_is_stopped_and_nothing_else_runs():
    client = Pipeline("CreatePipeline")
    with pytest.raises(RunRefused, match="execution e-1 stopped: the run CodePipeline starts when the pipeline"):
        check(client)
    [stop] = client.stopped
    assert stop["abandon"] is True and stop["pipelineExecutionId"] == "e-1" and len(stop["reason"]) <= 200


@pytest.mark.parametrize("trigger", ["StartPipelineExecution", "WebhookV2", "CloudWatchEvent"])
def test_pushes_the_watcher_and_operators_run(trigger):
    client = Pipeline(trigger)
    assert check(client) == trigger and client.stopped == []


def test_a_stale_pipeline_stack_refuses_with_what_to_redeploy():
    with pytest.raises(RunRefused, match=r"redeploy it first \(cdk deploy raytrain-pipeline\)"):
        check(Pipeline("WebhookV2"), deployed="old", committed="new")


def test_the_fingerprint_moves_with_what_the_stack_bakes_in_and_nothing_else():
    raw = tomllib.loads((REPO / "environment.toml").read_text())
    base = fingerprint(environment_from_dict(raw))
    raw["image"]["digest"] = "sha256:" + "c" * 64  # Synth pins this every run: not baked in
    assert fingerprint(environment_from_dict(raw)) == base
    raw["image"]["tag"] = "train-ml-cuda-v1.2.0"  # the watcher would watch the old tag
    assert fingerprint(environment_from_dict(raw)) != base


A, B, C = ("sha256:" + c * 64 for c in "abc")


@pytest.mark.parametrize("requested, committed, promoted, known, expected", [
    (C, A, B, True, C),          # the watcher's or an operator's explicit digest wins
    (A, B, B, True, A),          # an explicit rollback to an older digest
    ("spec", A, "", False, A),   # nothing promoted yet: the committed digest
    ("spec", "", B, False, B),   # nothing committed: the promoted one
    ("spec", A, B, True, B),     # a push with a stale commit never rolls back silently
    ("spec", C, B, False, C),    # an operator locked a digest the pipeline never saw
])
def test_choice(requested, committed, promoted, known, expected):
    assert choose(requested=requested, committed=committed, promoted=promoted,
                  known_to_pipeline=known).digest == expected


def test_nothing_to_deploy_is_one_line():
    with pytest.raises(DigestError, match="image.digest is empty and nothing was promoted yet"):
        choose(requested="spec", committed="", promoted="", known_to_pipeline=False)
