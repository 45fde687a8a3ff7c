"""The lookup path of bench/cache_latency.py in process, without HTTP.

    python bench/cache_latency_component.py --quick   # under a minute

Run alone, it stores the real prompts (embedded here), fills the namespace to 10k entries,
and asks the first rewording of each stored prompt (some are hits, some misses): at
concurrency 1 and 64 with no budget to speak of (the cache's own capacity), then at 64
with the gateway's 50 ms lookup budget (`--budget-ms`), a client waiting 200 ms after each
lookup that is no hit (`--miss-ms`: the model answers it). JSON lines as
bench/cache_latency.py's component phase (`level: component`, reported by its
`report_component`), with `hit_fraction`, `budget_ms` and `miss_ms`. Run by
bench/cache_latency.py (full mode), the component phase asks the rewordings the gateway
found to hit, with no budget.

The same objects the gateway builds (gateway/compose/cache.py build_cache): the packaged MiniLM
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

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cache_latency_data as data  # noqa: E402
from bench.cache_latency_data import MODEL, TENANT, chat_body  # noqa: E402
from cache.policy import CacheInputs, cache_key  # noqa: E402

STAGES = ("embed", "search", "total")
UNBOUNDED_S = 60.0  # a lookup budget no lookup reaches: the cache's own capacity


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
    miss_s: float = 0.0  # a client waits this long after a lookup that is no hit (a model)


def measure(
    models: Models,
    snapshot: Path,
    max_entries: int,
    queries: list[str],
    runs: list[Run],
    hnsw: bool,
    budget_s: float = UNBOUNDED_S,
) -> list[ComponentResult]:
    """Loads `snapshot` into a fresh store and measures each run in turn, lookups within
    `budget_s` (the gateway's `cache.lookup_budget_ms`; by default no budget to speak of)."""

    async def main() -> list[ComponentResult]:
        return await _measure(models, snapshot, max_entries, queries, runs, hnsw, budget_s)

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


async def _measure(
    models: Models,
    snapshot: Path,
    max_entries: int,
    queries: list[str],
    runs: list[Run],
    hnsw: bool,
    budget_s: float,
) -> list[ComponentResult]:
    from cache.batching import BatchingEmbedder
    from cache.decision import DecisionSettings
    from cache.semantic import SemanticCache
    from cache.store_local import LocalCacheStore

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
                budget_s=budget_s,
                ttl_s=7 * 86400,
                on_stage=metrics.observe,
            )
            for run in runs:
                await _loop(cache, queries, replace(run, duration_s=run.warm_up_s), None)
                result = ComponentResult(run.concurrency, run.duration_s)
                before = metrics.snapshot()
                verifier.seconds = 0.0
                await _loop(cache, queries, run, result)
                after = metrics.snapshot()
                result.stage_s = {s: after[s][0] - before[s][0] for s in STAGES}
                result.lookups = int(after["total"][1] - before["total"][1])
                result.verifier_s = verifier.seconds
                results.append(result)
        await store.close()
        tasks.cancel_scope.cancel()
    return results


async def _loop(cache: Any, queries: list[str], run: Run, result: ComponentResult | None) -> None:
    keys = []
    for prompt in queries:
        key = cache_key(f"tenant:{TENANT}", MODEL, CacheInputs.of("chat", chat_body(prompt)))
        assert key is not None
        keys.append(key)
    deadline = time.perf_counter() + run.duration_s

    async def worker(w: int) -> None:
        n = w * len(keys) // run.concurrency
        while (sent := time.perf_counter()) < deadline:
            lookup = await cache.lookup(keys[n % len(keys)])
            n += 1
            done = time.perf_counter()
            answer = lookup.found
            tier = answer.tier if answer is not None else None
            if result is not None and tier == "semantic":
                result.latencies_ms.append((done - sent) * 1000.0)
                result.completed += done <= deadline
            elif result is not None:
                why = tier or lookup.failed or lookup.reason or "-"
                label = f"{'hit' if answer is not None else 'miss'}:{why}"
                result.other[label] = result.other.get(label, 0) + 1
            if tier != "semantic" and run.miss_s:
                await anyio.sleep(run.miss_s)  # the model answers what the cache did not

    async with anyio.create_task_group() as group:
        for w in range(run.concurrency):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 s rounds (default 6 s)")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="the bounded runs' budget")
    parser.add_argument("--miss-ms", type=float, default=200.0, help="a miss's model time")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.quick else 6.0
    models = Models()
    pairs = data.real_prompts(64)
    stored = data.embedded_entries(models.encoder.encode, [prompt for prompt, _ in pairs])
    queries = [rewordings[0] for _, rewordings in pairs]
    plans = [
        (UNBOUNDED_S, [Run(c, seconds, 1.0) for c in (1, 64)]),
        (args.budget_ms / 1000, [Run(64, seconds, 1.0, args.miss_ms / 1000)]),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-component-") as tmp:
        snapshot = Path(tmp) / "entries.bin"
        data.write_namespace(snapshot, 10_000, stored, filler_tokens=1)
        for budget_s, runs in plans:
            for result, run in zip(
                measure(models, snapshot, 12_000, queries, runs, False, budget_s), runs, strict=True
            ):
                _report(result, budget_s, run)
    return 0


def _report(result: ComponentResult, budget_s: float, run: Run) -> None:
    import torch

    from bench.cache_latency import emit, report_component

    bounded = budget_s < UNBOUNDED_S
    params = {
        "kind": "semantic",
        "concurrency": result.concurrency,
        "entries": 10_000,
        "level": "component",
        "index": "flat",
        "torch_threads": torch.get_num_threads(),
        "budget_ms": budget_s * 1000 if bounded else None,
        "miss_ms": run.miss_s * 1000,
    }
    report_component(result, params)  # as bench/cache_latency.py reports its component phase
    asked = result.completed + sum(result.other.values())
    emit("hit_fraction", round(result.completed / max(asked, 1), 4), "ratio", **params)


if __name__ == "__main__":
    sys.exit(main())
