"""The composition root: builds every long-lived part from the settings, once, in the
app's lifespan, and wires them explicitly. Background work runs in the lifespan's task
group; every resource is closed by its exit stack. Nothing happens at import.

    state store, backend pools (+ cold-start managers, weight stager, timeline),
    quotas, the cache, events, authentication, the pipeline, backend health, admin API

Over 400 lines on purpose: it is the one place where every part is built and wired,
so that no other module constructs what it depends on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import secrets
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from prometheus_client.core import Metric

from backends.engine_sleep import VllmSleep
from backends.http import HttpTimeouts, HttpUpstream
from backends.launcher import LocalProcess, free_port
from backends.providers.replicas import Replica, ReplicaProvider
from cache.policy import PolicySettings
from cache.semantic import AnswerCache, NullCache, SemanticCache
from cache.store import CacheStore
from common.redis_client import RedisFactory
from gateway.accesslog import AccessLog
from gateway.admin.api import AdminApi
from gateway.admin.backends import Prewarmer
from gateway.admin.reports import build_report
from gateway.batches.blobs import open_blobs
from gateway.batches.execution import Context as BatchContext
from gateway.batches.files import Files
from gateway.batches.identity import BatchClass, LineAuthenticator
from gateway.batches.jobs import Jobs
from gateway.batches.models import new_id
from gateway.batches.routes import BatchApi
from gateway.batches.runner import Runner
from gateway.batches.store import open_store as open_batch_store
from gateway.body import BodyReader
from gateway.cache_http import HttpCache
from gateway.coalesce import Flights
from gateway.dialects.stored import MemoryResponses, RedisResponses, ResponseStore
from gateway.events import (
    REQUESTS,
    SCALE,
    EventLog,
    RedisTimelineSink,
    ScaleRecorder,
    open_sink,
)
from gateway.health import BackendHealth
from gateway.lifecycle import Lifecycle
from gateway.metrics import Metrics, counter, gauge
from gateway.pipeline import Pipeline
from gateway.settings import Backend, CacheSettings, EmbedderEndpoint, Scaling, Settings
from gateway.start_history import past_start_times
from gateway.tenancy.auth import AdminAuthenticator, Authenticator
from gateway.tenancy.keys import admin_key_hashes, configured_keys
from gateway.tenancy.operators import Operators, operator_key_hashes
from gateway.tenancy.quotas import LocalQuotas, QuotaEnforcer
from gateway.tenancy.quotas_redis import RedisQuotas
from gateway.tenancy.state import FileStateStore, StateStore, StateStoreError
from gateway.tenancy.state_redis import RedisStateStore
from gateway.tenancy.tenant_store import TenantDirectory
from gateway.tenancy.tenants import Catalog
from gateway.tracing import Tracing, TracingOptions, open_tracing
from gateway.traffic.breaker import BreakerCounts, CircuitBreaker
from gateway.traffic.capacity import CapacityConfig, ReplicaCapacity
from gateway.traffic.engine_metrics import EngineSample, metrics_url
from gateway.traffic.engine_metrics import scrape as scrape_engine
from gateway.traffic.gradient import GradientLimiter
from gateway.traffic.pool import Pool, Scraper
from gateway.traffic.replica_set import ReplicaHandle, ReplicaSet
from gateway.traffic.retry import RetryBudget, UpstreamRetryPolicy
from gateway.traffic.scheduler import FairScheduler
from warmpool.autoscale import ScalePolicy
from warmpool.layout import safe_name
from warmpool.manager import ColdStartManager
from warmpool.schedule import floor_at
from warmpool.staging import WeightStager
from warmpool.timeline import ColdStartTimeline, JsonLinesSink, TimelineSink

if TYPE_CHECKING:  # imported where they are built: a process backend, the cache's models
    from backends.providers.process import ProcessLaunch
    from cache.cross import PairModel
    from cache.decision import DecisionSettings
    from cache.embedder import Encoder
    from cache.verifier import PairVerifier

_log = logging.getLogger("gateway.compose")
GB = 1_000_000_000


NO_OPERATORS = Operators(frozenset())


@dataclass
class Parts:
    """What the lifespan builds; handlers receive it explicitly."""

    store: StateStore
    pools: dict[str, Pool]
    health: BackendHealth
    pipeline: Pipeline
    admin: AdminApi
    responses: ResponseStore  # the Responses API's stored responses
    batches: BatchApi | None = None  # None: `batches.enabled: false`
    operators: Operators = NO_OPERATORS  # who reads /metrics and /readyz's details


async def build(
    settings: Settings,
    env: dict[str, str],
    metrics: Metrics,
    access: AccessLog,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> Parts:
    clients = RedisFactory(settings.state.url)  # every part's Redis clients
    store = open_state_store(settings, clients)
    stack.push_async_callback(store.close)
    pools = await build_pools(settings, clients, metrics, stack, tasks)
    quotas = build_quotas(settings, clients, metrics, stack, tasks)
    cache = await build_cache(settings, clients, metrics, stack, tasks)
    catalog = Catalog(settings.model_routes(), settings.tenants)
    config_keys = configured_keys(settings.tenants, env)
    auth = Authenticator(store, config_keys)
    http_cache = HttpCache(cache, _policy(settings), metrics)
    events = open_event_log(settings, clients, REQUESTS, metrics, stack, tasks)
    tracing = _tracing(settings, env, stack)
    lifecycle = Lifecycle(quotas, http_cache, metrics, access, events, settings.pricing, tracing)
    limits = settings.limits
    body = BodyReader(limits.max_body_bytes, limits.body_timeout_s)
    # coalescing, fallbacks, degradation under overload
    routing = (Flights(tasks), settings.fallback_chains(), settings.degrade)
    path_parts = (pools, quotas, http_cache, settings.traffic, metrics, lifecycle, body, *routing)
    salt = _salt_secret(env)
    prices = settings.pricing
    pipeline = Pipeline(auth, catalog, *path_parts, salt_secret=salt, pricing=prices)
    # Batch lines take the same path, as their job's tenant and in the batch class.
    line_parts = (LineAuthenticator(catalog), BatchClass(catalog), *path_parts)
    lines = Pipeline(*line_parts, salt_secret=salt, pricing=prices)
    batches = await build_batches(
        settings, clients, lines, auth, catalog, metrics, access, stack, tasks
    )
    admin_keys = admin_key_hashes(settings.admin, env)  # once: a generated key is printed
    operators = Operators(admin_keys | operator_key_hashes(settings.admin, env))
    admin = AdminApi(
        AdminAuthenticator(admin_keys, auth),
        await _tenant_directory(store, catalog, tasks),
        store,
        quotas,
        cache,
        config_keys,
        access,
        lambda kind, query: build_report(kind, settings, clients, query),
        lambda: [pool.view() for pool in pools.values()],
        lambda tenant: metrics.cache_deleted(tenant, "admin"),
        Prewarmer(
            {name: pool.manager for name, pool in pools.items()},
            {b.name: b.scaling for b in settings.backends},
        ),
    )
    responses = open_response_store(settings, clients, stack)
    health = _health(settings, pools)
    return Parts(store, pools, health, pipeline, admin, responses, batches, operators)


def _tracing(
    settings: Settings, env: dict[str, str], stack: contextlib.AsyncExitStack
) -> Tracing | None:
    options = TracingOptions(settings.tracing.enabled, settings.tracing.endpoint)
    tracing = open_tracing(options, env)
    if tracing is not None:
        stack.callback(tracing.close)  # sends what is still buffered
    return tracing


def _salt_secret(env: dict[str, str]) -> bytes:
    """The key of the tenants' vLLM cache salts: $GATEWAY_CACHE_SALT_SECRET, which gateway
    replicas share so that a tenant's prefix-cache entries serve it through any of them;
    unset, a random one per process (one replica loses nothing but warm prefixes at a
    restart)."""
    configured = env.get("GATEWAY_CACHE_SALT_SECRET")
    return configured.encode() if configured else secrets.token_bytes(32)


def open_response_store(
    settings: Settings, clients: RedisFactory, stack: contextlib.AsyncExitStack
) -> ResponseStore:
    config = settings.responses
    bounds = (config.ttl_s, config.max_per_tenant, config.max_bytes_per_tenant)
    if settings.state.url == "memory":
        return MemoryResponses(*bounds)
    store = RedisResponses(clients, settings.state.prefix, *bounds)
    stack.push_async_callback(store.close)
    return store


def open_state_store(settings: Settings, clients: RedisFactory) -> StateStore:
    if settings.state.url == "memory":
        return FileStateStore(settings.state.path)
    return RedisStateStore(clients, settings.state.prefix)


async def build_batches(
    settings: Settings,
    clients: RedisFactory,
    lines: Pipeline,
    auth: Authenticator,
    catalog: Catalog,
    metrics: Metrics,
    access: AccessLog,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> BatchApi | None:
    """Batch jobs: their store and files' bytes, the runner (in the task group: at shutdown
    it lets lines in flight finish first), and the API."""
    config = settings.batches
    if not config.enabled:
        return None
    store = await open_batch_store(settings, clients)
    stack.push_async_callback(store.close)
    blobs = await open_blobs(settings)
    stack.push_async_callback(blobs.close)
    shared = anyio.Semaphore(config.max_concurrency)
    context = BatchContext(store, lines.openai, config, shared, new_id("runner_"))
    max_body = settings.limits.max_body_bytes
    runner = Runner(context, blobs, catalog, max_body)
    metrics.add_snapshots(runner.collect)
    tasks.start_soon(runner.run)
    files = Files(store, blobs, catalog, config, max_body)
    jobs = Jobs(store, files, config, runner.wake)
    timeout_s = settings.limits.body_timeout_s
    return BatchApi(auth, catalog, files, jobs, access, config.max_file_bytes, timeout_s)


def open_event_log(
    settings: Settings,
    clients: RedisFactory,
    kind: str,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> EventLog:
    sink = open_sink(settings, clients, kind)
    events = EventLog(sink, kind=kind, on_drop=metrics.events_dropped)
    stack.push_async_callback(events.close)
    tasks.start_soon(events.run)
    return events


def build_stager(settings: Settings) -> WeightStager:
    from warmpool.s3 import S3WeightSource

    staging = settings.staging
    factory = S3WeightSource.factory(
        endpoint_url=staging.s3.endpoint_url,
        region=staging.s3.region,
        access_key_id=staging.s3.access_key_id,
        secret_access_key=staging.s3.secret_access_key,
    )
    return WeightStager(
        staging.cache_dir,
        factory,
        int(staging.disk_budget_gb * GB),
        chunk_bytes=staging.chunk_mb * 1024 * 1024,
        parallelism=staging.parallelism,
        readahead=staging.readahead,
    )


# -- backend pools --------------------------------------------------------------------


async def build_pools(
    settings: Settings,
    clients: RedisFactory,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    scalable = [b for b in settings.backends if b.kind != "http"]
    if scalable:
        await _scale_to_zero(settings, clients, scalable, pools, metrics, stack, tasks)
    for backend in settings.backends:
        if backend.kind != "http":
            continue
        base_url = backend.base_url
        if backend.launch is not None:
            base_url, process = _launch_spec(backend)
            stack.push_async_callback(process.stop)
            await process.start(backend.launch.start_timeout_s)
        pool = _pool(backend, settings, metrics, stack, tasks)
        urls = [base_url, *backend.base_urls] if base_url else backend.base_urls
        pool.adopt([Replica(f"{backend.name}/{i}", url) for i, url in enumerate(urls)])
        pools[backend.name] = pool
    metrics.add_snapshots(lambda: _pool_metrics(pools))
    return pools


def _pool(
    backend: Backend,
    settings: Settings,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> Pool:
    traffic = settings.traffic

    def waited(priority: str, seconds: float) -> None:
        metrics.queue_waited(backend.name, priority, seconds)

    def breaker(counts: BreakerCounts) -> CircuitBreaker | None:
        if not traffic.breaker:
            return None
        return CircuitBreaker(
            traffic.breaker_failures, open_s=traffic.breaker_open_s, counts=counts
        )

    scheduler = FairScheduler(
        0,
        traffic.max_queue,
        output_weight=traffic.output_weight,
        on_wait=waited,
        prefill_chunk_tokens=backend.prefill_chunk_tokens,
        off=frozenset(traffic.controllers_off),
    )
    concurrency = backend.concurrency
    replicas = ReplicaSet(
        lambda url: _upstream(backend, url),
        breaker,
        tasks,
        lambda: _capacity(backend),
        lambda url: metrics_url(url, concurrency.metrics_path),
    )
    stack.push_async_callback(replicas.close)
    budget = RetryBudget(traffic.retry_budget_ratio, traffic.retry_min_per_s)
    retry = backend.retry or traffic.retry
    policy = UpstreamRetryPolicy(
        retry.max_attempts, retry.base_s, retry.cap_s, retry.max_retry_after_s
    )
    pool = Pool(
        backend.name,
        replicas,
        scheduler,
        budget,
        metrics,
        policy,
        engine_priority=backend.priority_scheduling,
        cache_salt=backend.engine == "vllm",
        affinity=backend.affinity,
    )
    if concurrency.mode == "adaptive":
        tasks.start_soon(pool.run_capacity, _scraper(backend), concurrency.interval_s)
    return pool


def _capacity(backend: Backend) -> ReplicaCapacity:
    """A replica's limit: from its engine's metrics where it has them, else from latency.
    Not both: in front of vLLM the latency limiter held the limit at a third of what the
    engine ran, queueing interactive requests here (docs/slo-goodput.md, the ablation)."""
    c = backend.concurrency
    config = CapacityConfig(
        c.mode, backend.max_concurrency, c.initial, c.min, backend.engine, c.kv_high
    )
    if c.mode == "fixed" or backend.engine != "none":
        return ReplicaCapacity(config)
    gradient = GradientLimiter(
        min(c.initial, backend.max_concurrency),
        min_limit=c.min,
        min_pin=max(c.min, min(c.initial, backend.max_concurrency) / 2),
        max_limit=backend.max_concurrency,
        ttft_tolerance=c.latency_tolerance,
    )
    return ReplicaCapacity(config, gradient)


def _scraper(backend: Backend) -> Scraper:
    """Reads a replica engine's /metrics (None for an engine without, or a failed read)."""
    engine = backend.engine
    timeout_s = max(0.1, backend.concurrency.interval_s * 2)

    async def scrape(handle: ReplicaHandle) -> EngineSample | None:
        if engine == "none" or not handle.metrics_url:
            return None
        return await scrape_engine(handle.upstream, handle.metrics_url, engine, timeout_s)

    return scrape


