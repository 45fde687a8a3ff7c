"""SemanticCache without HTTP: the tiers, background stores that are never dropped, the
pair model's second opinion, and failing open past the lookup budget or when the embedder
is saturated. The real MiniLM, verifier, pair model and local store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson

from cache.batching import BatchingEmbedder
from cache.cross import PairModel
from cache.decision import DecisionSettings, Verifier
from cache.policy import CacheInputs, CacheKey, cache_key
from cache.scoring import PairScorer
from cache.semantic import Answer, SemanticCache
from cache.store_local import LocalCacheStore
from cache.torch_encoder import SentenceEncoder
from cache.verifier import PairVerifier
from tests.cache.slow_encoder import SlowEncoder
from tests.cache.test_scoring import Counting

ANSWER = orjson.dumps(
    {"choices": [{"index": 0, "message": {"content": "Use a tuple."}, "finish_reason": "stop"}]}
)


def key(prompt: str) -> CacheKey:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    made = cache_key("tenant:t", "m", CacheInputs.of("chat", body))
    assert made is not None
    return made


@asynccontextmanager
async def semantic_cache(
    tmp_path: Path,
    encoder: SentenceEncoder,
    verifier: PairScorer,
    budget_s: float = 30.0,
    failures: list[str] | None = None,
    embedder: BatchingEmbedder | None = None,
    pair_model: Verifier | None = None,
    stages: list[str] | None = None,
) -> AsyncIterator[SemanticCache]:
    store = LocalCacheStore(tmp_path / "entries.bin", encoder.dimension, 100)
    embedder = embedder or BatchingEmbedder(encoder)
    async with embedder, anyio.create_task_group() as tasks:
        await store.start(tasks)
        yield SemanticCache(
            store,
            embedder,
            verifier,
            DecisionSettings(),
            tasks,
            pair_model=pair_model,
            budget_s=budget_s,
            ttl_s=3600,
            on_stage=lambda stage, seconds: (stages if stages is not None else []).append(stage),
            on_fail=(failures if failures is not None else []).append,
        )
        await store.close()
        tasks.cancel_scope.cancel()


async def test_a_stored_answer_is_found_by_every_tier(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    failures: list[str] = []
    async with semantic_cache(tmp_path, encoder, verifier, failures=failures) as cache:
        asked = key("How do I reset my password?")
        assert (await cache.lookup(asked)).found is None
        # Nothing else to start: a store is never dropped for want of a task group.
        cache.store_later(Answer(asked, "t", "m", ANSWER))
        cache.store_later(Answer(key("an error"), "t", "m", b'{"error": {"message": "x"}}'))

        async def hit_tier(prompt: str) -> str | None:
            found = (await cache.lookup(key(prompt))).found
            return found.tier if found is not None else None

        # Served at once, from memory, while the store is under way.
        assert await hit_tier("How do I reset my password?") == "exact"
        with anyio.fail_after(10):
            while await hit_tier("how do I reset my password") != "normalized":
                await anyio.sleep(0.02)
        assert failures == []
        assert await hit_tier("How do I reset my password?") == "exact"
        assert await hit_tier("How can I reset my password?") == "semantic"
        assert await hit_tier("How do I delete my account?") is None
        assert await hit_tier("an error") is None  # errors are never stored


async def test_lookups_resumed_by_one_embedder_pass_share_one_verifier_pass(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    counting = Counting(verifier)
    stored = [f"How do I {task}?" for task in ("reset my password", "delete my account")]
    async with semantic_cache(tmp_path, encoder, counting) as cache:
        for prompt in stored:
            cache.store_later(Answer(key(prompt), "t", "m", ANSWER))
        with anyio.fail_after(10):  # in the store (a normalised hit), not only pending
            for prompt in stored:
                while (await cache.lookup(key(prompt.lower().rstrip("?")))).found is None:
                    await anyio.sleep(0.02)
        counting.passes.clear()
        reworded = [prompt.replace("How do I", "How can I") for prompt in stored]
        looked = await asyncio.gather(*(cache.lookup(key(prompt)) for prompt in reworded))
        assert [(f.found.tier, f.found.entry.prompt) for f in looked if f.found] == [
            ("semantic", prompt) for prompt in stored
        ]
        assert counting.passes == [2]  # one embedder pass, then one verifier pass


async def test_a_lookup_past_its_budget_fails_open(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    async with semantic_cache(tmp_path, encoder, verifier, budget_s=1e-6) as cache:
        lookup = await cache.lookup(key("How do I reset my password?"))
        assert (lookup.found, lookup.failed) == (None, "budget")


async def test_a_lookup_the_busy_embedder_cannot_serve_in_time_fails_open_at_once(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    embedder = BatchingEmbedder(encoder)
    async with semantic_cache(tmp_path, encoder, verifier, 0.05, embedder=embedder) as cache:
        await embedder.embed("warm up")
        embedder.times.per_text_s = 1.0  # as the estimate would see a model this slow
        stores = [embedder.embed(f"stored answer {i}") for i in range(3)]  # background
        queued = anyio.Event()

        async def lookup() -> None:
            await queued.wait()
            started = time.perf_counter()
            lookup = await cache.lookup(key("How do I reset my password?"))
            assert (lookup.found, lookup.failed) == (None, "embedder_busy")
            assert time.perf_counter() - started < 0.05  # at once, not after the budget

        async with anyio.create_task_group() as group:
            for store in stores:
                group.start_soon(_run, store)
            group.start_soon(lookup)
            await anyio.sleep(0)  # the stores are queued
            queued.set()
        assert embedder.refused == 1


async def _run(awaitable: Awaitable[object]) -> None:
    await awaitable


async def test_the_time_kept_for_search_and_decision_falls_with_time_and_leaves_half_the_budget(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    """Only admitted lookups measure it: one slow burst must not lock the embedder out."""
    async with semantic_cache(tmp_path, encoder, verifier, budget_s=0.05) as cache:
        cache._after_embed(0.2, now=100.0)  # a burst: search and decision took 200 ms
        assert cache._reserved_after_embed(100.0) == 0.025  # half the budget at most
        assert cache._reserved_after_embed(104.0) == 0.2 / 16  # halves each second
        cache._after_embed(0.001, now=110.0)
        assert abs(cache._reserved_after_embed(110.0) - 0.001) < 1e-3


async def test_a_busy_loop_that_keeps_resuming_lookups_late_has_them_resume_within_the_budget(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    """The loop is blocked from 45 to 75 ms into each lookup (other requests' work), and
    the model is too slow for the budget: the first lookup's timer (50 ms) can only fire
    at 75 ms; each lookup that waits past the budget sets the next one's timer a step
    (1 ms) earlier, until it fires before the block."""
    embedder = BatchingEmbedder(SlowEncoder(encoder, per_pass_s=0.1))
    async with semantic_cache(tmp_path, encoder, verifier, 0.05, embedder=embedder) as cache:

        async def blocked_lookup() -> tuple[str | None, float]:
            async def block() -> None:
                await anyio.sleep(0.045)
                time.sleep(0.03)

            async with anyio.create_task_group() as group:
                group.start_soon(block)
                started = time.perf_counter()
                lookup = await cache.lookup(key("How do I reset my password?"))
                waited = time.perf_counter() - started
            return lookup.failed, waited

        waits = []
        for _ in range(10):
            failed, waited = await blocked_lookup()
            assert failed == "budget"
            waits.append(waited)
            await anyio.sleep(0.15)  # the slow pass is over: an idle embedder takes a text
        assert waits[0] >= 0.07  # the block held the timer back
        assert waits[-1] < 0.05


class Asked:
    """The shipped pair model, with the candidates it was asked about, and a delay (in its
    worker thread) to stand for a machine too busy to answer within the budget."""

    def __init__(self, model: PairModel, delay_s: float = 0.0) -> None:
        self.model = model
        self.threshold = model.threshold
        self.delay_s = delay_s
        self.asked = 0

    def score_many(self, query: bytes, candidates: Sequence[bytes]) -> list[float]:
        self.asked += len(candidates)
        time.sleep(self.delay_s)
        return self.model.score_many(query, candidates)


STORED, REWORDED = "What are some good horror movies?", "Which are the best horror movies to watch?"


async def stored_one(cache: SemanticCache, prompt: str = STORED) -> None:
    cache.store_later(Answer(key(prompt), "t", "m", ANSWER))
    with anyio.fail_after(10):  # in the store (a normalised hit), not only pending
        while (await cache.lookup(key(prompt.lower()))).found is None:
            await anyio.sleep(0.02)


async def test_the_pair_model_serves_what_the_verifier_refused_and_only_without_a_bound(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier, pair_model: PairModel
) -> None:
    asked, stages = Asked(pair_model), []
    async with semantic_cache(
        tmp_path, encoder, verifier, pair_model=asked, stages=stages
    ) as cache:
        await stored_one(cache)
        looked = await cache.lookup(key(REWORDED))
        assert looked.found is not None
        assert (looked.found.tier, looked.found.entry.prompt) == ("semantic", STORED)
        assert asked.asked == 1
        assert "pair_model" in stages
        # The error-bounded mode learns from the verifier's signal alone: no second opinion.
        bounded = await cache.lookup(key(REWORDED), delta=0.05)
        assert (bounded.found, bounded.reason, asked.asked) == (None, "refused:guard:content", 1)
    async with semantic_cache(tmp_path / "none", encoder, verifier) as cache:
        await stored_one(cache)
        looked = await cache.lookup(key(REWORDED))
        assert (looked.found, looked.reason) == (None, "refused:guard:content")


async def test_a_pair_model_too_slow_for_the_budget_leaves_the_verifiers_miss(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier, pair_model: PairModel
) -> None:
    slow, stages, failures = Asked(pair_model, delay_s=2.0), [], []
    async with semantic_cache(
        tmp_path, encoder, verifier, 1.0, failures, pair_model=slow, stages=stages
    ) as cache:
        await stored_one(cache)
        started = time.perf_counter()
        looked = await cache.lookup(key(REWORDED))
        waited = time.perf_counter() - started
    # A miss answered by the model (and stored), not a lookup failed open.
    assert (looked.found, looked.failed, looked.reason) == (None, None, "refused:guard:content")
    assert slow.asked == 1
    assert waited < 1.0
    assert "pair_model_late" in stages
    assert failures == []


PASSWORD = "How do I reset my password?"


async def test_identical_lookups_in_flight_share_one_and_others_do_not(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    """Five identical requests at once embed their prompt once: the four that came while
    the first's lookup ran wait for its result. Another prompt, or the same one under an
    error bound (each draws its own exploration), looks up on its own."""
    stages: list[str] = []
    embedder = BatchingEmbedder(SlowEncoder(encoder, per_pass_s=0.05))
    async with semantic_cache(
        tmp_path, encoder, verifier, embedder=embedder, stages=stages
    ) as cache:
        await stored_one(cache, PASSWORD)
        texts, stages[:] = embedder.texts, []
        reworded = key("How can I reset my password?")
        looked = await asyncio.gather(*(cache.lookup(reworded) for _ in range(5)))
        assert [(f.found.tier, f.found.entry.prompt) for f in looked if f.found] == [
            ("semantic", PASSWORD)
        ] * 5
        assert len({id(f) for f in looked}) == 1  # one lookup's result, given to all five
        assert embedder.texts - texts == 1
        assert stages.count("shared") == 4
        texts = embedder.texts
        await asyncio.gather(cache.lookup(reworded), cache.lookup(key("How can I log in?")))
        assert embedder.texts - texts == 2
        texts = embedder.texts
        await asyncio.gather(*(cache.lookup(reworded, delta=0.05) for _ in range(2)))
        assert embedder.texts - texts == 2


async def test_a_lookup_whose_leader_left_looks_up_itself(
    tmp_path: Path, encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    """The first request's client left (its task cancelled) while its lookup embedded: the
    identical request waiting on it is not cancelled with it, and finds the entry itself."""
    embedder = BatchingEmbedder(SlowEncoder(encoder, per_pass_s=0.1))
    async with semantic_cache(tmp_path, encoder, verifier, embedder=embedder) as cache:
        await stored_one(cache, PASSWORD)
        texts, reworded = embedder.texts, key("How can I reset my password?")
        async with anyio.create_task_group() as group:
            group.start_soon(cache.lookup, reworded)
            await anyio.sleep(0.02)  # the first is embedding
            follower = asyncio.ensure_future(cache.lookup(reworded))
            await anyio.sleep(0.02)
            group.cancel_scope.cancel()
        looked = await follower
        assert looked.found is not None and looked.failed is None
        assert embedder.texts - texts == 2  # the first's pass ended anyway, then its own
