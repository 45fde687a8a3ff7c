"""Prometheus metrics, in a registry of the app's own (several apps may share a process).

Counters the request path updates live here; numbers that other components already keep
(queue depths, breaker states, cache sizes) are read at scrape time by `Snapshots`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


# The request path's metrics, a row each: name (after `gateway_`), help, labels. Each has
# one method below that updates it. The first two tables are what every request updates:
# plain numbers (see `LoopCounter`), no lock taken per update.
_LOOP_COUNTERS: dict[str, tuple[str, list[str]]] = {
    "requests": (
        "Requests answered, by tenant, model and HTTP status.",
        ["tenant", "model", "status"],
    ),
    "tokens": ("Tokens served, by tenant and kind (prompt, completion).", ["tenant", "kind"]),
}
_LOOP_HISTOGRAMS: dict[str, tuple[str, list[str]]] = {
    "request_duration_seconds": ("Time from request to the end of the answer.", ["route"]),
    "upstream_duration_seconds": (
        "Time from sending upstream to the end of its answer, by backend.",
        ["backend"],
    ),
    "queue_wait_seconds": ("Time waiting in a backend's fair queue.", ["backend", "class"]),
}
_COUNTERS: dict[str, tuple[str, list[str]]] = {
    "upstream_errors": (
        "Upstream failures (connect, timeout, protocol, status), by backend.",
        ["backend", "kind"],
    ),
    "retries": ("Upstream retries, by backend and cause.", ["backend", "reason"]),
    "quota_rejections": ("Requests refused by a tenant quota, by reason.", ["tenant", "reason"]),
    "quota_fallbacks": (
        "Quota decisions taken without the shared store (local share or fail closed).",
        ["decision"],
    ),
    "cache_lookups": (
        "Cache lookups by result (hit, miss, bypass) and tier.",
        ["tenant", "model", "result", "tier"],
    ),
    "cache_fail_open": (
        "Lookups or stores given up (budget, embedder_busy, store, error, ...).",
        ["reason"],
    ),
    "cache_deleted_entries": (
        "Cache entries deleted one by one: by an admin, or reported bad by a client.",
        ["tenant", "cause"],
    ),
    "cache_explores": (
        "Would-be semantic hits answered by the model under a tenant's error bound: "
        "explored (at the lookup), then agreed, disagreed or unjudged once compared.",
        ["tenant", "outcome"],
    ),
    "cache_coalesced": (
        "Requests answered by an identical request's upstream call (gateway/coalesce.py).",
        ["tenant"],
    ),
    "model_fallbacks": (
        "Requests sent to a fallback model, by the model asked for, the fallback and why "
        "(unavailable, overloaded, failing).",
        ["model", "fallback", "reason"],
    ),
    "degraded": (
        "Requests degraded under overload (gateway/degrade.py), by tenant, the model "
        "asked for and the action (max_tokens, model).",
        ["tenant", "model", "action"],
    ),
    "prompt_size_routed": (
        "Requests for a model with backends for long prompts (gateway/prompt_size.py), "
        "by model and the backend the prompt's size picked.",
        ["model", "backend"],
    ),
    "cache_bad_hit_labels": (
        "Bad-hit reports by whether they became a wrong label of the error-bounded "
        "evidence (labelled=no: not served under a bound by this replica).",
        ["tenant", "labelled"],
    ),
    "cold_starts": ("Starts of a backend from zero ready replicas.", ["backend"]),
    "events_dropped": (
        "Report lines lost (request and scale events, cold-start records), by kind and "
        "reason (buffer_full, store_unavailable, store_error, error).",
        ["kind", "reason"],
    ),
}
_HISTOGRAMS: dict[str, tuple[str, list[str], Sequence[float]]] = {
    "cache_lookup_seconds": (
        "Cache lookup time, by stage (embed, search, pair_model, pair_model_late, total; "
        "shared: a lookup answered by an identical one in flight).",
        ["stage"],
        _FAST_BUCKETS,
    ),
    "cold_start_seconds": (
        "Cold-start phases: staging, loading (process start to ready), first_byte, total; "
        "wakes from sleep: wake, wake_first_byte, wake_total.",
        ["backend", "phase"],
        _BUCKETS,
    ),
}


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._loop_counters = {
            key: LoopCounter(f"gateway_{key}", doc, labels)
            for key, (doc, labels) in _LOOP_COUNTERS.items()
        }
        self._loop_histograms = {
            key: LoopHistogram(f"gateway_{key}", doc, labels, _BUCKETS)
            for key, (doc, labels) in _LOOP_HISTOGRAMS.items()
        }
        loop_metrics: list[LoopCounter | LoopHistogram] = [
            *self._loop_counters.values(),
            *self._loop_histograms.values(),
        ]
        r.register(_Snapshots(lambda: [m.collect() for m in loop_metrics]))
        self._counters = {
            key: Counter(f"gateway_{key}", doc, labels, registry=r)
            for key, (doc, labels) in _COUNTERS.items()
        }
        self._histograms = {
            key: Histogram(f"gateway_{key}", doc, labels, buckets=buckets, registry=r)
            for key, (doc, labels, buckets) in _HISTOGRAMS.items()
        }
        # A plain number, read at scrape time: no lock taken twice per request.
        self.in_flight = 0
        in_flight = Gauge("gateway_requests_in_flight", "Requests being answered.", registry=r)
        in_flight.set_function(lambda: self.in_flight)
        # labels() costs a lock and a tuple per call; children are cached per label set.
        self._children: dict[tuple[str, ...], Counter | Histogram] = {}

    def request_done(
        self, route: str, tenant: str, model: str, status: int, seconds: float
    ) -> None:
        self._loop_counters["requests"].inc((tenant, model, str(status)))
        self._loop_histograms["request_duration_seconds"].observe((route,), seconds)

    def upstream_done(self, backend: str, seconds: float) -> None:
        self._loop_histograms["upstream_duration_seconds"].observe((backend,), seconds)

    def upstream_error(self, backend: str, kind: str) -> None:
        self._counters["upstream_errors"].labels(backend, kind).inc()

    def retried(self, backend: str, reason: str) -> None:
        self._counters["retries"].labels(backend, reason).inc()

    def queue_waited(self, backend: str, priority: str, seconds: float) -> None:
        self._loop_histograms["queue_wait_seconds"].observe((backend, priority), seconds)

    def quota_rejected(self, tenant: str, reason: str) -> None:
        self._counters["quota_rejections"].labels(tenant, reason).inc()

    def quota_fallback(self, decision: str) -> None:
        self._counters["quota_fallbacks"].labels(decision).inc()

    def tokens(self, tenant: str, prompt: int, completion: int) -> None:
        self._loop_counters["tokens"].inc((tenant, "prompt"), prompt)
        self._loop_counters["tokens"].inc((tenant, "completion"), completion)

    def cache_lookup(self, tenant: str, model: str, result: str, tier: str) -> None:
        self._count(self._counters["cache_lookups"], ("c", tenant, model, result, tier))

    def cache_stage(self, stage: str, seconds: float) -> None:
        self._observe(self._histograms["cache_lookup_seconds"], ("s", stage), seconds)

    def cache_fail_open(self, reason: str) -> None:
        self._counters["cache_fail_open"].labels(reason).inc()

    def cache_deleted(self, tenant: str, cause: str) -> None:
        """`cause`: "admin" (the entry's tenant) or "bad_hit" (the tenant who reported it)."""
        self._counters["cache_deleted_entries"].labels(tenant, cause).inc()

    def cache_explored(self, tenant: str, outcome: str) -> None:
        self._counters["cache_explores"].labels(tenant, outcome).inc()

    def cache_coalesced(self, tenant: str) -> None:
        self._count(self._counters["cache_coalesced"], ("k", tenant))

    def model_fallback(self, model: str, fallback: str, reason: str) -> None:
        self._counters["model_fallbacks"].labels(model, fallback, reason).inc()

    def degraded(self, tenant: str, model: str, action: str) -> None:
        self._counters["degraded"].labels(tenant, model, action).inc()

    def prompt_size_routed(self, model: str, backend: str) -> None:
        self._count(self._counters["prompt_size_routed"], ("p", model, backend))

    def cache_bad_hit_label(self, tenant: str, labelled: bool) -> None:
        self._counters["cache_bad_hit_labels"].labels(tenant, "yes" if labelled else "no").inc()

    def on_cold_start(self, backend: str) -> None:
        self._counters["cold_starts"].labels(backend).inc()

    def on_phase(self, backend: str, phase: str, seconds: float) -> None:
        self._histograms["cold_start_seconds"].labels(backend, phase).observe(seconds)

    def events_dropped(self, kind: str, reason: str, lines: int) -> None:
        self._counters["events_dropped"].labels(kind, reason).inc(lines)

    def add_snapshots(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_Snapshots(collect))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _count(self, metric: Counter, key: tuple[str, ...], amount: float = 1) -> None:
        self._child(metric, key).inc(amount)  # type: ignore[union-attr]

    def _observe(self, metric: Histogram, key: tuple[str, ...], value: float) -> None:
        self._child(metric, key).observe(value)  # type: ignore[union-attr]

    def _child(self, metric: Counter | Histogram, key: tuple[str, ...]) -> Counter | Histogram:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*key[1:])
        return child


