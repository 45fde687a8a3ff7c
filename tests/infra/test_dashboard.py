"""The Grafana dashboard, the Prometheus alerts and the KEDA queries use only the gateway's
metrics (tests/infra/promql.py), with their labels, and the dashboard is a valid Grafana
model on a Prometheus data-source variable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.metrics import Metrics
from tests.infra.manifests import INFRA, K8S, load_docs
from tests.infra.promql import METRICS, problems, series_metric

DASHBOARD = INFRA / "grafana" / "gateway-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _dashboard() -> dict[str, Any]:
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return model


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard_exprs() -> list[tuple[str, str]]:
    exprs = [
        (panel["title"], target["expr"])
        for panel in _panels(_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else ""
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert match, f"variable {variable['name']}: {query}"
            exprs.append((f"${variable['name']}", match.group(1)))
    return exprs


def _alert_exprs() -> list[tuple[str, str]]:
    rules = load_docs(K8S / "components" / "monitoring" / "prometheusrule.yaml")[0]
    return [
        (rule["alert"], rule["expr"])
        for group in rules["spec"]["groups"]
        for rule in group["rules"]
    ]


def _keda_exprs() -> list[tuple[str, str]]:
    scaled = load_docs(K8S / "components" / "keda-worker-autoscaling" / "scaledobject.yaml")[0]
    return [(t["name"], t["metadata"]["query"]) for t in scaled["spec"]["triggers"]]


def test_dashboard_is_a_grafana_model_on_a_prometheus_variable() -> None:
    model = _dashboard()
    assert model["title"] and model["uid"]
    assert model["schemaVersion"] >= 36
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = list(_panels(model["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert target["refId"]


@pytest.mark.parametrize(
    ("where", "expr"),
    [*_dashboard_exprs(), *_alert_exprs(), *_keda_exprs()],
    ids=lambda value: value if len(value) < 60 else None,
)
def test_queries_use_only_the_gateway_metrics(where: str, expr: str) -> None:
    assert problems(expr) == [], where


def test_dashboard_covers_what_an_operator_watches() -> None:
    exprs = " ".join(expr for _, expr in _dashboard_exprs())
    for needle in (
        "gateway_requests_total",  # request rate
        "sum by (status)",  # ... by status
        'gateway_cache_lookups_total{tenant=~"$tenant", model=~"$model", result="hit"}',
        "gateway_queue_depth",
        "gateway_shed_total",
        "gateway_cold_starts_total",
        "gateway_cold_start_seconds_bucket",
        "gateway_breaker_open",
    ):
        assert needle in exprs, needle
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(gateway_request_duration" in exprs


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        ("sum(rate(gateway_requests_total[5m]))", None),
        ("sum(rate(gateway_nonexistent_total[5m]))", "unknown series"),
        ("sum(rate(gateway_requests_total{tenant='a'}[5m]))", None),
        ("sum(rate(gateway_requests_total{backend='x'}[5m]))", "no label backend"),
        ('sum(rate(gateway_requests_total{backend="x"}[5m]))', "no label backend"),
        ("sum by (backend) (rate(gateway_requests_total[5m]))", "unknown label backend"),
        ("rate(gateway_requests_total)", "range vector"),
        ("rate(gateway_queue_depth[5m])", "of the gauge"),
        ("histogram_quantile(0.9, sum(rate(gateway_request_duration_seconds_bucket[5m])))", "le"),
        ("gateway_request_duration_seconds", "unknown series"),
        ("sum(gateway_queue_depth", "unclosed"),
    ],
)
def test_query_checker_catches_mistakes(expr: str, complaint: str | None) -> None:
    found = " ".join(problems(expr))
    if complaint is None:
        assert found == ""
    else:
        assert complaint in found


def _exported() -> dict[str, str]:
    """Metric name -> type, as the gateway's registry exposes them (`# TYPE` lines)."""
    text = Metrics().exposition().decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def test_metric_contract_matches_what_the_gateway_exports() -> None:
    exported = _exported()
    for name in (
        "gateway_requests_total",
        "gateway_request_duration_seconds",
        "gateway_upstream_duration_seconds",
        "gateway_requests_in_flight",
        "gateway_upstream_errors_total",
    ):
        assert name in exported, f"the gateway no longer exports {name}"
    for name, metric in METRICS.items():
        if name in exported:
            assert exported[name] == metric.type, f"{name} is a {exported[name]} now"


def test_every_contract_metric_is_used_somewhere() -> None:
    exprs = [expr for _, expr in [*_dashboard_exprs(), *_alert_exprs(), *_keda_exprs()]]
    used = {
        known[0]
        for expr in exprs
        for series in re.findall(r"\bgateway_[a-z0-9_]+", expr)
        if (known := series_metric(series))
    }
    assert set(METRICS) == used, f"not on the dashboard: {set(METRICS) - used}"
