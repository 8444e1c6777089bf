"""The gate before the long-lived cluster changes: the smoke record's own checks (succeeded,
every pod ran this digest, the required transport: the promoter's very function) and the
regression gate against the newest COMPARABLE promoted smoke run of ANOTHER digest (a re-proof
of the promoted digest is not its own bar, so the bar cannot ratchet): same world size,
instance type and job config (:func:`comparable`). With none (before the first promotion, a
changed job or cluster, or a baseline whose objects are gone) the gate says so, names why, and
judges the record checks only (a baseline that exists but cannot be read fails the gate).
Every file is read at the S3 version the Smoke step pinned when the smoke run ended; a newer
version of the candidate's evidence fails the gate (:func:`untouched`: only that run's own
identity could write there). The regression checks:

- the same inter-node transport class (an EFA run must not turn into a socket run);
- tokens/s at least ``pipeline.min_tokens_per_s_fraction`` of the promoted run's;
- held-out loss after training at most ``pipeline.max_eval_loss_increase`` above it.

With a baseline, the side-by-side report (``raytrain-eks report BASELINE CANDIDATE``) is written
into the bucket next to the runs, ``<storage>/<smoke run>/regression/``: on a block it says
what moved.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from environment.contract import RECORD_EVIDENCE, REGRESSION_REPORT_DIR as REPORT_DIR
from infra.lambdas.image_watcher.history import FAILURE_IMAGE
from infra.lambdas.image_watcher.promote import PromotionError, RecordMissing, check_smoke_record, split_record_uri
from raytrain_eks.runs.report import Run, eval_before_after, load_run, render_report, throughput_summary
from training.contract import METRICS_NAME, RECORD_NAME, TOKENS_PER_S

from . import StepContext, split_s3
from .kube import log

RUN_FILES = (RECORD_NAME, METRICS_NAME)


class GateFailed(RuntimeError):
    """The candidate must not be promoted; one line (the rollback reason). The image's verdict."""

    failure = FAILURE_IMAGE


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def compare(candidate: Run, baseline: Run, *, min_tokens_fraction: float, max_loss_increase: float) -> list[Check]:
    """The three regression checks, on the figures the report shows (its own functions); a
    figure the candidate lacks fails its check, one the promoted run lacks is not compared."""
    transport = lambda run: (run.record.get("transport") or {}).get("transport", "unknown")  # noqa: E731
    checks = [Check("transport", transport(candidate) == transport(baseline),
                    f"{transport(candidate)} (promoted run: {transport(baseline)})")]
    new, old = (throughput_summary(r).get(TOKENS_PER_S) for r in (candidate, baseline))
    if old is None:
        checks.append(Check("tokens_per_s", True, "promoted run has no tokens/s: not compared"))
    else:
        checks.append(Check("tokens_per_s", new is not None and new >= min_tokens_fraction * old,
                            f"{new:.4g} vs {old:.4g} (at least {min_tokens_fraction:g} x required)"
                            if new is not None else f"none vs {old:.4g}"))
    new, old = (eval_before_after(r)[1] for r in (candidate, baseline))
    if old is None:
        checks.append(Check("eval_loss_after", True, "promoted run has no held-out loss: not compared"))
    else:
        checks.append(Check("eval_loss_after", new is not None and new <= old + max_loss_increase,
                            f"{new:.4g} vs {old:.4g} (at most +{max_loss_increase:g} allowed)"
                            if new is not None else f"none vs {old:.4g}"))
    return checks


def comparable(candidate: dict, baseline: dict) -> str:
    """Why two smoke records cannot be compared ("" when they can)."""
    def facts(record: dict) -> dict:
        cluster = record.get("cluster") or {}
        return {"world size": cluster.get("world_size"), "instance type": cluster.get("instance_type"),
                "job config": (record.get("job_config_hash") or {}).get("ran")}
    new, old = facts(candidate), facts(baseline)
    return "; ".join(f"{k} {new[k]} vs {old[k]}" for k in new if new[k] != old[k])


def baseline_record(ctx: StepContext, candidate: dict, digest: str) -> tuple[str, str]:
    """``(uri, "")`` of the newest comparable promoted run of another digest, or ``("", why not)``."""
    skipped = []
    for promotion in ctx.history.promotions():
        uri = promotion.get("smoke_record", "")
        if not uri or promotion["digest"] == digest:
            continue
        try:
            record = ctx.read_json(uri)
        except RecordMissing as err:
            # Gone (expired, deleted): compare against the next one. A baseline that exists but
            # cannot be read (403) raises: the gate fails rather than pass unjudged.
            skipped.append(f"{uri}: {err}")
            continue
        why = comparable(candidate, record)
        if not why:
            return uri, ""
        skipped.append(f"{uri}: not comparable ({why})")
    return "", "; ".join(skipped[:3]) or "no promoted run of another digest yet"


