"""The backend pools: replicas, their capacity, cold starts and scaling, and health (for
`gateway.compose.build`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from anyio.abc import TaskGroup

from backends.engine_sleep import VllmSleep
from backends.http import HttpTimeouts, HttpUpstream
from backends.launcher import LocalProcess, free_port
from backends.providers.replicas import Replica, ReplicaProvider
from common.redis_client import RedisFactory
from gateway.compose.events import open_event_log
from gateway.compose.metrics import pool_metrics
from gateway.events import (
    SCALE,
    RedisTimelineSink,
    ScaleRecorder,
)
from gateway.health import BackendHealth
from gateway.metrics import Metrics
from gateway.settings import Backend, Scaling, Settings
from gateway.start_history import past_start_times
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

if TYPE_CHECKING:  # imported where one is built: most deployments have no process backend
    from backends.providers.process import ProcessLaunch


GB = 1_000_000_000


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
    metrics.add_snapshots(lambda: pool_metrics(pools))
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
        native_paths=frozenset(["/messages"] if backend.native_messages else []),
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
        HttpTimeouts(t.connect_s, t.read_s, t.total_s, t.idle_s),
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
    launch = backend.launch
    return base_url, LocalProcess(command, launch.env, root + launch.ready_path, launch.cpus)


def _health(settings: Settings, pools: dict[str, Pool]) -> BackendHealth:
    probes = {
        name: next(iter(pool.replicas.handles.values())).upstream
        for name, pool in pools.items()
        if pool.manager is None and pool.replicas.handles
    }
    return BackendHealth(probes, {b.name: b.health_path for b in settings.backends})
