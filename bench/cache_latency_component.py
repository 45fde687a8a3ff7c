"""The lookup path of bench/cache_latency.py in process, without HTTP.

The same objects the gateway builds (gateway/compose.py build_cache): the packaged MiniLM
(`load_embedder()`) behind a `BatchingEmbedder` with the default window and batch size,
the `PairVerifier`, `DecisionSettings()`, and a `LocalCacheStore` loaded from a snapshot
file; lookups go through `SemanticCache.lookup`, the gateway's own code. `concurrency`
closed-loop tasks look up reworded prompts for `duration_s`; only semantic hits count.

Where the time goes comes from the gateway's own stage histograms (a `Metrics` of the
bench's): `embed` (waiting for and running the batched forward pass), `search`
(`store.nearest`) and `total` (the whole lookup); the verifier's time is measured by a
wrapper around it. The rest of `total` is the exact and normalised key probes and the
decision's guards.

The store's sweeper is held off (a long interval), so nothing rebuilds or snapshots
during a measurement; `hnsw=True` runs one sweep first, which converts a namespace above
`IndexConfig.flat_max` entries to HNSW, as the gateway's sweeper does a second after start.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from bench.cache_latency_data import MODEL, TENANT, chat_body
from cache.policy import CacheInputs, cache_key

STAGES = ("embed", "search", "total")


@dataclass
class ComponentResult:
    concurrency: int
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    completed: int = 0  # semantic hits within duration_s
    other: dict[str, int] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=dict)  # summed over measured lookups
    lookups: int = 0  # lookups the stage sums cover (all of them, hits or not)
    verifier_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0


class TimedVerifier:
    """The PairVerifier, with the time spent in it added up."""

    def __init__(self, verifier: Any) -> None:
        self._verifier = verifier
        self.seconds = 0.0

    @property
    def threshold(self) -> float:
        return float(self._verifier.threshold)

    def score_pairs(self, asks: Sequence[tuple[bytes, Sequence[bytes]]]) -> list[list[float]]:
        started = time.perf_counter()
        try:
            return list(self._verifier.score_pairs(asks))
        finally:
            self.seconds += time.perf_counter() - started


class Models:
    """The embedding model and the verifier, loaded once (blocking, ~10 s)."""

    def __init__(self) -> None:
        from cache.embedder import load_embedder
        from cache.verifier import PairVerifier

        self.encoder = load_embedder()
        self.verifier = PairVerifier.load()
        self.encoder.encode(["warm up"])

    @property
    def dim(self) -> int:
        return self.encoder.dimension


@dataclass(frozen=True)
class Run:
    concurrency: int
    duration_s: float
    warm_up_s: float


def measure(
    models: Models,
    snapshot: Path,
    max_entries: int,
    queries: list[str],
    runs: list[Run],
    hnsw: bool,
) -> list[ComponentResult]:
    """Loads `snapshot` into a fresh store and measures each run in turn."""

    async def main() -> list[ComponentResult]:
        return await _measure(models, snapshot, max_entries, queries, runs, hnsw)

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


async def _measure(
    models: Models,
    snapshot: Path,
    max_entries: int,
    queries: list[str],
    runs: list[Run],
    hnsw: bool,
) -> list[ComponentResult]:
    from cache.batching import BatchingEmbedder
    from cache.decision import DecisionSettings
    from cache.semantic import SemanticCache
    from cache.store import LocalCacheStore

    verifier = TimedVerifier(models.verifier)
    metrics = StageTimes()
    store = LocalCacheStore(snapshot, models.dim, max_entries, sweep_interval_s=1e9)
    results = []
    async with anyio.create_task_group() as tasks:
        await store.start(tasks)
        if hnsw:
            await store.sweep()
        # The gateway's defaults (gateway/settings.py CacheSettings).
        embedder = BatchingEmbedder(models.encoder, window_ms=2.0, max_batch=32)
        async with embedder:
            # The timing wrapper stands in for the PairVerifier (the cache only needs
            # `threshold` and `score_pairs`).
            timed: Any = verifier
            cache = SemanticCache(
                store,
                embedder,
                timed,
                DecisionSettings(),
                tasks,
                budget_s=60.0,
                ttl_s=7 * 86400,
                on_stage=metrics.observe,
            )
            for run in runs:
                await _loop(cache, queries, run.concurrency, run.warm_up_s, None, verifier)
                result = ComponentResult(run.concurrency, run.duration_s)
                before = metrics.snapshot()
                verifier.seconds = 0.0
                await _loop(cache, queries, run.concurrency, run.duration_s, result, verifier)
                after = metrics.snapshot()
                result.stage_s = {s: after[s][0] - before[s][0] for s in STAGES}
                result.lookups = int(after["total"][1] - before["total"][1])
                result.verifier_s = verifier.seconds
                results.append(result)
        await store.close()
        tasks.cancel_scope.cancel()
    return results


async def _loop(
    cache: Any,
    queries: list[str],
    concurrency: int,
    seconds: float,
    result: ComponentResult | None,
    verifier: TimedVerifier,
) -> None:
    keys = []
    for prompt in queries:
        key = cache_key(f"tenant:{TENANT}", MODEL, CacheInputs.of("chat", chat_body(prompt)))
        assert key is not None
        keys.append(key)
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        n = w * len(keys) // concurrency
        while (sent := time.perf_counter()) < deadline:
            lookup = await cache.lookup(keys[n % len(keys)])
            n += 1
            done = time.perf_counter()
            if result is None:
                continue
            answer = lookup.found
            tier = answer.tier if answer is not None else None
            if tier == "semantic":
                result.latencies_ms.append((done - sent) * 1000.0)
                result.completed += done <= deadline
            else:
                label = f"{'hit' if answer is not None else 'miss'}:{tier or '-'}"
                result.other[label] = result.other.get(label, 0) + 1

    async with anyio.create_task_group() as group:
        for w in range(concurrency):
            group.start_soon(worker, w)


class StageTimes:
    """Seconds and counts per lookup stage, from the cache's own `on_stage` hook."""

    def __init__(self) -> None:
        self._seen = {stage: (0.0, 0.0) for stage in STAGES}

    def observe(self, stage: str, seconds: float) -> None:
        total, count = self._seen.get(stage, (0.0, 0.0))
        self._seen[stage] = (total + seconds, count + 1)

    def snapshot(self) -> dict[str, tuple[float, float]]:
        return dict(self._seen)
