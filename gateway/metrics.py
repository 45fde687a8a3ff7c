"""Prometheus metrics, in a registry of the app's own (several apps may share a process).

Counters the request path updates live here; numbers that other components already keep
(queue depths, breaker states, cache sizes) are read at scrape time by `Snapshots`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "gateway_requests",
            "Requests answered, by tenant, model and HTTP status.",
            ["tenant", "model", "status"],
            registry=r,
        )
        self._latency = Histogram(
            "gateway_request_duration_seconds",
            "Time from request to the end of the answer.",
            ["route"],
            buckets=_BUCKETS,
            registry=r,
        )
        self._upstream_latency = Histogram(
            "gateway_upstream_duration_seconds",
            "Time from sending upstream to the end of its answer, by backend.",
            ["backend"],
            buckets=_BUCKETS,
            registry=r,
        )
        self._upstream_errors = Counter(
            "gateway_upstream_errors",
            "Upstream failures (connect, timeout, protocol, status), by backend.",
            ["backend", "kind"],
            registry=r,
        )
        # A plain number, read at scrape time: no lock taken twice per request.
        self.in_flight = 0
        in_flight = Gauge("gateway_requests_in_flight", "Requests being answered.", registry=r)
        in_flight.set_function(lambda: self.in_flight)
        self._retries = Counter(
            "gateway_retries",
            "Upstream retries, by backend and cause.",
            ["backend", "reason"],
            registry=r,
        )
        self._queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time waiting in a backend's fair queue.",
            ["backend", "class"],
            buckets=_BUCKETS,
            registry=r,
        )
        self._quota_rejections = Counter(
            "gateway_quota_rejections",
            "Requests refused by a tenant quota, by reason.",
            ["tenant", "reason"],
            registry=r,
        )
        self._quota_fallbacks = Counter(
            "gateway_quota_fallbacks",
            "Quota decisions taken without the shared store (local share or fail closed).",
            ["decision"],
            registry=r,
        )
        self._tokens = Counter(
            "gateway_tokens",
            "Tokens served, by tenant and kind (prompt, completion).",
            ["tenant", "kind"],
            registry=r,
        )
        self._cache_lookups = Counter(
            "gateway_cache_lookups",
            "Cache lookups by result (hit, miss, bypass) and tier.",
            ["tenant", "model", "result", "tier"],
            registry=r,
        )
        self._cache_stage = Histogram(
            "gateway_cache_lookup_seconds",
            "Cache lookup time, by stage (embed, search, total).",
            ["stage"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self._cache_fail_open = Counter(
            "gateway_cache_fail_open",
            "Lookups or stores given up (budget, store, embedder).",
            ["reason"],
            registry=r,
        )
        self._cold_starts = Counter(
            "gateway_cold_starts",
            "Starts of a backend from zero ready replicas.",
            ["backend"],
            registry=r,
        )
        self._cold_start_phase = Histogram(
            "gateway_cold_start_seconds",
            "Cold-start phases: staging, loading (process start to ready), first_byte, total.",
            ["backend", "phase"],
            buckets=_BUCKETS,
            registry=r,
        )
        # labels() costs a lock and a tuple per call; children are cached per label set.
        self._children: dict[tuple[str, ...], Counter | Histogram] = {}

    def request_done(
        self, route: str, tenant: str, model: str, status: int, seconds: float
    ) -> None:
        self._count(self._requests, ("r", tenant, model, str(status)))
        self._observe(self._latency, ("l", route), seconds)

    def upstream_done(self, backend: str, seconds: float) -> None:
        self._observe(self._upstream_latency, ("u", backend), seconds)

    def upstream_error(self, backend: str, kind: str) -> None:
        self._upstream_errors.labels(backend, kind).inc()

    def retried(self, backend: str, reason: str) -> None:
        self._retries.labels(backend, reason).inc()

    def queue_waited(self, backend: str, priority: str, seconds: float) -> None:
        self._observe(self._queue_wait, ("q", backend, priority), seconds)

    def quota_rejected(self, tenant: str, reason: str) -> None:
        self._quota_rejections.labels(tenant, reason).inc()

    def quota_fallback(self, decision: str) -> None:
        self._quota_fallbacks.labels(decision).inc()

    def tokens(self, tenant: str, prompt: int, completion: int) -> None:
        self._count(self._tokens, ("tp", tenant, "prompt"), prompt)
        self._count(self._tokens, ("tc", tenant, "completion"), completion)

    def cache_lookup(self, tenant: str, model: str, result: str, tier: str) -> None:
        self._count(self._cache_lookups, ("c", tenant, model, result, tier))

    def cache_stage(self, stage: str, seconds: float) -> None:
        self._observe(self._cache_stage, ("s", stage), seconds)

    def cache_fail_open(self, reason: str) -> None:
        self._cache_fail_open.labels(reason).inc()

    def on_cold_start(self, backend: str) -> None:
        self._cold_starts.labels(backend).inc()

    def on_phase(self, backend: str, phase: str, seconds: float) -> None:
        self._cold_start_phase.labels(backend, phase).observe(seconds)

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
