"""Prometheus: every rank's figures as gauges through Ray's metrics agent
(training/prometheus.py: TrainingGauges; a no-op outside Ray)."""
from __future__ import annotations

from typing import Any, Iterable

from training import contract, prometheus


class GaugeSink:
    """Train rows set the step gauges, eval rows the held-out loss; the summary sets nothing.
    No ``close``: the gauges keep re-setting their last values until the worker exits, so a
    scrape after the last step still finds them."""

    def __init__(self, gauges: prometheus.TrainingGauges):
        self.gauges = gauges

    def write(self, row: dict[str, Any]) -> None:
        if row.get(contract.KIND) == contract.KIND_TRAIN:
            self.gauges.set(prometheus.step_values(row))
        elif row.get(contract.KIND) == contract.KIND_EVAL:
            self.gauges.evaluation(row)

    def checkpoints(self, timings: Iterable[Any]) -> None:
        self.gauges.checkpoints(timings)


def open_sink(job: Any, ctx: Any) -> GaugeSink:
    """This rank's gauges, labelled run, job, rank and node."""
    return GaugeSink(prometheus.for_worker(in_ray=ctx.in_ray, run=job.run_name, job=job.name, rank=ctx.rank))