class LoopCounter:
    """A labelled counter kept as plain numbers, for what the request path counts on every
    request: only the event loop's thread updates it (and reads it, at scrape time), so
    it takes no lock, where prometheus_client takes one per increment."""

    def __init__(self, name: str, doc: str, labels: list[str]) -> None:
        self._name, self._doc, self._labels = name, doc, labels
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self._values[key] = self._values.get(key, 0.0) + amount

    def collect(self) -> Metric:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labels)
        for key, value in self._values.items():
            family.add_metric(list(key), value)
        return family


class LoopHistogram:
    """A labelled histogram kept as plain numbers (see `LoopCounter`): per label set, a
    count per bucket (the first bound at or above the value, as Prometheus's `le`) and
    the sum."""

    def __init__(self, name: str, doc: str, labels: list[str], bounds: Sequence[float]) -> None:
        self._name, self._doc, self._labels = name, doc, labels
        self._bounds = tuple(bounds)
        self._series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = [0.0] * (len(self._bounds) + 2)
        series[bisect_left(self._bounds, value)] += 1
        series[-1] += value

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labels)
        for key, series in self._series.items():
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self._bounds, math.inf), series, strict=False):
                cumulative += count
                buckets.append(("+Inf" if math.isinf(bound) else repr(float(bound)), cumulative))
            family.add_metric(list(key), buckets, sum_value=series[-1])
        return family


class _Snapshots(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()

    def describe(self) -> Iterable[Metric]:
        return []


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)
