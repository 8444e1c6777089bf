"""The verdict of a run: did it execute, and did the model meet the criteria declared before it?

Standard library only: the job writes the verdict into run.json when the record is finished, and
the operator CLI (report, runs, exit codes) reads it with this very code.

Three verdicts (:data:`VERDICTS`):

``execution-failed``  the run did not complete, or the place it ran was not the one required; the
                      failing stage is named (:data:`STAGES`): ``data`` (corpus, tokenizer),
                      ``transport`` (NCCL/EFA), ``storage`` (S3, checkpoints, export),
                      ``infrastructure`` (workers lost, devices, signals), ``training`` (the
                      loop itself, e.g. a NaN) or ``stopped`` (a local run stopped on purpose:
                      no fault, and nothing to resume);
``rejected``          the run completed but missed a criterion of the job config's ``[accept]``
                      section (each criterion is named with the required and the measured value);
``accepted``          the run completed and met every declared criterion (none declared: accepted
                      on completion alone, and the verdict says so).

``accept.transport`` is judged as execution, not as the model: a run that trained over the wrong
network is an infrastructure fault. ``evidence.require_transport`` stops such a run within its
first collective; ``accept.transport`` judges the finished one.

Exit codes (``python -m training`` and ``raytrain-eks report``): :data:`EXIT_CODES`; 2 stays
"refused input" (also data the job found unreadable: its verdict is execution-failed, stage data),
143 "stopped by SIGTERM, resumable" (the job's own).
"""
from __future__ import annotations

from typing import Any

from training import contract, incidents

ACCEPTED, REJECTED, EXECUTION_FAILED = "accepted", "rejected", "execution-failed"
VERDICTS = (ACCEPTED, REJECTED, EXECUTION_FAILED)
STAGES = (contract.STAGE_DATA, "transport", "storage", "infrastructure", "training", contract.STAGE_STOPPED)
EXIT_CODES = {ACCEPTED: 0, EXECUTION_FAILED: 1, REJECTED: 3}
EXIT_NO_VERDICT = 4
"""A record without a verdict (still running, or written before verdicts existed)."""

# Exception type names (anywhere in the error text or the cause chain) -> stage. Matched in
# order: the first stage whose name appears wins, so a DataError wrapped by Ray's
# WorkerGroupError is a data failure, not an infrastructure one.
_STAGE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("DataError", "TokenizerError", "ModelConfigError")),
    ("transport", ("TransportError", "require_transport")),
    ("storage", ("ExistingRunError", "CheckpointError", "ArrowIOError", "NoSuchBucket", "AccessDenied",
                 "AWS Error", "export:", "s3://")),
    ("infrastructure", ("ActorDiedError", "RayActorError", "WorkerGroupError", "OutOfMemoryError", "NCCL",
                        "CUDA", "no CUDA device", "GetTimeoutError", "RaySystemError", "NodeDiedError",
                        "stopped by SIGTERM")),
)


def failure_stage(error: str) -> str:
    """The stage an error text points to (:data:`STAGES`); ``training`` when nothing else fits."""
    for stage, markers in _STAGE_MARKERS:
        if any(marker in error for marker in markers):
            return stage
    return "training"


def describe_exception(err: BaseException) -> str:
    """``Type: first line`` of an exception and of its causes, joined (what :func:`failure_stage`
    reads: the cause chain names the real failure behind a wrapper)."""
    parts, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        parts.append(f"{type(err).__name__}: {first}")
        err = err.__cause__ or err.__context__
    return " <- ".join(parts)


def failure_of_summary(summary: dict[str, Any]) -> dict[str, Any] | None:
    """run.json ``failure`` of a worker run that ENDED (not raised) failed: refused by the
    transport gate, or trained but not exported (the loop's summary row says which)."""
    if summary.get(contract.REFUSED):
        reason = summary[contract.REFUSED]
        return {contract.FAILURE_STAGE: failure_stage(reason), "error": reason}
    if summary.get(contract.EXPORT_ERROR):
        return {contract.FAILURE_STAGE: "storage", "error": f"export: {summary[contract.EXPORT_ERROR]}"}
    return None


def outcome(summary: dict[str, Any]) -> tuple[str, str | None, int]:
    """``(status, error, exit code)`` of a worker run that returned, from its summary row. A
    refusal (e.g. the transport gate) ends the workers normally, so Ray does not retry it."""
    if summary.get(contract.REFUSED):
        return "failed", summary[contract.REFUSED], 1
    if summary.get(contract.EXPORT_ERROR):
        return "failed", f"export: {summary[contract.EXPORT_ERROR]}", 1
    if summary.get("stopped_by_signal"):
        return "stopped", None, 143
    return "succeeded", None, 0


def _criterion(name: str, required: Any, measured: Any, met: bool) -> dict[str, Any]:
    return {"criterion": name, "required": required, "measured": measured, "met": bool(met)}


def _eval_loss(figures: Any) -> float | None:
    value = figures.get("eval_loss") if isinstance(figures, dict) else None
    return value if isinstance(value, (int, float)) else None


