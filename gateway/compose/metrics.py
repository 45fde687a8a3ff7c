"""What the metrics read at scrape time: the pools' queues, limits and breakers, and the
cache's entries and embedder (registered by `gateway.compose`'s builders)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from gateway.metrics import counter, gauge
from gateway.traffic.pool import Pool


def pool_metrics(pools: dict[str, Pool]) -> Iterable[Metric]:
    depth = gauge(
        "gateway_queue_depth", "Requests waiting per backend and class.", ["backend", "class"]
    )
    busy = gauge("gateway_backend_in_flight", "Requests dispatched to a backend.", ["backend"])
    replicas = gauge("gateway_backend_ready_replicas", "Ready replicas per backend.", ["backend"])
    shed = counter(
        "gateway_shed",
        "Requests shed, by backend, class and reason.",
        ["backend", "class", "reason"],
    )
    breaker = gauge(
        "gateway_breaker_open", "1 while a backend's circuit is open or half-open.", ["backend"]
    )
    exhausted = counter(
        "gateway_retry_budget_exhausted", "Retries refused by the budget.", ["backend"]
    )
    for name, pool in pools.items():
        snap = pool.scheduler.snapshot()
        for priority, waiting in snap.depth.items():
            depth.add_metric([name, priority], waiting)
        busy.add_metric([name], snap.in_flight)
        replicas.add_metric([name], len(pool.replicas))
        for (priority, reason), count in snap.shed.items():
            shed.add_metric([name, priority, reason], count)
        is_open = any(handle.open for handle in pool.replicas.handles.values())
        breaker.add_metric([name], 1 if is_open else 0)
        exhausted.add_metric([name], pool.budget.snapshot().exhausted)
    return [
        depth,
        busy,
        replicas,
        shed,
        breaker,
        exhausted,
        *_breaker_metrics(pools),
        *_capacity_metrics(pools),
    ]


def _breaker_metrics(pools: dict[str, Pool]) -> Iterable[Metric]:
    opened = counter(
        "gateway_breaker_opened", "Times a backend's replicas' circuits opened.", ["backend"]
    )
    rejected = counter(
        "gateway_breaker_rejected",
        "Attempts a backend's open circuits turned away (answered 503 at once).",
        ["backend"],
    )
    for name, pool in pools.items():
        opened.add_metric([name], pool.replicas.breakers.opened)
        rejected.add_metric([name], pool.replicas.breakers.rejected)
    return [opened, rejected]


def _capacity_metrics(pools: dict[str, Pool]) -> Iterable[Metric]:
    """Learned limits and what the engines report, per replica; desired replicas per backend."""
    per_replica = ["backend", "replica"]
    limit = gauge(
        "gateway_replica_concurrency_limit",
        "Requests a replica is sent at once: its learned (or fixed) limit.",
        per_replica,
    )
    on_replica = gauge("gateway_replica_in_flight", "Requests on a replica now.", per_replica)
    engine = {
        field: gauge(f"gateway_engine_{name}", doc, per_replica)
        for field, name, doc in (
            ("waiting", "requests_waiting", "Requests queued inside the engine (its /metrics)."),
            ("running", "requests_running", "Requests the engine runs (its /metrics)."),
            ("kv_usage", "kv_cache_usage", "The engine's KV-cache usage, 0 to 1 (its /metrics)."),
        )
    }
    desired = gauge(
        "gateway_backend_desired_replicas",
        "Replicas the backend's demand needs (queued, in flight and queued in the engines, "
        "over the learned limit per replica); KEDA scales on it.",
        ["backend"],
    )
    for name, pool in pools.items():
        for handle in pool.replicas.handles.values():
            labels = [name, handle.id]
            limit.add_metric(labels, handle.capacity.limit)
            on_replica.add_metric(labels, handle.in_flight)
            sample = handle.capacity.sample
            for field, family in engine.items():
                value = getattr(sample, field) if sample is not None else None
                if value is not None:
                    family.add_metric(labels, value)
        desired.add_metric([name], pool.desired_replicas())
    return [limit, on_replica, *engine.values(), desired]


def cache_metrics(
    stats: dict[str, int], embedder: dict[str, float], timer_s: float
) -> Iterable[Metric]:
    entries = gauge("gateway_cache_entries", "Entries in the cache.", [])
    entries.add_metric([], stats.get("entries", 0))
    evictions = counter("gateway_cache_evictions", "Entries evicted (LRU).", [])
    evictions.add_metric([], stats.get("evictions", 0))
    expired = counter("gateway_cache_expired", "Entries removed after their TTL.", [])
    expired.add_metric([], stats.get("expired", 0))
    busy = counter(
        "gateway_cache_embedder_busy_seconds",
        "Time the embedder's passes took (its rate: the fraction of time it was busy).",
        [],
    )
    busy.add_metric([], embedder["busy_s"])
    texts = counter("gateway_cache_embedder_texts", "Texts the embedder embedded.", [])
    texts.add_metric([], embedder["texts"])
    timer = gauge(
        "gateway_cache_lookup_timer_seconds",
        "The timer a lookup gets now: the lookup budget less the margin that keeps the "
        "waits of a late event loop within it (below the budget: the loop was late).",
        [],
    )
    timer.add_metric([], timer_s)
    return [entries, evictions, expired, busy, texts, timer]
