"""Builds the long-lived parts from settings: backend pools, quotas, the answer cache, and
the metrics read from them at scrape time. Called once, from the app's lifespan."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable

import anyio.to_thread
from anyio.abc import TaskGroup
from prometheus_client.core import Metric

from backends.http import HttpTimeouts, HttpUpstream
from backends.launcher import LocalProcess, free_port
from backends.providers.replicas import Replica
from cache.store import CacheStore
from gateway.answer_cache import AnswerCache
from gateway.breaker import CircuitBreaker
from gateway.forward import Pool
from gateway.metrics import Metrics, counter, gauge
from gateway.quotas import LocalQuotas, QuotaEnforcer
from gateway.quotas_redis import RedisQuotas
from gateway.replicas import ReplicaSet
from gateway.retry import RetryBudget
from gateway.scheduler import FairScheduler
from gateway.settings import Backend, Settings, TrafficSettings


async def build_pools(
    settings: Settings, metrics: Metrics, stack: contextlib.AsyncExitStack, tasks: TaskGroup
) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    scalable = [b for b in settings.backends if b.kind != "http"]
    if scalable:
        await _attach_managers(settings, scalable, pools, metrics, stack, tasks)
    for backend in settings.backends:
        if backend.kind != "http":
            continue
        base_url = backend.base_url
        if backend.launch is not None:
            base_url, process = _launch_spec(backend)
            stack.push_async_callback(process.stop)
            await process.start(backend.launch.start_timeout_s)
        pool = _pool(backend, settings.traffic, metrics)
        stack.push_async_callback(pool.replicas.close)
        pool.adopt([Replica(f"{backend.name}/0", base_url)])
        pools[backend.name] = pool
    metrics.add_snapshots(lambda: _pool_metrics(pools))
    return pools


async def _attach_managers(
    settings: Settings,
    backends: list[Backend],
    pools: dict[str, Pool],
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> None:
    from gateway.coldstart import attach_manager, build_timeline
    from gateway.events import SCALE, open_event_log
    from gateway.staging import build_stager

    timeline = build_timeline(settings, metrics, stack, tasks)
    scale_events = open_event_log(settings, SCALE, stack, tasks)
    stager = None
    if any(b.weights is not None for b in backends):
        stager = build_stager(settings)
        await stager.open()
        stack.push_async_callback(stager.aclose)
    for backend in backends:
        pool = _pool(backend, settings.traffic, metrics)
        stack.push_async_callback(pool.replicas.close)
        await attach_manager(
            pool, backend, settings, stager, timeline, stack, tasks, scale_events=scale_events
        )
        pools[backend.name] = pool


def _pool(backend: Backend, traffic: TrafficSettings, metrics: Metrics) -> Pool:
    def waited(priority: str, seconds: float) -> None:
        metrics.queue_waited(backend.name, priority, seconds)

    def breaker() -> CircuitBreaker | None:
        if not traffic.breaker:
            return None
        return CircuitBreaker(traffic.breaker_failures, open_s=traffic.breaker_open_s)

    scheduler = FairScheduler(
        0, traffic.max_queue, output_weight=traffic.output_weight, on_wait=waited
    )
    replicas = ReplicaSet(lambda url: _upstream(backend, url), breaker)
    budget = RetryBudget(traffic.retry_budget_ratio, traffic.retry_min_per_s)
    return Pool(backend.name, replicas, scheduler, budget, backend.max_concurrency)


def build_quotas(
    settings: Settings, metrics: Metrics, stack: contextlib.AsyncExitStack, tasks: TaskGroup
) -> QuotaEnforcer:
    if settings.state.url == "memory":
        return LocalQuotas()
    quotas = RedisQuotas(
        settings.state.url, settings.state.prefix, on_fallback=metrics.quota_fallback
    )
    stack.push_async_callback(quotas.close)
    tasks.start_soon(quotas.run)
    return quotas


async def build_cache(
    settings: Settings, metrics: Metrics, stack: contextlib.AsyncExitStack, tasks: TaskGroup
) -> AnswerCache:
    config = settings.cache
    if not config.enabled:
        return AnswerCache(config, None, None, None, None, metrics)
    from cache.decision import DecisionSettings
    from cache.embedder import BatchingEmbedder, load_embedder
    from cache.verifier import PairVerifier

    encoder = await anyio.to_thread.run_sync(load_embedder, config.model_path, config.device)
    verifier = await anyio.to_thread.run_sync(PairVerifier.load)
    embedder = BatchingEmbedder(
        encoder, window_ms=config.batch_window_ms, max_batch=config.max_batch
    )
    await embedder.start()
    stack.push_async_callback(embedder.close)
    await embedder.embed("warm up")  # the first forward pass is several times slower
    store = _cache_store(settings, encoder.dimension)
    await store.start(tasks)
    stack.push_async_callback(store.close)
    metrics.add_snapshots(lambda: _cache_metrics(store.stats()))
    cache = AnswerCache(config, store, embedder, verifier, DecisionSettings(), metrics)
    cache.start(tasks)
    return cache


def _cache_store(settings: Settings, dim: int) -> CacheStore:
    from cache.store import LocalCacheStore
    from cache.store_redis import RedisCacheStore

    config = settings.cache
    if settings.state.url == "memory":
        return LocalCacheStore(config.path / "entries.bin", dim, config.max_entries_per_namespace)
    return RedisCacheStore(
        settings.state.url, settings.state.prefix, dim, config.max_entries_per_namespace
    )


def _upstream(backend: Backend, base_url: str) -> HttpUpstream:
    t = backend.timeouts
    return HttpUpstream(
        base_url,
        backend.api_key.get_secret_value() if backend.api_key else None,
        HttpTimeouts(t.connect_s, t.read_s, t.total_s),
        backend.max_concurrency,
    )


def _launch_spec(backend: Backend) -> tuple[str, LocalProcess]:
    assert backend.launch is not None
    port = str(backend.launch.port or free_port())
    base_url = backend.base_url.replace("{port}", port)
    command = [
        part.replace("{port}", port).replace("{python}", sys.executable)
        for part in backend.launch.command
    ]
    root = base_url.split("/v1")[0] if "/v1" in base_url else base_url
    return base_url, LocalProcess(command, backend.launch.env, root + backend.launch.ready_path)


def _pool_metrics(pools: dict[str, Pool]) -> Iterable[Metric]:
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
    return [depth, busy, replicas, shed, breaker, exhausted]


def _cache_metrics(stats: dict[str, int]) -> Iterable[Metric]:
    entries = gauge("gateway_cache_entries", "Entries in the cache.", [])
    entries.add_metric([], stats.get("entries", 0))
    evictions = counter("gateway_cache_evictions", "Entries evicted (LRU).", [])
    evictions.add_metric([], stats.get("evictions", 0))
    expired = counter("gateway_cache_expired", "Entries removed after their TTL.", [])
    expired.add_metric([], stats.get("expired", 0))
    return [entries, evictions, expired]
