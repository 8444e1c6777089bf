"""The ``prometheus`` sink: the job's figures as Prometheus gauges, through Ray's own metrics API
(``ray.util.metrics``).

Every rank sets its gauges after each step and each evaluation. Ray's metrics agent on each node
serves them with Ray's own metrics at ``http://<node>:<metrics-export-port>/metrics`` (8080 in
KubeRay pods), so a Prometheus that scrapes the Ray pods sees the run while it trains. Setting a
gauge only records the value in this process (Ray pushes to the agent every few seconds): the
loop never waits on the network for it.

One series per metric and rank, labelled run, job, rank and node (:data:`contract.METRIC_LABELS`);
never a step label, which would make a new series every step. Outside Ray (tests, benchmarks,
plain processes) :func:`for_worker` gives gauges that record nothing.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Any, Iterable, Mapping

from training import contract

REPORT_INTERVAL_ENV = "RAY_metrics_report_interval_ms"
"""Ray's setting: how often a worker hands its metrics to the node's agent (default 10000)."""


def refresh_interval(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between two re-sets of every gauge: half of Ray's report interval.

    Ray's exporter serves a gauge only for the report interval in which it was set: measured
    with Ray 2.58, a gauge set once left the node's /metrics one or two intervals later while
    its worker was still alive. Setting every last value again twice per interval keeps each
    series continuous through slow steps, evaluations and checkpoints, until the worker exits."""
    environ = os.environ if environ is None else environ
    try:
        interval_ms = float(environ.get(REPORT_INTERVAL_ENV, "10000"))
    except ValueError:
        interval_ms = 10000.0
    return max(0.1, interval_ms / 2000)


def step_values(entry: Mapping[str, Any]) -> dict[str, float | None]:
    """The gauge values of one ``metrics.jsonl`` train row (None: nothing to export)."""
    compute_s = entry.get(contract.COMPUTE_S)
    per_device = entry.get(contract.TOKENS_PER_S_PER_DEVICE)
    compute_rate = None
    if compute_s and per_device is not None:
        # per-device tokens of the step / compute seconds = wall-clock rate x step time / compute time
        compute_rate = per_device * entry[contract.STEP_TIME_S] / compute_s
    memory = entry.get(contract.PEAK_MEMORY_GIB)
    return {
        contract.METRIC_STEP: entry[contract.STEP],
        contract.METRIC_LOSS: entry.get(contract.LOSS),
        contract.METRIC_LR: entry.get(contract.LR),
        contract.METRIC_GRAD_NORM: entry.get(contract.GRAD_NORM),
        contract.METRIC_TOKENS_PER_S: per_device,
        contract.METRIC_COMPUTE_TOKENS_PER_S: compute_rate,
        contract.METRIC_TFLOPS: entry.get(contract.TFLOPS_PER_DEVICE),
        contract.METRIC_MFU: entry.get(contract.MFU),
        contract.METRIC_STEP_TIME: entry.get(contract.STEP_TIME_S),
        contract.METRIC_COMPUTE_TIME: compute_s,
        contract.METRIC_PEAK_MEMORY: None if memory is None else memory * 2**30,
    }


class TrainingGauges:
    """This rank's gauges; ``tags`` None = record nothing (not inside Ray). ``refresh_s``: how
    often a daemon thread sets every gauge again with its last value (0: never)."""

    def __init__(self, tags: Mapping[str, str] | None, refresh_s: float = 0.0):
        self._gauges: dict[str, Any] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpoints_seen = 0
        if tags is None:
            return
        from ray.util.metrics import Gauge

        keys = contract.METRIC_LABELS
        self._gauges = {name: Gauge(name, description=text, tag_keys=keys).set_default_tags(dict(tags))
                        for name, text in contract.PROMETHEUS_METRICS.items()}
        if refresh_s:
            threading.Thread(target=self._refresh, args=(refresh_s,), name="raytrain-gauges", daemon=True).start()

    @property
    def enabled(self) -> bool:
        return bool(self._gauges)

    def set(self, values: Mapping[str, float | None]) -> None:
        with self._lock:
            for name, value in values.items():
                if value is not None and name in self._gauges:
                    self._last[name] = float(value)
                    self._gauges[name].set(self._last[name])

    def _refresh(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with self._lock:
                for name, value in self._last.items():
                    self._gauges[name].set(value)

    def close(self) -> None:
        """Stop re-setting (the values then leave the endpoint within an interval or two)."""
        self._stop.set()

    def step(self, entry: Mapping[str, Any], checkpoints: Iterable[Any] = ()) -> None:
        """After a step: its figures, and the newest finished checkpoint's timing if there is a
        new one (``checkpoints``: the checkpoint manager's ``timings``)."""
        self.set(step_values(entry))
        self.checkpoints(checkpoints)

    def checkpoints(self, timings: Iterable[Any]) -> None:
        """The newest finished checkpoint's timing, if it is new. Also after the final
        checkpoint has been written: an async write that ends after the last step would
        otherwise never be exported."""
        timings = list(timings)
        if len(timings) > self._checkpoints_seen:
            self._checkpoints_seen = len(timings)
            self.set({contract.METRIC_CHECKPOINT_STALL: timings[-1].stall_s,
                      contract.METRIC_CHECKPOINT_WRITE: timings[-1].write_s})

    def evaluation(self, figures: Mapping[str, Any] | None) -> None:
        """After an evaluation (``figures``: its metrics.jsonl row, None when there was no data)."""
        if figures:
            self.set({contract.METRIC_EVAL_LOSS: figures.get(contract.EVAL_LOSS)})


def metric_tags(*, run: str, job: str, rank: int, node: str | None = None) -> dict[str, str]:
    """The label values of one rank's series (Ray requires strings)."""
    return {contract.LABEL_RUN: run, contract.LABEL_JOB: job, contract.LABEL_RANK: str(rank),
            contract.LABEL_NODE: node or socket.gethostname()}


def for_worker(*, in_ray: bool, run: str, job: str, rank: int, refresh_s: float | None = None) -> TrainingGauges:
    """The gauges of one worker: exported inside a Ray worker, a no-op elsewhere. ``refresh_s``:
    None = :func:`refresh_interval`, 0 = never re-set."""
    tags = metric_tags(run=run, job=job, rank=rank) if in_ray else None
    return TrainingGauges(tags, refresh_interval() if refresh_s is None else refresh_s)


class GaugeSink:
    """Train rows set the step gauges, eval rows the held-out loss; the summary sets nothing.
    No ``close``: the gauges keep re-setting their last values until the worker exits, so a
    scrape after the last step still finds them."""

    def __init__(self, gauges: TrainingGauges):
        self.gauges = gauges

    def write(self, row: dict[str, Any]) -> None:
        if row.get(contract.KIND) == contract.KIND_TRAIN:
            self.gauges.set(step_values(row))
        elif row.get(contract.KIND) == contract.KIND_EVAL:
            self.gauges.evaluation(row)

    def checkpoints(self, timings: Iterable[Any]) -> None:
        self.gauges.checkpoints(timings)


def open_sink(job: Any, ctx: Any) -> GaugeSink:
    """This rank's gauges, labelled run, job, rank and node."""
    return GaugeSink(for_worker(in_ray=ctx.in_ray, run=job.run_name, job=job.name, rank=ctx.rank))
