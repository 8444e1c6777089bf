"""The watcher's decision: should the pipeline run for the digest the tag points to now?

``decide`` is the whole policy (pure); ``check`` wires it to the registry, SSM, the history
table and the pipeline. A digest is started at most ONCE: a digest whose run failed, or that an
operator rolled back from, is not retried every few hours (an operator re-runs it by hand:
``aws codepipeline start-pipeline-execution --name PIPELINE --variables name=IMAGE_DIGEST,value=sha256:...``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from environment.contract import DIGEST_PATTERN

from .registry import ImageLocation, platform_problem, resolve_digest

from .history import TRIGGERED, PromotionHistory

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
    def start(self, digest: str) -> str:
        """Start one execution with IMAGE_DIGEST=digest; return its execution id."""


@dataclass(frozen=True, slots=True)
class CodePipelineStarter:
    """Starts the real pipeline (moto's CodePipeline speaks the same API in the tests)."""

    client: Any
    pipeline_name: str

    def start(self, digest: str) -> str:
        reply = self.client.start_pipeline_execution(
            name=self.pipeline_name, variables=[{"name": DIGEST_VARIABLE, "value": digest}],
            # Same digest, same token: a retried Lambda invocation does not start a second run.
            clientRequestToken=digest.replace(":", "-"))
        return reply["pipelineExecutionId"]


def decide(*, current: str, promoted: str, already_triggered: bool) -> str:
    """``start`` only for a digest that is neither promoted nor tried before."""
    if current == promoted:
        return UP_TO_DATE
    if already_triggered:
        return ALREADY_TRIED
    return START


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
    action = decide(current=current, promoted=promoted,
                    # any event counts: a digest rolled back (automatically or by an explicit
                    # run) is not rolled forward again behind the operator's back
                    already_triggered=current != promoted and history.knows(current))
    result = {"image": config.image, "current": current, "promoted": promoted or "(none)", "action": action}
    problem = platform(location, current) if action == START else ""
    if problem:
        result["action"], result["reason"] = REJECTED, problem
        history.record(event=REJECTED, digest=current, execution_id="none", reason=problem[:1000])
    elif action == START:
        result["execution_id"] = starter.start(current)
        history.record(event=TRIGGERED, digest=current, execution_id=result["execution_id"])
    return result
