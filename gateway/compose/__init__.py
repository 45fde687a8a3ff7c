"""The composition root: builds every long-lived part from the settings, once, in the
app's lifespan, and wires them explicitly. Background work runs in the lifespan's task
group; every resource is closed by its exit stack. Nothing happens at import.

    state store, backend pools (+ cold-start managers, weight stager, timeline),
    quotas, the cache, events, authentication, the pipeline, backend health, admin API

It is the one place where every part is built and wired, so that no other module
constructs what it depends on; by what it builds:

    __init__   `build`: the state store, quotas, tenants, keys, the pipeline, the admin API
    pools      the backend pools: replicas, capacity, cold starts and scaling, health
    cache      the semantic cache: its embedder, verifier, pair model, decision and store
    events     the report events' log
    metrics    what the metrics read from the pools and the cache at scrape time
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from cache.in_flight import InFlight
from cache.semantic import Lookup
from common.redis_client import RedisFactory
from gateway.accesslog import AccessLog
from gateway.admin.api import AdminApi
from gateway.admin.backends import Prewarmer
from gateway.admin.reports import build_report
from gateway.batches.blobs import open_blobs
from gateway.batches.execution import Context as BatchContext
from gateway.batches.files import Files
from gateway.batches.identity import BatchClass
from gateway.batches.jobs import Jobs
from gateway.batches.models import new_id
from gateway.batches.routes import BatchApi
from gateway.batches.runner import Runner
from gateway.batches.store import open_store as open_batch_store
from gateway.body import BodyReader
from gateway.cache_http import HttpCache
from gateway.coalesce import Flight, Flights
from gateway.compose.cache import _policy, build_cache
from gateway.compose.events import open_event_log
from gateway.compose.pools import _health, build_pools
from gateway.dialects.stored import MemoryResponses, RedisResponses, ResponseStore
from gateway.events import REQUESTS
from gateway.health import BackendHealth
from gateway.lifecycle import Lifecycle
from gateway.metrics import Metrics
from gateway.pipeline import Pipeline
from gateway.settings import Settings
from gateway.tenancy.auth import AdminAuthenticator, Authenticator
from gateway.tenancy.keys import admin_key_hashes, configured_keys
from gateway.tenancy.operators import Operators, operator_key_hashes
from gateway.tenancy.quotas import QuotaEnforcer
from gateway.tenancy.quotas_local import LocalQuotas
from gateway.tenancy.quotas_redis import RedisQuotas
from gateway.tenancy.state import FileStateStore, StateStore, StateStoreError
from gateway.tenancy.state_redis import RedisStateStore
from gateway.tenancy.tenant_store import TenantDirectory
from gateway.tenancy.tenants import Catalog
from gateway.tracing import Tracing, TracingOptions, open_tracing
from gateway.traffic.pool import Pool

_log = logging.getLogger("gateway.compose")


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
    # Lookups, upstream calls and stores under way, by exact key: the cache's and the flights'.
    in_flight: InFlight[Lookup, Flight] = InFlight()
    cache = await build_cache(settings, clients, metrics, stack, tasks, in_flight)
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
    routing = (Flights(tasks, in_flight), settings.fallback_chains(), settings.degrade)
    path_parts = (pools, quotas, http_cache, settings.traffic, metrics, lifecycle, body, *routing)
    salt = _salt_secret(env)
    prices = settings.pricing
    pipeline = Pipeline(auth, catalog, *path_parts, salt_secret=salt, pricing=prices)
    # Batch lines take the same path, as their job's tenant and in the batch class
    # (`Pipeline.line`: no key to authenticate, the job's owner is the line's tenant).
    lines = Pipeline(auth, BatchClass(catalog), *path_parts, salt_secret=salt, pricing=prices)
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
    context = BatchContext(store, lines.line, config, shared, new_id("runner_"))
    max_body = settings.limits.max_body_bytes
    runner = Runner(context, blobs, catalog, max_body)
    metrics.add_snapshots(runner.collect)
    tasks.start_soon(runner.run)
    files = Files(store, blobs, catalog, config, max_body)
    jobs = Jobs(store, files, config, runner.wake)
    timeout_s = settings.limits.body_timeout_s
    return BatchApi(auth, catalog, files, jobs, access, config.max_file_bytes, timeout_s)


# -- quotas, tenants --------------------------------------------------------------------


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
