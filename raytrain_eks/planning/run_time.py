"""A run's time and cost from its predicted step: the step, MFU, run time and cost as ranges (slow
end first, each saying where it comes from), the run's minutes term by term (steps, evaluations,
checkpoints, export, the GPU nodes' start), and whether they fit the RayJob's deadline.

The preflight (raytrain_eks/planning/preflight.py) prices every GPU job with it. The step comes from
the step model (step_model.py) where the plan was measured and its micro batch traced, from the
measured plan (measured_plan.py) at the ends of the published rates, else from the hand model at a
stated MFU; each rate below says whether it is measured or assumed.
"""
from __future__ import annotations

from training.config import JobConfig


def measured_time(hand: dict, measured: dict, job: JobConfig) -> dict:
    """The time and cost figures with the measured plan's predicted step in place of the hand
    model's (the same run overheads and prices); ``hand_step_s`` keeps the hand model's."""
    p = measured["prediction"]
    step_s = p["step_s"]
    hours = job.train.max_steps * step_s / 3600
    return {**hand, "source": "measured", "hand_step_s": hand["step_s"], "step_s": step_s,
            "compute_s": p["compute_s"], "exposed_network_s": p["exposed_comm_s"], "effective_mfu": p["mfu"],
            "bound": "network" if p["exposed_comm_s"] > p["compute_s"] else "compute",
            "tokens_per_hour": job.tokens_per_step / step_s * 3600, "run_hours": hours,
            "run_usd": (hours + hand["overhead_h"]) * hand["hourly_usd"]}


SLOW_MFU_FRACTION = 0.6
"""Where no step model covers a plan (no measured plan, or none with a traced micro batch), the
hand model's range runs from the stated MFU (fast end) down to this fraction of it (slow end):
ASSUMED; the step model's ranges of the shipped plans span about 0.7 of their fast end."""


def prediction_range(job: JobConfig, hand: dict, *, measured: dict | None, written, measured_bound: str) -> dict:
    """The step, MFU, run time and cost as ranges, slow end first, and where they come from: the
    step model's range where the plan was measured and its micro batch traced; else the measured
    plan's prediction at the ends of the published rates; else the hand model between the stated
    MFU and :data:`SLOW_MFU_FRACTION` of it (assumed). ``range_bound``: what limits the slow end.
    ``written``: the plan search's price of the job's own plan (plan_search.py ``Option``) or None;
    ``measured_bound``: the bound the measured plan's estimate names."""
    from raytrain_eks.planning.plan_search import dominant

    # the search's price of the job's own plan: the step model with LoRA's trained parameters
    # and offload's host terms; else the measured plan's range
    rng = (written.prediction if written is not None and written.prediction else None) or (measured or {}).get("range")
    if rng:
        (fast, slow), (mfu_slow, mfu_fast) = rng["step_s"], rng["mfu"]
        source, bound = "step model (raytrain_eks/planning/step_model.py)", dominant(rng, job.parallel.strategy, job.num_nodes)
    elif measured:
        fast, slow = measured["range_s"]
        point = measured["prediction"]
        mfu_fast, mfu_slow = point["mfu"] * point["step_s"] / fast, point["mfu"] * point["step_s"] / slow
        source, bound = "the measured plan at the ends of the published rates", measured_bound
    else:
        fast, slow = hand["step_s"], hand["compute_s"] / SLOW_MFU_FRACTION + hand["exposed_network_s"]
        mfu_fast, mfu_slow = hand["effective_mfu"], hand["effective_mfu"] * fast / slow
        source, bound = (f"the hand model at MFU {hand['mfu']:.2f}-{hand['mfu'] * SLOW_MFU_FRACTION:.2f} (ASSUMED)",
                         hand["bound"])
    hours = [job.train.max_steps * s / 3600 for s in (slow, fast)]
    return {"step_range": (slow, fast), "mfu_range": (mfu_slow, mfu_fast), "range_source": source,
            "range_bound": bound, "run_hours_range": tuple(hours),
            "run_usd_range": tuple((h + hand["overhead_h"]) * hand["hourly_usd"] for h in hours),
            "tokens_per_hour_range": tuple(job.tokens_per_step / s * 3600 for s in (slow, fast))}


def slow_step_s(estimate: dict, measured: dict | None) -> float:
    """The SLOW end of a plan's predicted step: the prediction's range (:func:`prediction_range`,
    in ``estimate``), the step model's range (a measured trace), the measured plan's range over the
    published rates, else the estimate's one figure; the slowest of those the plan has."""
    ends = [estimate.get("step_s") or 0.0, (estimate.get("step_range") or (0.0,))[0]]
    if measured:
        ends.append(measured.get("range_s", [0.0, 0.0])[1])
        if measured.get("range"):
            ends.append(measured["range"]["step_s"][1])
    return max(ends)


