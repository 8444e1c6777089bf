"""``check-run``, Synth's first command: should this execution run at all?

- CodePipeline starts an execution by itself when a pipeline is created (trigger type
  ``CreatePipeline``, CodePipeline User Guide, "Start a pipeline in CodePipeline"); there is no
  setting to turn that off. Here it would run a GPU smoke job and redeploy on every first
  ``cdk deploy``. That execution is stopped (abandoned, with the reason); every other trigger
  (a push, the watcher, an operator's ``start-pipeline-execution``) runs.
- The pipeline stack never redeploys itself (infra/stacks/pipeline_builds.py, its fingerprint): when the
  committed spec or code would synthesize a different pipeline (a new image tag to watch, a new
  transport requirement, new buildspecs), the run is refused until the stack is redeployed.
"""
from __future__ import annotations

from typing import Any

CREATION_TRIGGER = "CreatePipeline"


class RunRefused(RuntimeError):
    """This execution must not run; one line."""


def trigger_type(codepipeline: Any, pipeline_name: str, execution_id: str) -> str:
    reply = codepipeline.get_pipeline_execution(pipelineName=pipeline_name, pipelineExecutionId=execution_id)
    return (reply["pipelineExecution"].get("trigger") or {}).get("triggerType", "")


def check_run(*, codepipeline: Any, pipeline_name: str, execution_id: str, deployed: str, committed: str,
              stack_hint: str) -> str:
    """RunRefused unless this execution may run; returns its trigger type."""
    trigger = trigger_type(codepipeline, pipeline_name, execution_id)
    if trigger == CREATION_TRIGGER:
        reason = ("the run CodePipeline starts when the pipeline is created: nothing is deployed until a push, "
                  "the image watcher or start-pipeline-execution")
        codepipeline.stop_pipeline_execution(pipelineName=pipeline_name, pipelineExecutionId=execution_id,
                                             abandon=True, reason=reason[:200])
        raise RunRefused(f"execution {execution_id} stopped: {reason}")
    if deployed != committed:
        raise RunRefused(f"the deployed pipeline stack holds configuration {deployed}, the committed environment.toml "
                         f"and code give {committed} (image tag, transport, schedule, source or buildspecs changed): "
                         f"redeploy it first ({stack_hint}); nothing was run")
    return trigger
