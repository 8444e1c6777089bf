"""Scrape a Ray node's metrics endpoint while a job runs, as Prometheus does on EKS, and pick out
the job's own gauges (training/contract.py): the demo prints them, a test compares them with
metrics.jsonl.

A Ray node's metrics agent serves every worker of the node, so the local head's endpoint holds
both ranks' series.
"""
from __future__ import annotations

import threading
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from training import contract
from training.metric_sinks.prometheus import step_values

JOB_METRICS = {contract.prometheus_name(name): name for name in contract.PROMETHEUS_METRICS}
"""Scraped name -> the contract's metric name."""
EVERY_STEP = set(contract.PROMETHEUS_METRICS) - set(contract.EVENT_METRICS) - {contract.METRIC_MFU}
"""The gauges a rank sets at every step (MFU too, but only where the device has a known peak)."""


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    value: float


def parse(text: str) -> dict[str, list[Series]]:
    """Prometheus text exposition -> ``{metric name: [series]}`` (every sample of the scrape)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[Series]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(Series(dict(sample.labels), float(sample.value)))
    return out


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, list[Series]]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode("utf-8"))


def job_series(samples: dict[str, list[Series]], run: str | None = None) -> dict[str, dict[str, Series]]:
    """The job's gauges by rank: ``{rank: {contract metric name: series}}``; with ``run``, only
    the series labelled with that run (the agent serves every worker of its node, and keeps a
    finished worker's series for a while, so another run's may still be there).

    A rank restarted after a failure is a new Ray worker (a new ``WorkerId`` label) while the
    agent may still serve the old one's series: per rank, the worker furthest along wins."""
    by_worker: dict[tuple[str, str], dict[str, Series]] = {}
    for scraped, name in JOB_METRICS.items():
        for series in samples.get(scraped, []):
            if run is not None and series.labels.get(contract.LABEL_RUN) != run:
                continue
            key = (series.labels.get(contract.LABEL_RANK, "?"), series.labels.get("WorkerId", ""))
            by_worker.setdefault(key, {})[name] = series
    by_rank: dict[str, dict[str, Series]] = {}
    for (rank, _), series in sorted(by_worker.items(), key=lambda item: _step(item[1])):
        by_rank[rank] = series  # sorted by step: the last one kept is the furthest along
    return by_rank


def _step(series: dict[str, Series]) -> float:
    step = series.get(contract.METRIC_STEP)
    return -1.0 if step is None else step.value


@dataclass
class Watcher:
    """Scrapes ``url`` every ``interval_s`` in a thread; keeps each scrape that held the job's
    gauges (``snapshots``; with ``run``, that run's only) and counts the others."""

    url: str
    interval_s: float = 2.0
    run: str | None = None
    snapshots: list[dict[str, dict[str, Series]]] = field(default_factory=list)
    scrapes: int = 0
    errors: int = 0
    other_names: set[str] = field(default_factory=set)
    """Names of the other metrics the endpoint served (Ray's own)."""
    on_snapshot: Callable[[dict[str, dict[str, Series]]], None] | None = None
    """Called with each scrape that held the job's gauges (per rank, its series): what a test
    waits on instead of sampling."""
    callback_error: BaseException | None = None
    """What ``on_snapshot`` raised, if it did: the scraping stops there (a caller waiting on the
    callback would otherwise wait out its bound and never learn why)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                samples = scrape(self.url)
            except (OSError, ValueError):
                self.errors += 1  # the agent may not be up yet, or is going down
            else:
                self.scrapes += 1
                self.other_names.update(name for name in samples if name not in JOB_METRICS)
                series = job_series(samples, self.run)
                if series:
                    self.snapshots.append(series)
                    if self.on_snapshot is not None:
                        try:
                            self.on_snapshot(series)
                        except Exception as error:  # noqa: BLE001 - kept for the caller, who asserts on it
                            self.callback_error = error
                            return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Watcher":
        self._thread = threading.Thread(target=self._run, name="metrics-scrape", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def last(self) -> dict[str, dict[str, Series]]:
        """Per rank, its series in the last scrape that held all its per-step gauges: once a
        worker exits, the agent drops its series one metric at a time (each at its own age), so
        a scrape at that moment holds only some of them."""
        latest: dict[str, dict[str, Series]] = {}
        for snapshot in self.snapshots:
            for rank, series in snapshot.items():
                if EVERY_STEP <= set(series) or rank not in latest:
                    latest[rank] = series
        return latest


def logged_values(rows: list[dict[str, Any]], step: int) -> dict[str, float | None]:
    """What metrics.jsonl says the gauges should hold after ``step`` (its last row of that step)."""
    train = [r for r in rows if r.get(contract.KIND) == contract.KIND_TRAIN and r.get(contract.STEP) == step]
    return step_values(train[-1]) if train else {}


def report(watcher: Watcher, rows: list[dict[str, Any]], rank: str = "0") -> list[str]:
    """The lines the demo prints: where it scraped, and rank ``rank``'s last values beside the
    values metrics.jsonl holds for the same step."""
    lines = [f"{watcher.url}: {watcher.scrapes} scrapes, {len(watcher.snapshots)} with the job's metrics, "
             f"{len(watcher.other_names)} other (Ray) metric names"]
    series = watcher.last.get(rank, {})
    if contract.METRIC_STEP not in series:
        return lines + [f"no step of rank {rank} was scraped"]
    step = int(series[contract.METRIC_STEP].value)
    logged = logged_values(rows, step)
    labels = {k: v for k, v in series[contract.METRIC_STEP].labels.items() if k in contract.METRIC_LABELS}
    lines.append(f"last scrape, rank {rank} at step {step} ({', '.join(f'{k}={v}' for k, v in sorted(labels.items()))}):")
    for name in contract.PROMETHEUS_METRICS:
        scraped = series.get(name)
        value = "-" if scraped is None else f"{scraped.value:.6g}"
        expected = logged.get(name)
        beside = "" if expected is None else f"   metrics.jsonl {expected:.6g}"
        lines.append(f"  {contract.prometheus_name(name):<52} {value:>12}{beside}")
    return lines
