"""The gateway's metric names, and a light reading of PromQL expressions that use them.

`METRICS` is the contract between the gateway and its dashboards, alerts and autoscalers:
every name they may use, its type and its labels. Names the gateway does not export yet are
in it too (they arrive with later issues); `tests/infra/test_dashboard.py` checks the ones it
does export against the real registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    type: str  # counter, gauge, histogram
    labels: frozenset[str]


def _m(type_: str, *labels: str) -> Metric:
    return Metric(type_, frozenset(labels))


METRICS: dict[str, Metric] = {
    "gateway_requests_total": _m("counter", "tenant", "model", "status"),
    "gateway_request_duration_seconds": _m("histogram", "route"),
    "gateway_upstream_duration_seconds": _m("histogram", "backend"),
    "gateway_requests_in_flight": _m("gauge"),
    "gateway_upstream_errors_total": _m("counter", "backend", "kind"),
    "gateway_cache_lookups_total": _m("counter", "tenant", "model", "result", "tier"),
    "gateway_cache_lookup_seconds": _m("histogram", "stage"),
    "gateway_cache_entries": _m("gauge"),
    "gateway_cache_embedder_busy_seconds_total": _m("counter"),
    "gateway_cache_embedder_texts_total": _m("counter"),
    "gateway_queue_depth": _m("gauge", "backend", "class"),
    "gateway_queue_wait_seconds": _m("histogram", "backend", "class"),
    "gateway_shed_total": _m("counter", "backend", "class", "reason"),
    "gateway_quota_rejections_total": _m("counter", "tenant", "reason"),
    "gateway_retries_total": _m("counter", "backend", "reason"),
    "gateway_breaker_open": _m("gauge", "backend"),
    "gateway_cold_starts_total": _m("counter", "model"),
    "gateway_cold_start_seconds": _m("histogram", "model", "phase"),
    "gateway_backend_desired_replicas": _m("gauge", "backend"),
    "gateway_replica_concurrency_limit": _m("gauge", "backend", "replica"),
    "gateway_replica_in_flight": _m("gauge", "backend", "replica"),
    "gateway_engine_requests_waiting": _m("gauge", "backend", "replica"),
    "gateway_engine_requests_running": _m("gauge", "backend", "replica"),
    "gateway_engine_kv_cache_usage": _m("gauge", "backend", "replica"),
}

# Labels that Prometheus adds to every series it scrapes.
TARGET_LABELS = frozenset({"instance", "job", "namespace", "pod", "service", "container"})
HISTOGRAM_SERIES = {"_bucket", "_sum", "_count"}

_SERIES = re.compile(r"\b(gateway_[a-z0-9_]+)\b")
_SELECTOR = re.compile(r"\b(gateway_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*[\"'`]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def series_metric(series: str) -> tuple[str, Metric] | None:
    """The metric a series name belongs to, or None if it belongs to none."""
    if series in METRICS and METRICS[series].type != "histogram":
        return series, METRICS[series]
    for suffix in HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if base != series and base in METRICS and METRICS[base].type == "histogram":
            return base, METRICS[base]
    return None


def problems(expr: str) -> list[str]:
    """What is wrong with the metric names and labels in `expr` (empty when nothing)."""
    found = []
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for c in re.sub(r"\"[^\"]*\"|'[^']*'", "''", expr):
        if c in "([{":
            stack.append(c)
        elif c in pairs and (not stack or stack.pop() != pairs[c]):
            found.append(f"unbalanced {c!r}")
    if stack:
        found.append(f"unclosed {stack[-1]!r}")
    series = _SERIES.findall(expr)
    if not series:
        found.append("uses no gateway metric")
    allowed = set(TARGET_LABELS)
    for name in series:
        known = series_metric(name)
        if known is None:
            found.append(f"unknown series {name}")
            continue
        allowed |= known[1].labels | ({"le"} if name.endswith("_bucket") else set())
    for name, matchers in _SELECTOR.findall(expr):
        known = series_metric(name)
        labels = (
            known[1].labels | ({"le"} if name.endswith("_bucket") else set()) if known else set()
        )
        for label, _ in _MATCHER.findall(matchers):
            if label not in labels | TARGET_LABELS:
                found.append(f"{name} has no label {label}")
    for grouping in _GROUPING.findall(expr):
        for label in filter(None, (x.strip() for x in grouping.split(","))):
            if label not in allowed:
                found.append(f"grouping by unknown label {label}")
    for call in re.finditer(r"\b(rate|irate|increase)\s*\(", expr):
        inner = _argument(expr, call.end())
        if not re.search(r"\[[^\]]+\]\s*$", inner):
            found.append(f"{call.group(1)}() needs a range vector: {inner}")
        for name in _SERIES.findall(inner):
            known = series_metric(name)
            if known and known[1].type == "gauge":
                found.append(f"{call.group(1)}() of the gauge {name}")
    for call in re.finditer(r"\bhistogram_quantile\s*\(", expr):
        inner = _argument(expr, call.end())
        if "_bucket" not in inner or not re.search(r"\b(?:by)\s*\([^)]*\ble\b", inner):
            found.append(f"histogram_quantile() needs buckets summed by le: {inner}")
    return found


def _argument(expr: str, start: int) -> str:
    """The text of a call's arguments, from just after its opening parenthesis."""
    depth = 1
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[start:i]
    return expr[start:]
