"""The watcher's decision: should the pipeline run for the digest the tag points to now?

``decide`` is the whole policy (pure); ``check`` wires it to the registry, SSM, the history
table and the pipeline; ``watch`` is the Lambda entry point (``image_watcher.watcher.watch``),
only wiring: environment variables -> boto3 clients -> ``check``.

A digest is shelved (never started again by the watcher) once it was promoted, rejected, or
failed for a reason that is the image's (a ``rolled-back`` item with ``failure: image``, or one
without a ``failure``: recorded before failures were classified); an operator re-runs it by hand:
``aws codepipeline start-pipeline-execution --name PIPELINE --variables name=IMAGE_DIGEST,value=sha256:...``.
A digest whose executions failed for other reasons (infrastructure: no GPUs before the smoke
job's deadline, API errors, a build killed by its timeout, a refused Synth; or an Apply deferred
because a job was running) is started again once its last execution has ended, up to
``pipeline.max_attempts`` executions; a deferred one only inside ``pipeline.maintenance_window``
when one is declared. A failed execution that recorded nothing itself (a build killed by its
CodeBuild timeout) is recorded as ``ended`` (infrastructure) on the next tick.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import datetime

from environment.contract import DIGEST_PATTERN
from environment.rules import parse_window

from .registry import ImageLocation, platform_problem, resolve_digest

from .history import (
    ENDED as ENDED_EVENT, FAILURE_DEFERRED, FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, PROMOTED, ROLLED_BACK,
    TRIGGERED, PromotionHistory,
)

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
    max_attempts: int = 3
    """``pipeline.max_attempts``: executions per digest while its failures are not the image's."""
    maintenance_window: str = ""
    """``pipeline.maintenance_window``: a deferred digest is started again only inside it."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "WatcherConfig":
        return cls(repository=environ["IMAGE_REPOSITORY"], tag=environ["IMAGE_TAG"],
                   registry_url=environ.get("REGISTRY_URL", ""),
                   parameter_name=environ["PROMOTED_DIGEST_PARAMETER"],
                   table_name=environ["HISTORY_TABLE"], pipeline_name=environ["PIPELINE_NAME"],
                   max_attempts=int(environ.get("MAX_ATTEMPTS", 3)),
                   maintenance_window=environ.get("MAINTENANCE_WINDOW", ""))

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
    failed for reasons that were not the image's and ended (``retryable``)."""
    if current == promoted:
        return UP_TO_DATE
    if already_triggered and not retryable:
        return ALREADY_TRIED
    return START


def failures(events: list[dict[str, str]]) -> list[dict[str, str]]:
    """The failure items (``rolled-back``, ``ended``) among ``events``, newest first."""
    return [e for e in events if e["event"] in (ROLLED_BACK, ENDED_EVENT)]


def shelved(events: list[dict[str, str]]) -> str:
    """Why the watcher must not start this digest again ("" when it may): it was promoted or
    rejected, or a failure was the image's."""
    for e in events:
        if e["event"] in (PROMOTED, REJECTED):
            return f"{e['event']} by execution {e['execution_id']}"
        if e["event"] == ROLLED_BACK and e.get("failure", FAILURE_IMAGE) == FAILURE_IMAGE:
            return f"image failure in execution {e['execution_id']}: {e.get('reason', '')[:200]}"
    return ""


def retry_attempt(events: list[dict[str, str]], status: str, config: WatcherConfig,
                  now: datetime.datetime) -> tuple[int, str]:
    """``(attempt, "")``: the attempt number a new start of this digest would be (its ``events``,
    newest first; ``status``: its newest execution's), or ``(0, why not)``."""
    if why := shelved(events):
        return 0, why
    tries = sum(e["event"] == TRIGGERED for e in events)
    if status and status not in ENDED:
        # running (or Succeeded: it reached Promote, whatever moved the promoted digest since)
        return 0, f"its execution is {status}"
    if tries >= config.max_attempts:
        return 0, f"{tries} executions started (pipeline.max_attempts = {config.max_attempts})"
    last = failures(events)[:1]
    window = parse_window(config.maintenance_window)
    if last and last[0].get("failure") == FAILURE_DEFERRED and window and not window.is_open(now):
        return 0, (f"deferred to the maintenance window {config.maintenance_window!r} "
                   f"(opens {window.next_opening(now):%a %H:%M} UTC)")
    return tries + 1, ""


def record_unreported_end(history: PromotionHistory, events: list[dict[str, str]], digest: str,
                          status: str) -> dict[str, str] | None:
    """An ``ended`` item for the newest execution when it failed and none of its steps recorded
    why (a build killed by its CodeBuild timeout records nothing; nor does a refused Synth)."""
    newest = next((e for e in events if e["event"] == TRIGGERED), None)
    if newest is None or status not in ENDED:
        return None
    execution = newest["execution_id"]
    if any(e["execution_id"] == execution for e in failures(events)):
        return None
    return history.record(event=ENDED_EVENT, digest=digest, execution_id=execution, failure=FAILURE_INFRASTRUCTURE,
                          reason=f"execution {execution} ended {status} with no failure recorded by its steps "
                                 "(a build killed by its CodeBuild timeout, or a failure before Smoke)")


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
          platform: Callable[[ImageLocation, str], str] = platform_problem,
          now: datetime.datetime | None = None) -> dict[str, str]:
    """One watch: resolve, compare, maybe start. Returns what happened (logged by :func:`watch`).

    A registry failure raises RegistryError: the invocation fails and shows in the Lambda's
    Errors metric rather than passing silently.
    """
    location = ImageLocation.from_repository(config.repository, config.tag, config.registry_url)
    current = resolve(location)
    promoted = read_promoted(ssm, config.parameter_name)
    events = [e for e in history.events() if e["digest"] == current] if current != promoted else []
    attempt, why = 1, ""
    if events and (why := shelved(events)):
        attempt = 0
    elif events:
        newest = next((e for e in events if e["event"] == TRIGGERED), None)
        status = starter.status(newest["execution_id"]) if newest else ""
        if ended := record_unreported_end(history, events, current, status):
            events.insert(0, ended)
        attempt, why = retry_attempt(events, status, config, now or datetime.datetime.now(datetime.timezone.utc))
    action = decide(current=current, promoted=promoted, already_triggered=bool(events), retryable=attempt > 0)
    result = {"image": config.image, "current": current, "promoted": promoted or "(none)", "action": action}
    if action == ALREADY_TRIED and why:
        result["why"] = why
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


# --- The Lambda entry point -------------------------------------------------------------------

def _client(name: str):
    import boto3  # in the Lambda runtime; imported here so the logic stays importable without it

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
