"""Every metric a dashboard queries exists: the job exports it (training/contract.py) or an
exporter documents it (environment/observability.py, with its source). A typo fails here, not as
an empty Grafana panel on a running cluster."""
from __future__ import annotations

import copy
import json
import re

import pytest

from environment.observability import DASHBOARD_LABEL, DOCUMENTED_METRICS, dashboard_config_maps, dashboards
from training import contract

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "inf", "nan"}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels, keywords, variables)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and string arguments
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _IDENT.finditer(text):
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before in "$.":  # 1e3, 5m, $variable
            continue
        if text[match.end():].lstrip().startswith("(") or match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def queries(board: dict) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets (rows included) and variables."""
    found = []
    panels = list(board.get("panels", []))
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        found += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and query:
            found += [m.group(1) for m in re.finditer(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", query)]
    return found


def known_metrics() -> set[str]:
    exported = {contract.prometheus_name(name) for name in contract.PROMETHEUS_METRICS}
    return exported.union(*DOCUMENTED_METRICS.values())


def unknown_metrics(board: dict) -> set[str]:
    return {name for expr in queries(board) for name in metric_names(expr)} - known_metrics()


@pytest.fixture(scope="module")
def boards() -> dict[str, dict]:
    return {name: json.loads(text) for name, text in dashboards().items()}


def test_the_three_dashboards_are_there(boards):
    assert set(boards) == {"training.json", "gpus.json", "efa.json"}
    assert len({b["uid"] for b in boards.values()}) == 3


@pytest.mark.parametrize("name", ["training.json", "gpus.json", "efa.json"])
def test_every_metric_a_dashboard_queries_is_exported_or_documented(boards, name):
    assert queries(boards[name])
    assert unknown_metrics(boards[name]) == set()


def test_a_misspelt_metric_name_fails(boards):
    # given the training dashboard with one metric name changed, the check names exactly that name
    board = copy.deepcopy(boards["training.json"])
    loss = contract.prometheus_name(contract.METRIC_LOSS)
    panel = next(p for p in board["panels"] if any(loss in t.get("expr", "") for t in p.get("targets", [])))
    target = next(t for t in panel["targets"] if loss in t["expr"])
    target["expr"] = target["expr"].replace(loss, loss + "es")
    assert unknown_metrics(board) == {loss + "es"}


def test_a_renamed_exported_metric_fails(boards, monkeypatch):
    # given the job renames a metric, the dashboards that still query the old name fail
    renamed = dict(contract.PROMETHEUS_METRICS)
    renamed["raytrain_tokens_per_second"] = renamed.pop(contract.METRIC_TOKENS_PER_S)
    monkeypatch.setattr(contract, "PROMETHEUS_METRICS", renamed)
    assert unknown_metrics(boards["training.json"]) == {contract.prometheus_name(contract.METRIC_TOKENS_PER_S)}


def test_the_training_dashboard_shows_every_exported_metric(boards):
    used = {name for expr in queries(boards["training.json"]) for name in metric_names(expr)}
    assert {contract.prometheus_name(name) for name in contract.PROMETHEUS_METRICS} <= used


@pytest.mark.parametrize("expr, names", [
    ('sum by (run, rank) (rate(node_a_total{device="eth0", job=~"x_y"}[$__rate_interval]))', {"node_a_total"}),
    ("a_seconds - on(rank) group_left(node) b_seconds offset 5m", {"a_seconds", "b_seconds"}),
    ("histogram_quantile(0.9, c_bucket) > 1e3 and bool d", {"c_bucket", "d"}),
    ('label_replace(e, "dst", "$1", "src", "(.*)")', {"e"}),
])
def test_metric_names_are_read_from_promql(expr, names):
    assert metric_names(expr) == names


def test_each_dashboard_is_its_own_labelled_config_map():
    maps = dashboard_config_maps("monitoring")
    assert len(maps) == len(dashboards())
    for config_map in maps:
        assert config_map["metadata"]["labels"] == {DASHBOARD_LABEL: "1"}
        assert config_map["metadata"]["namespace"] == "monitoring"
        [(key, text)] = config_map["data"].items()
        assert key.endswith(".json") and json.loads(text)["uid"].startswith("raytrain-")
