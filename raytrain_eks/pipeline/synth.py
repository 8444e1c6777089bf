"""Synth's two decisions before anything is built: should this execution run at all
(``check-run``), and which digest does it deploy (``choose-digest``).

``check-run``:

- CodePipeline starts an execution by itself when a pipeline is created (trigger type
  ``CreatePipeline``, CodePipeline User Guide, "Start a pipeline in CodePipeline"); there is no
  setting to turn that off. Here it would run a GPU smoke job and redeploy on every first
  ``cdk deploy``. That execution is stopped (abandoned, with the reason); every other trigger
  (a push, the watcher, an operator's ``start-pipeline-execution``) runs.
- The pipeline stack never redeploys itself (infra/stacks/pipeline_builds.py, its fingerprint): when the
  committed spec or code would synthesize a different pipeline (a new image tag to watch, a new
  transport requirement, new buildspecs), the run is refused until the stack is redeployed.

``choose-digest``: ONE source of truth, the promoted digest (SSM). A push carries no digest
(``IMAGE_DIGEST=spec``). Deploying the digest committed in environment.toml would silently undo
every automatic promotion since the last commit, so a push deploys the PROMOTED digest. The committed one wins only when it is new to the pipeline (an
operator locked a digest the pipeline never saw: it is proven by smoke before promotion) or
before the first promotion. Going back to an older digest takes an explicit run with
``IMAGE_DIGEST=sha256:<previous>`` (the rollback command, README).
"""
from __future__ import annotations

from dataclasses import dataclass
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


FROM_SPEC = "spec"
"""The pipeline variable's default: no explicit digest (a push)."""


class DigestError(ValueError):
    """No digest can be deployed; one line."""


@dataclass(frozen=True, slots=True)
class Choice:
    digest: str
    reason: str


def choose(*, requested: str, committed: str, promoted: str, known_to_pipeline: bool) -> Choice:
    """The digest to deploy (pure). ``known_to_pipeline``: the history holds ``committed``."""
    if requested and requested != FROM_SPEC:
        return Choice(requested, "explicit IMAGE_DIGEST of this run (watcher or rollback)")
    if not promoted:
        if not committed:
            raise DigestError("image.digest is empty and nothing was promoted yet: run "
                              "raytrain-eks lock and commit, or start the pipeline with IMAGE_DIGEST")
        return Choice(committed, "committed in environment.toml (nothing promoted yet)")
    if committed in ("", promoted):
        return Choice(promoted, "the promoted digest")
    if known_to_pipeline:
        return Choice(promoted, f"the promoted digest: environment.toml's {committed} was already handled "
                                "by the pipeline, so deploying it would be a silent rollback (roll back "
                                f"explicitly with IMAGE_DIGEST={committed})")
    return Choice(committed, "committed in environment.toml and new to the pipeline")