def untouched(ctx: StepContext, record_uri: str, record: dict) -> None:
    """GateFailed when the smoke run's evidence changed after Smoke pinned it: the newest
    version of run.json must be the one Smoke wrote (``record_uri``'s), and each file's newest
    version the one Smoke recorded (``evidence_versions``). Only the smoke run's own identity
    could write there: a newer version is tampering (or a job that outlived its run)."""
    bucket, key, version = split_record_uri(record_uri)
    prefix = key.rsplit("/", 1)[0]
    expected = {**(record.get(RECORD_EVIDENCE) or {}), **({RECORD_NAME: version} if version else {})}
    for name, pinned in sorted(expected.items()):
        try:
            newest = ctx.s3.head_object(Bucket=bucket, Key=f"{prefix}/{name}").get("VersionId")
        except Exception as err:  # noqa: BLE001 - deleted or unreadable evidence is not the evidence judged
            raise GateFailed(f"smoke evidence {prefix}/{name} cannot be read now ({type(err).__name__}): "
                             "it changed after the smoke run ended") from None
        if newest != pinned:
            raise GateFailed(f"smoke evidence s3://{bucket}/{prefix}/{name} was written after the smoke run "
                             f"ended (version {newest}, the smoke step pinned {pinned}): not judged")


def download_run(ctx: StepContext, record_uri: str, into: Path, record: dict | None = None) -> Path:
    """run.json and metrics.jsonl of a run into ``into/<run name>/``, each at the version the
    smoke step pinned (``record``'s ``evidence_versions``; a record from before the pins: the
    metrics as they are)."""
    bucket, key, version = split_record_uri(record_uri)
    prefix = key.rsplit("/", 1)[0]
    local = into / prefix.rsplit("/", 1)[-1]
    local.mkdir(parents=True)
    pinned = {**((record or {}).get(RECORD_EVIDENCE) or {}), **({RECORD_NAME: version} if version else {})}
    for name in RUN_FILES:
        # the record at the version judged (the one the smoke step wrote), the metrics as pinned
        extra = {"VersionId": pinned[name]} if name in pinned else None
        try:
            ctx.s3.download_file(bucket, f"{prefix}/{name}", str(local / name), ExtraArgs=extra)
        except Exception as err:  # noqa: BLE001 - a run without metrics still gets compared and reported
            log(f"gate: {name} of {record_uri} not read ({type(err).__name__})")
    return local


def upload_report(ctx: StepContext, report_dir: Path, candidate_uri: str) -> str:
    bucket, key = split_s3(candidate_uri)
    prefix = f"{key.rsplit('/', 1)[0]}/{REPORT_DIR}"
    for path in sorted(p for p in report_dir.rglob("*") if p.is_file()):
        ctx.s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(report_dir)}")
    return f"s3://{bucket}/{prefix}/report.md"


def gate(ctx: StepContext, *, digest: str, candidate_uri: str, required_transport: str) -> list[Check]:
    """GateFailed unless the candidate may replace the promoted digest."""
    candidate = ctx.read_json(candidate_uri)
    untouched(ctx, candidate_uri, candidate)
    try:
        check_smoke_record(candidate, digest=digest, required_transport=required_transport, uri=candidate_uri)
    except PromotionError as err:
        raise GateFailed(str(err)) from None
    baseline_uri, why_none = baseline_record(ctx, candidate, digest)
    if not baseline_uri:
        log(f"gate: regression: not comparable, no baseline ({why_none}); record checks only")
        return [Check("regression", True, f"not comparable: {why_none}")]
    p = ctx.env.pipeline
    with tempfile.TemporaryDirectory(prefix="raytrain-gate-") as tmp:
        dirs = [download_run(ctx, uri, Path(tmp) / side, ctx.read_json(uri))
                for side, uri in (("promoted", baseline_uri), ("candidate", candidate_uri))]
        old, new = (load_run(str(d)) for d in dirs)
        checks = compare(new, old, min_tokens_fraction=p.min_tokens_per_s_fraction,
                         max_loss_increase=p.max_eval_loss_increase)
        render_report([str(d) for d in dirs], Path(tmp) / "report")
        report = upload_report(ctx, Path(tmp) / "report", candidate_uri)
    for check in checks:
        log(f"gate: {check.name}: {'ok' if check.ok else 'REGRESSION'}: {check.detail}")
    failed = [c for c in checks if not c.ok]
    if failed:
        raise GateFailed(f"regression against the promoted run {baseline_uri}: "
                         + "; ".join(f"{c.name} {c.detail}" for c in failed) + f" (report: {report})")
    return checks