async def _scale_to_zero(
    settings: Settings,
    clients: RedisFactory,
    backends: list[Backend],
    pools: dict[str, Pool],
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> None:
    """Pools whose replicas a cold-start manager starts and stops."""
    timeline = _timeline(settings, clients, metrics, stack, tasks)
    scale_events = open_event_log(settings, clients, SCALE, metrics, stack, tasks)
    history = await past_start_times(settings, clients)
    stager = None
    if any(b.weights is not None for b in backends):
        stager = build_stager(settings)
        await stager.open()
        stack.push_async_callback(stager.aclose)
    for backend in backends:
        pool = _pool(backend, settings, metrics, stack, tasks)
        manager = _manager(pool, backend, settings, stager, timeline, history.get(backend.name))
        pool.attach(manager)
        scale = ScaleRecorder(backend.name, list(backend.models), scale_events)
        manager.on_ready_change.append(scale.ready)
        manager.on_sleep_change.append(scale.asleep)
        await manager.start(tasks)
        stack.push_async_callback(manager.close)
        pools[backend.name] = pool


def _manager(
    pool: Pool,
    backend: Backend,
    settings: Settings,
    stager: WeightStager | None,
    timeline: ColdStartTimeline,
    start_history: list[float] | None = None,  # its past starts' seconds, oldest first
) -> ColdStartManager:
    s = backend.scaling
    policy = ScalePolicy(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        target_queue_per_replica=s.target_queue_per_replica or 2.0,
        idle_s=s.idle_s,
        last_replica_idle_s=s.last_replica_idle_s,
        warm_pool=s.warm_pool,
        stable_window_s=s.stable_window_s,
        panic_window_s=min(s.panic_window_s, s.stable_window_s),
        sleep_s=s.sleep_s if backend.sleep else None,
    )

    def capacity() -> float | None:
        return pool.learned_per_replica() if s.target_queue_per_replica is None else None

    weights = backend.weights
    return ColdStartManager(
        backend.name,
        _provider(backend, settings),
        policy,
        timeline=timeline,
        stager=stager if weights is not None else None,
        weights_uri=weights.uri if weights is not None else None,
        pin_weights=weights is not None and weights.staged == "always",
        load=pool.replicas.load,
        demand=pool.demand,
        capacity=capacity,
        floor=_scheduled_floor(s),
        start_history=start_history or (),
        engine_sleep=_engine_sleep(backend),
    )


def _engine_sleep(backend: Backend) -> VllmSleep | None:
    """vLLM's sleep endpoints on the backend's replicas (`sleep: true` needs engine vllm)."""
    if not backend.sleep:
        return None
    key = backend.api_key.get_secret_value() if backend.api_key is not None else None
    return VllmSleep(backend.scaling.ready_timeout_s, key)


def _scheduled_floor(scaling: Scaling) -> Callable[[], int]:
    """`scaling.schedule` read at the wall-clock time of each decision."""
    plan = scaling.plan()
    if not plan.windows:
        return lambda: 0
    return lambda: floor_at(plan, datetime.now(UTC))


def _timeline(
    settings: Settings,
    clients: RedisFactory,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> ColdStartTimeline:
    sink: TimelineSink
    if settings.state.url == "memory":
        sink = JsonLinesSink(Path(settings.state.path).parent / "cold_starts.jsonl")
    else:
        prefix = settings.state.prefix
        stream_sink = RedisTimelineSink(clients, prefix, tasks, metrics.events_dropped)
        stack.push_async_callback(stream_sink.close)
        sink = stream_sink
    return ColdStartTimeline(sink, metrics)


def _provider(backend: Backend, settings: Settings) -> ReplicaProvider:
    if backend.kind == "kubernetes":
        return _kubernetes(backend)
    from backends.providers.process import ProcessLaunch, ProcessProvider, ProcessTimings

    weights = None
    if backend.weights is not None:
        weights = str(settings.staging.cache_dir / safe_name(backend.name))
    launch = ProcessLaunch(
        backend.command, env=backend.env, weights=weights, ready_path=backend.ready_path
    )
    if backend.engine == "vllm":
        launch = _vllm_launch(launch, backend, settings)
    timings = ProcessTimings(ready_timeout_s=backend.scaling.ready_timeout_s)
    return ProcessProvider(backend.name, launch, timings)


def _vllm_launch(launch: ProcessLaunch, backend: Backend, settings: Settings) -> ProcessLaunch:
    """vLLM's output goes to a file of its own (`engine-logs/` beside the state file), from
    which the cold-start report learns where each start went (backends/vllm_startup.py)."""
    from backends.vllm_startup import phases

    folder = Path(settings.state.path).parent / "engine-logs"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_file = folder / f"{safe_name(backend.name)}.log"
    return replace(launch, log_file=log_file, start_phases=phases)


def _kubernetes(backend: Backend) -> ReplicaProvider:
    from backends.providers.kubernetes import (
        EndpointDiscovery,
        KubernetesProvider,
        ScaleTarget,
        api_client,
    )

    target = backend.kubernetes
    assert target is not None
    client = api_client(
        target.server,
        target.token.get_secret_value(),
        target.namespace,
        ca_file=str(target.ca_file) if target.ca_file else None,
    )
    return KubernetesProvider(
        client,
        target.namespace,
        ScaleTarget(target.deployment),
        EndpointDiscovery(target.service, port=target.port),
        name=backend.name,
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


def _health(settings: Settings, pools: dict[str, Pool]) -> BackendHealth:
    probes = {
        name: next(iter(pool.replicas.handles.values())).upstream
        for name, pool in pools.items()
        if pool.manager is None and pool.replicas.handles
    }
    return BackendHealth(probes, {b.name: b.health_path for b in settings.backends})


# -- quotas, cache, tenants -----------------------------------------------------------


def build_quotas(
    settings: Settings,
    clients: RedisFactory,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> QuotaEnforcer:
    lease_s = settings.state.quota_lease_s
    if settings.state.url == "memory":
        return LocalQuotas(lease_ttl_s=lease_s)
    quotas = RedisQuotas(
        clients,
        settings.state.prefix,
        lease_ttl_s=lease_s,
        on_fallback=metrics.quota_fallback,
    )
    stack.push_async_callback(quotas.close)
    tasks.start_soon(quotas.run)
    return quotas


async def build_cache(
    settings: Settings,
    clients: RedisFactory,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> AnswerCache:
    config = settings.cache
    if not config.enabled:
        return NullCache()
    from cache.batching import BatchingEmbedder

    verifier: PairVerifier | None = None  # none reads a remote embedder's candidates
    pair_model: PairModel | None = None
    if config.embedder_endpoint is None:
        encoder, verifier, pair_model, decision, space = await _local_embedder(config)
    else:
        encoder, decision, space = await _remote_embedder(config, config.embedder_endpoint)
    embedder = BatchingEmbedder(
        encoder, window_ms=config.batch_window_ms, max_batch=config.max_batch
    )
    await embedder.start()
    stack.push_async_callback(embedder.close)
    await embedder.embed("warm up")  # the first forward pass is several times slower
    store = _cache_store(settings, clients, encoder.dimension, space)
    await store.start(tasks)
    stack.push_async_callback(store.close)
    cache = SemanticCache(
        store,
        embedder,
        verifier,
        decision,
        tasks,
        pair_model=pair_model,
        budget_s=config.lookup_budget_ms / 1000,
        ttl_s=config.ttl_s,
        semantic=config.semantic,
        on_stage=metrics.cache_stage,
        on_fail=metrics.cache_fail_open,
        on_bad_hit=lambda hit: metrics.cache_bad_hit_label(hit.tenant, hit.labelled),
        on_explored=metrics.cache_explored,
        rng=random.Random(),  # noqa: S311  (the error-bounded draws; nothing secret)
    )
    metrics.add_snapshots(
        lambda: _cache_metrics(store.stats(), embedder.stats(), cache.lookup_timer_s())
    )
    return cache


async def _local_embedder(
    config: CacheSettings,
) -> tuple[Encoder, PairVerifier, PairModel, DecisionSettings, str | None]:
    """The packaged MiniLM (or `model_path`), its pair verifier and pair model."""
    from cache.cross import PairModel
    from cache.decision import DecisionSettings
    from cache.embedder import load_embedder
    from cache.verifier import PairVerifier

    load = functools.partial(
        load_embedder,
        config.model_path,
        config.device,
        backend=config.embedder,
        onnx_dir=config.path / "onnx",  # where the model's folder is read-only
    )
    encoder = await anyio.to_thread.run_sync(load)
    verifier = await anyio.to_thread.run_sync(PairVerifier.load)
    pair_model = await anyio.to_thread.run_sync(PairModel.load)
    return encoder, verifier, pair_model, DecisionSettings(), None


async def _remote_embedder(
    config: CacheSettings, endpoint: EmbedderEndpoint
) -> tuple[Encoder, DecisionSettings, str]:
    """The deployment's embedder, its decision at the calibrated threshold, and the name of
    its vector space (its entries are kept apart from any other embedder's). Without a
    calibration made for it, its semantic tier is off: no hit is served on a scale
    nobody measured."""
    from cache.calibration import Calibration
    from cache.decision import DecisionSettings
    from cache.remote_embedder import RemoteEncoder

    key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
    make = functools.partial(
        RemoteEncoder, endpoint.base_url, endpoint.model, key, endpoint.timeout_s
    )
    encoder = await anyio.to_thread.run_sync(make)
    calibration = Calibration.load(config.calibration_path())
    threshold = calibration.threshold if calibration is not None else None
    if calibration is not None and calibration.embedder != encoder.identity:
        threshold = None
    if threshold is None:
        _log.warning(
            "cache: no calibration for the embedder at %s (model %s): the semantic tier is "
            "off until `gateway cache calibrate` makes one",
            endpoint.base_url,
            endpoint.model,
        )
        return encoder, DecisionSettings(semantic_tier=False), encoder.identity
    decision = DecisionSettings(similarity_floor=threshold, calibrated_threshold=threshold)
    return encoder, decision, encoder.identity


def _policy(settings: Settings) -> PolicySettings:
    config = settings.cache
    return PolicySettings(config.max_temperature, frozenset(config.cacheable_tools))


def _cache_store(
    settings: Settings, clients: RedisFactory, dim: int, space: str | None
) -> CacheStore:
    """The entries of the embedder's vector space (`space`: a remote embedder's; None: the
    packaged MiniLM's, where they always were)."""
    from cache.store import LocalCacheStore
    from cache.store_redis import RedisCacheStore

    config = settings.cache
    most = config.max_entries_per_namespace
    if settings.state.url == "memory":
        name = "entries.bin" if space is None else f"entries-{space}.bin"
        return LocalCacheStore(config.path / name, dim, most)
    prefix = settings.state.prefix if space is None else f"{settings.state.prefix}:{space}"
    return RedisCacheStore(clients, prefix, dim, most)


async def _tenant_directory(
    store: StateStore, catalog: Catalog, tasks: TaskGroup
) -> TenantDirectory:
    """Tenants of the admin API, loaded before serving and then polled."""
    directory = TenantDirectory(store, catalog)
    try:
        await directory.refresh()
    except StateStoreError as exc:
        # Serve the configured tenants; the poller loads the rest once the store answers.
        _log.warning("tenants not loaded from the state store at start: %s", exc)
    tasks.start_soon(directory.run)
    return directory


# -- metrics read at scrape time ------------------------------------------------------


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


def _cache_metrics(
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
