"""Scale-to-zero backends: a replica provider and a cold-start manager per backend, wired
to the backend's pool, and where cold-start timelines go (the state store, metrics)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import orjson
import redis.asyncio as redis
from anyio.abc import TaskGroup
from redis.exceptions import RedisError

from backends.providers.replicas import Replica, ReplicaProvider
from gateway.events import EventLog, ScaleEvent
from gateway.forward import Pool
from gateway.metrics import Metrics
from gateway.settings import Backend, Settings
from warmpool.autoscale import ScalePolicy
from warmpool.layout import safe_name
from warmpool.manager import ColdStartFailed, ColdStartManager
from warmpool.staging import WeightStager
from warmpool.timeline import ColdStartRecord, ColdStartTimeline, JsonLinesSink, TimelineSink


def build_timeline(
    settings: Settings, metrics: Metrics, stack: contextlib.AsyncExitStack, tasks: TaskGroup
) -> ColdStartTimeline:
    sink: TimelineSink
    if settings.state.url == "memory":
        sink = JsonLinesSink(Path(settings.state.path).parent / "cold_starts.jsonl")
    else:
        stream_sink = RedisTimelineSink(settings.state.url, settings.state.prefix, tasks)
        stack.push_async_callback(stream_sink.close)
        sink = stream_sink
    return ColdStartTimeline(sink, metrics)


class RedisTimelineSink:
    """Cold-start records on a capped Redis Stream, `{prefix}:cold_starts`, for reports."""

    def __init__(self, url: str, prefix: str, tasks: TaskGroup) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=1.0)
        self._key = f"{{{prefix}}}:cold_starts"
        self._tasks = tasks

    def write(self, record: ColdStartRecord) -> None:
        self._tasks.start_soon(self._append, orjson.dumps(record.to_json()))

    async def _append(self, data: bytes) -> None:
        with contextlib.suppress(RedisError, OSError):  # reports lose a line, requests nothing
            await self._redis.xadd(self._key, {"record": data}, maxlen=10_000, approximate=True)

    async def close(self) -> None:
        await self._redis.aclose()


async def attach_manager(
    pool: Pool,
    backend: Backend,
    settings: Settings,
    stager: WeightStager | None,
    timeline: ColdStartTimeline,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
    scale_events: EventLog | None = None,
) -> ColdStartManager:
    provider = _provider(backend, settings)
    scaling = backend.scaling
    policy = ScalePolicy(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        target_queue_per_replica=scaling.target_queue_per_replica,
        idle_s=scaling.idle_s,
        last_replica_idle_s=scaling.last_replica_idle_s,
        warm_pool=scaling.warm_pool,
        stable_window_s=scaling.stable_window_s,
        panic_window_s=min(scaling.panic_window_s, scaling.stable_window_s),
    )

    def demand() -> int:
        snap = pool.scheduler.snapshot()
        return sum(snap.depth.values()) + snap.in_flight

    weights = backend.weights
    manager = ColdStartManager(
        backend.name,
        provider,
        policy,
        timeline=timeline,
        stager=stager if weights is not None else None,
        weights_uri=weights.uri if weights is not None else None,
        pin_weights=weights is not None and weights.staged == "always",
        demand=demand,
    )
    pool.manager = manager

    scale = ScaleRecorder(backend, scale_events)

    def ready_changed(ready: list[Replica]) -> None:
        pool.adopt(ready, manager.expected_cold_start_s())
        scale.ready(len(ready))

    def start_failed(exc: ColdStartFailed) -> None:
        pool.scheduler.drop_waiting("cold_start_failed", exc.retry_after_s)

    manager.on_ready_change.append(ready_changed)
    manager.on_start_failed.append(start_failed)
    pool.adopt([], manager.expected_cold_start_s())
    await manager.start(tasks)
    stack.push_async_callback(manager.close)
    return manager


class ScaleRecorder:
    """Records when a backend leaves zero ready replicas or reaches it, for the cold-start
    report's time at zero; it starts at zero (nothing is ready when the gateway starts)."""

    def __init__(self, backend: Backend, events: EventLog | None) -> None:
        self._backend = backend
        self._events = events
        self._at_zero = True
        self._record(0)

    def ready(self, count: int) -> None:
        if (count == 0) != self._at_zero:
            self._at_zero = count == 0
            self._record(count)

    def _record(self, count: int) -> None:
        if self._events is not None:
            b = self._backend
            self._events.record(ScaleEvent(time.time(), b.name, list(b.models), count))


def _provider(backend: Backend, settings: Settings) -> ReplicaProvider:
    if backend.kind == "kubernetes":
        return _kubernetes(backend)
    from backends.providers.process import ProcessLaunch, ProcessProvider, ProcessTimings

    weights = None
    if backend.weights is not None:
        weights = str(settings.staging.cache_dir / safe_name(backend.name))
    launch = ProcessLaunch(backend.command, weights=weights, ready_path=backend.ready_path)
    timings = ProcessTimings(ready_timeout_s=backend.scaling.ready_timeout_s)
    return ProcessProvider(backend.name, launch, timings)


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