CHECKPOINT_BYTES_PER_S = 1e9
"""ASSUMED: one checkpoint's stall and write, per GPU's shard (its bf16 weights and fp32 AdamW
state), at 1 GB/s (device-to-host staging and local disk; the upload to S3 runs behind later
steps)."""
EXPORT_BYTES_PER_S = 100e6
"""ASSUMED: the export's gather, safetensors write and upload of the whole model (bf16) at 100 MB/s."""
EVAL_FORWARD_SHARE = 1 / 3
"""An evaluation batch is a forward pass: a third of a training micro batch's forward + backward
(the same 3x the FLOPs model uses)."""


def run_minutes(job: JobConfig, step_s: float, params: int) -> dict[str, float]:
    """The run's minutes, term by term, at ``step_s`` a step: the steps, the evaluations (before,
    every ``eval.every_n_steps`` and after), the checkpoints (every ``checkpoint.every_n_steps``, every
    ``checkpoint.every_minutes`` and the final one), the export and the GPU nodes' start."""
    from environment.addons import SCALE_UP_MINUTES

    steps = job.train.max_steps * step_s / 60
    evals = 2 + (job.train.max_steps // job.eval.every_n_steps if job.eval.every_n_steps else 0)
    eval_s = step_s * EVAL_FORWARD_SHARE * min(job.eval.max_batches, job.grad_accum_steps) / max(job.grad_accum_steps, 1)
    k = job.checkpoint
    saves = 1 + (job.train.max_steps // k.every_n_steps if k.every_n_steps else 0)
    if k.every_minutes:
        saves += int(steps // k.every_minutes)
    save_s = params * 14 / max(job.parallel.num_workers, 1) / CHECKPOINT_BYTES_PER_S  # bf16 weights + fp32 AdamW
    export_s = params * 2 / EXPORT_BYTES_PER_S if k.export_hf else 0.0
    return {"steps": steps, "evaluations": evals * eval_s / 60, "checkpoints": saves * save_s / 60,
            "export": export_s / 60, "start": SCALE_UP_MINUTES}


def deadline(job: JobConfig, step_s: float, params: int) -> tuple[bool, str]:
    """The run at the SLOW end of its predicted step, plus its evaluations, checkpoints, export
    and the nodes' start, against ``rayjob.active_deadline_minutes`` less the final checkpoint's
    stop wait. KubeRay never retries a RayJob that hit its deadline (v1.7.0
    ``rayjob_controller.go`` ``checkBackoffLimitAndUpdateStatusIfNeeded``: DeadlineExceeded is
    exempt from ``backoffLimit``): a run that does not fit ends without its final evaluation and
    export, every time. The fix is named: fewer steps, a longer deadline, or a chain of runs."""
    from training.contract import run_time_limit_seconds

    terms = run_minutes(job, step_s, params)
    total = sum(terms.values())
    limit = run_time_limit_seconds(job.rayjob.active_deadline_minutes, job.checkpoint.sigterm_grace_seconds) / 60
    parts = ", ".join(f"{name} {value:.0f}" for name, value in terms.items())
    fits_steps = _most_steps(job, step_s, params, limit)
    if total <= limit:
        return True, (
            f"{total:.0f} min at the slow end ({step_s:.2f} s/step; {parts} min; checkpoint and export rates ASSUMED) "
            f"fits rayjob.active_deadline_minutes = {job.rayjob.active_deadline_minutes} ({limit:.0f} min after the stop wait)")
    need = int(-(-(total * 60 + (job.rayjob.active_deadline_minutes * 60 - limit * 60)) // 60))
    return False, (
        f"the run takes {total:.0f} min at the slow end of its predicted step ({step_s:.2f} s/step; {parts} min; "
        f"checkpoint and export rates ASSUMED) but rayjob.active_deadline_minutes = {job.rayjob.active_deadline_minutes} "
        f"ends it at {limit:.0f} min, without its final evaluation and export (KubeRay never retries a deadline): "
        f"set train.max_steps <= {fits_steps}, or rayjob.active_deadline_minutes >= {need}, or run it as a chain "
        f"of resumed runs (submit --resume RUN with a higher train.max_steps)")


def _most_steps(job: JobConfig, step_s: float, params: int, limit: float) -> int:
    """The most ``train.max_steps`` whose run (:func:`run_minutes`) fits ``limit`` minutes."""
    from dataclasses import replace

    def fits(steps: int) -> bool:
        return sum(run_minutes(replace(job, train=replace(job.train, max_steps=steps)), step_s, params).values()) <= limit

    low, high = 0, job.train.max_steps
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
