"""The watcher's decision: should the pipeline run for the digest the tag points to now?

``decide`` is the whole policy (pure); ``check`` wires it to the registry, SSM, the history
table and the pipeline. A digest whose run reached Smoke (it has any history event besides
``triggered``: applied, promoted, rolled back, rejected) is not retried every few hours, nor one
that an operator rolled back from (an operator re-runs it by hand:
``aws codepipeline start-pipeline-execution --name PIPELINE --variables name=IMAGE_DIGEST,value=sha256:...``).
A digest whose executions never got that far (Synth refused it: a stale pipeline stack, an
install failure) is started again once its last execution has ended, up to ``MAX_ATTEMPTS``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from environment.contract import DIGEST_PATTERN

from .registry import ImageLocation, platform_problem, resolve_digest

from .history import TRIGGERED, PromotionHistory

MAX_ATTEMPTS = 3
"""Executions the watcher starts for one digest that never reaches Smoke."""
ENDED = ("Failed", "Stopped", "Cancelled", "Superseded")
"""CodePipeline execution statuses of a run that ended without succeeding (GetPipelineExecution
``pipelineExecution.status``: Cancelled | InProgress | Stopped | Stopping | Succeeded |
Superseded | Failed, https://docs.aws.amazon.com/codepipeline/latest/APIReference/API_PipelineExecution.html)."""
DIGEST_VARIABLE = "IMAGE_DIGEST"
"""The pipeline variable (CodePipeline V2) that carries the digest to deploy."""
UP_TO_DATE = "up-to-date"
ALREADY_TRIED = "already-tried"
START = "start"
REJECTED = "rejected"
"""Also the history event: a new digest the GPU nodes cannot run (no linux/amd64 in its index);
recorded, so it is not looked at again, and never started."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WatcherConfig:
    """What the watcher watches and where it writes; the Lambda's environment variables."""

    repository: str
    """``registry/name`` as in environment.toml's [image]."""
    tag: str
    registry_url: str = ""
    """Override of the registry base URL (tests); empty = https:// + the repository's host."""
    parameter_name: str
    """SSM parameter holding the promoted digest."""
    table_name: str
    """DynamoDB promotion history."""
    pipeline_name: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "WatcherConfig":
        return cls(repository=environ["IMAGE_REPOSITORY"], tag=environ["IMAGE_TAG"],
                   registry_url=environ.get("REGISTRY_URL", ""),
                   parameter_name=environ["PROMOTED_DIGEST_PARAMETER"],
                   table_name=environ["HISTORY_TABLE"], pipeline_name=environ["PIPELINE_NAME"])

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"


class PipelineStarter(Protocol):
    def start(self, digest: str, attempt: int = 1) -> str:
        """Start one execution with IMAGE_DIGEST=digest; return its execution id."""

    def status(self, execution_id: str) -> str:
        """The execution's status (CodePipeline's words)."""


@dataclass(frozen=True, slots=True)
class CodePipelineStarter:
    """Starts the real pipeline (moto's CodePipeline speaks the same API in the tests)."""

    client: Any
    pipeline_name: str

    def start(self, digest: str, attempt: int = 1) -> str:
        token = digest.replace(":", "-") + (f"-{attempt}" if attempt > 1 else "")
        reply = self.client.start_pipeline_execution(
            name=self.pipeline_name, variables=[{"name": DIGEST_VARIABLE, "value": digest}],
            # Same digest and attempt, same token: a retried Lambda invocation does not start a second run.
            clientRequestToken=token)
        return reply["pipelineExecutionId"]

    def status(self, execution_id: str) -> str:
        return self.client.get_pipeline_execution(pipelineName=self.pipeline_name,
                                                  pipelineExecutionId=execution_id)["pipelineExecution"]["status"]


def decide(*, current: str, promoted: str, already_triggered: bool, retryable: bool = False) -> str:
    """``start`` only for a digest that is neither promoted nor tried before, or whose tries
    never reached Smoke and ended (``retryable``)."""
    if current == promoted:
        return UP_TO_DATE
    if already_triggered and not retryable:
        return ALREADY_TRIED
    return START


def retry_attempt(events: list[dict[str, str]], starter: "PipelineStarter") -> int:
    """The attempt number a new start of this digest would be (its ``events``, newest first), or
    0 when it must not be retried: it reached Smoke (any event but ``triggered``), its last
    execution has not ended, or it was started ``MAX_ATTEMPTS`` times."""
    if not events or any(e["event"] != TRIGGERED for e in events) or len(events) >= MAX_ATTEMPTS:
        return 0
    return len(events) + 1 if starter.status(events[0]["execution_id"]) in ENDED else 0


def read_promoted(ssm: Any, parameter_name: str) -> str:
    """The promoted digest, or "" before the first promotion (the stack creates the parameter
    with a placeholder that is not a digest)."""
    try:
        value = ssm.get_parameter(Name=parameter_name)["Parameter"]["Value"]
    except ssm.exceptions.ParameterNotFound:
        return ""
    return value if DIGEST_PATTERN.fullmatch(value) else ""


def check(config: WatcherConfig, *, ssm: Any, history: PromotionHistory, starter: PipelineStarter,
          resolve: Callable[[ImageLocation], str] = resolve_digest,
          platform: Callable[[ImageLocation, str], str] = platform_problem) -> dict[str, str]:
    """One watch: resolve, compare, maybe start. Returns what happened (logged by the handler).

    A registry failure raises RegistryError: the invocation fails and shows in the Lambda's
    Errors metric rather than passing silently.
    """
    location = ImageLocation.from_repository(config.repository, config.tag, config.registry_url)
    current = resolve(location)
    promoted = read_promoted(ssm, config.parameter_name)
    events = [e for e in history.events() if e["digest"] == current] if current != promoted else []
    # any event past Synth counts: a digest rolled back (automatically or by an explicit run)
    # is not rolled forward again behind the operator's back
    attempt = retry_attempt(events, starter) if events else 1
    action = decide(current=current, promoted=promoted, already_triggered=bool(events), retryable=attempt > 1)
    result = {"image": config.image, "current": current, "promoted": promoted or "(none)", "action": action}
    problem = platform(location, current) if action == START else ""
    if problem:
        result["action"], result["reason"] = REJECTED, problem
        history.record(event=REJECTED, digest=current, execution_id="none", reason=problem[:1000])
    elif action == START:
        result["execution_id"] = starter.start(current, attempt)
        if attempt > 1:
            result["attempt"] = str(attempt)
        history.record(event=TRIGGERED, digest=current, execution_id=result["execution_id"])
    return result