def criteria_results(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each declared model criterion of ``job_config.accept`` against the record's figures.

    A criterion whose figure is missing is not met (measured ``None``): a verdict never assumes."""
    accept = (record.get("job_config") or {}).get("accept") or {}
    evals = record.get("eval") or {}
    before, after = _eval_loss(evals.get("before")), _eval_loss(evals.get("after"))
    results = []
    if accept.get("eval_loss_after_max"):
        limit = accept["eval_loss_after_max"]
        results.append(_criterion("eval_loss_after_max", limit, after, after is not None and after <= limit))
    if accept.get("improvement_min"):
        least = accept["improvement_min"]
        gain = round(before - after, 6) if before is not None and after is not None else None
        results.append(_criterion("improvement_min", least, gain, gain is not None and gain >= least))
    if accept.get("exact_match_min"):
        least = accept["exact_match_min"]
        measured = (evals.get("after") or {}).get("exact_match")
        results.append(_criterion("exact_match_min", least, measured,
                                  isinstance(measured, (int, float)) and measured >= least))
    if accept.get("rewards_accuracy_min"):
        least = accept["rewards_accuracy_min"]
        measured = (evals.get("after") or {}).get("eval_rewards_accuracy")
        results.append(_criterion("rewards_accuracy_min", least, measured,
                                  isinstance(measured, (int, float)) and measured >= least))
    scores = ((record.get("benchmarks") or {}).get("after") or {}).get("tasks") or {}
    for key, least in sorted((accept.get("benchmarks") or {}).items()):
        task, _, metric = key.rpartition(".")
        measured = (scores.get(task) or {}).get(metric)
        results.append(_criterion(f"benchmarks.{key}", least, measured,
                                  isinstance(measured, (int, float)) and measured >= least))
    if accept.get("tokens_per_s_min"):
        least = accept["tokens_per_s_min"]
        measured = (record.get("throughput") or {}).get("tokens_per_s")
        results.append(_criterion("tokens_per_s_min", least, measured,
                                  isinstance(measured, (int, float)) and measured >= least))
    return results


def judge(record: dict[str, Any]) -> dict[str, Any] | None:
    """The verdict of a finished record (None while it is ``running``). A run that healed
    itself says so: the incidents (training/incidents.py) are counted in the verdict and named
    in its reason, whatever the verdict."""
    judged = _judge(record)
    found = incidents.of_record(record)
    if judged is not None and found:
        judged["incidents"] = len(found)
        judged["reason"] = f"{judged['reason']}; after {incidents.summary(found)}"
    return judged


def _judge(record: dict[str, Any]) -> dict[str, Any] | None:
    status = record.get("status")
    if status in (None, "running"):
        return None
    accept = (record.get("job_config") or {}).get("accept") or {}
    if status != "succeeded":
        failure = record.get(contract.FAILURE) or {}
        error = failure.get("error") or record.get("error") or ""
        if status == "stopped" and record.get(contract.STORAGE_LIVES_FOR_ONE_SUBMIT):
            # a local run: only a stop (or its submit ending) sends SIGTERM, and its storage is gone
            return {"verdict": EXECUTION_FAILED, "stage": contract.STAGE_STOPPED,
                    "reason": error or ("stopped before max_steps (raytrain-eks stop, or its submit ended); a local "
                                        "run cannot resume: its storage lived for its submit only")}
        if status == "stopped":
            error = error or "stopped by SIGTERM before max_steps (resumable from its last checkpoint)"
        stage = failure.get(contract.FAILURE_STAGE) or failure_stage(error if status != "stopped" else "stopped by SIGTERM")
        return {"verdict": EXECUTION_FAILED, "stage": stage, "reason": error or f"status {status}"}
    wanted = accept.get("transport") or "any"
    seen = (record.get("transport") or {}).get("transport", "unknown")
    if wanted != "any" and seen != wanted:
        return {"verdict": EXECUTION_FAILED, "stage": "transport",
                "reason": f"accept.transport = {wanted!r} but the run's transport was {seen!r}",
                "criteria": [_criterion("transport", wanted, seen, False)]}
    results = criteria_results(record)
    if wanted != "any":
        results.insert(0, _criterion("transport", wanted, seen, True))
    missed = [r for r in results if not r["met"]]
    if missed:
        first = missed[0]
        return {"verdict": REJECTED, "criterion": first["criterion"], "criteria": results,
                "reason": f"{first['criterion']}: required {first['required']}, measured {first['measured']}"}
    reason = "met every criterion" if results else "completed; no [accept] criteria declared"
    return {"verdict": ACCEPTED, "criteria": results, "reason": reason}


def exit_code(verdict: dict[str, Any] | None) -> int:
    """The process exit code of a verdict (:data:`EXIT_CODES`, :data:`EXIT_NO_VERDICT`)."""
    return EXIT_CODES.get((verdict or {}).get("verdict"), EXIT_NO_VERDICT)


def headline(verdict: dict[str, Any] | None) -> str:
    """One line: ``ACCEPTED: ...``, ``REJECTED (criterion): ...``, ``EXECUTION-FAILED (stage): ...``."""
    if not verdict:
        return "NO VERDICT: the run has not finished (or its record predates verdicts)"
    name = verdict["verdict"].upper()
    where = verdict.get("stage") or verdict.get("criterion")
    return f"{name}{f' ({where})' if where else ''}: {verdict.get('reason', '')}"


def of_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """The record's verdict; for a finished record written before verdicts, judged now by the
    same rules (its ``[accept]`` is absent, so completion alone decides)."""
    return record.get("verdict") or judge(record)
