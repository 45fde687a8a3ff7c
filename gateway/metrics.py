"""Prometheus metrics, in a registry of the app's own (several apps may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "gateway_requests",
            "Requests answered, by tenant, model and HTTP status.",
            ["tenant", "model", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "gateway_request_duration_seconds",
            "Time from request to the end of the answer, by route.",
            ["route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._upstream_latency = Histogram(
            "gateway_upstream_duration_seconds",
            "Time from sending upstream to the end of its answer, by backend.",
            ["backend"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._upstream_errors = Counter(
            "gateway_upstream_errors",
            "Upstream failures (connect, timeout, protocol, status), by backend.",
            ["backend", "kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being answered.", registry=self.registry
        )
        # labels() costs a lock and a tuple per call; children are cached per label set.
        self._children: dict[tuple[str, ...], Counter | Histogram] = {}

    def request_done(
        self, route: str, tenant: str, model: str, status: int, seconds: float
    ) -> None:
        self._child(self._requests, ("r", tenant, model, str(status))).inc()  # type: ignore[union-attr]
        self._child(self._latency, ("l", route)).observe(seconds)  # type: ignore[union-attr]

    def upstream_done(self, backend: str, seconds: float) -> None:
        self._child(self._upstream_latency, ("u", backend)).observe(seconds)  # type: ignore[union-attr]

    def upstream_error(self, backend: str, kind: str) -> None:
        self._upstream_errors.labels(backend, kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def _child(self, metric: Counter | Histogram, key: tuple[str, ...]) -> Counter | Histogram:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*key[1:])
        return child
