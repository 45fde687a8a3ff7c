"""The semantic cache: its embedder (the packaged MiniLM or the deployment's), verifier,
pair model, decision and store, and its metrics (for `gateway.compose.build`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import random
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from cache.in_flight import InFlight
from cache.policy import PolicySettings
from cache.semantic import AnswerCache, Lookup, NullCache, SemanticCache
from cache.store import CacheStore
from common.redis_client import RedisFactory
from gateway.compose.metrics import cache_metrics
from gateway.metrics import Metrics
from gateway.settings import CacheSettings, EmbedderEndpoint, Settings

if TYPE_CHECKING:  # imported where they are built (with the cache only)
    from cache.cross import PairModel
    from cache.decision import DecisionSettings
    from cache.embedder import Encoder
    from cache.verifier import PairVerifier


_log = logging.getLogger("gateway.compose")


async def build_cache(
    settings: Settings,
    clients: RedisFactory,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
    in_flight: InFlight[Lookup, Any],
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
        in_flight=in_flight,
    )
    metrics.add_snapshots(
        lambda: cache_metrics(store.stats(), embedder.stats(), cache.lookup_timer_s())
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
    from cache.store_local import LocalCacheStore
    from cache.store_redis import RedisCacheStore

    config = settings.cache
    most = config.max_entries_per_namespace
    if settings.state.url == "memory":
        name = "entries.bin" if space is None else f"entries-{space}.bin"
        return LocalCacheStore(config.path / name, dim, most)
    prefix = settings.state.prefix if space is None else f"{settings.state.prefix}:{space}"
    return RedisCacheStore(clients, prefix, dim, most)
