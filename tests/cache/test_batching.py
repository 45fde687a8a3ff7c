"""Dynamic batching within deadlines: a lookup the embedder would not reach in time is
refused at once, batches end before their earliest deadline, and background texts wait
behind lookups. The real MiniLM; where a slow model is needed, the embedder's estimate
of a pass is set as a slow model would leave it."""

from __future__ import annotations

import asyncio
import time

import pytest

from cache.batching import BatchingEmbedder, EmbedderBusy, PassTimes
from cache.torch_encoder import SentenceEncoder
from tests.cache.slow_encoder import SlowEncoder

TEXTS = [f"How do I convert {n} km to miles?" for n in range(10)]


async def test_a_lookup_the_queue_would_keep_past_its_time_is_refused_at_once(
    encoder: SentenceEncoder,
) -> None:
    async with BatchingEmbedder(encoder, window_ms=0, max_batch=4) as embedder:
        await embedder.embed("warm up")
        per_text = embedder.times.per_text_s
        assert per_text is not None and per_text > 0
        waiting = [asyncio.ensure_future(embedder.embed(t, within_s=60)) for t in TEXTS]
        await asyncio.sleep(0)  # queued: ten texts ahead of the next one
        assert embedder.expected_wait_s() > 2 * per_text
        loop = asyncio.get_running_loop()
        asked = loop.time()
        with pytest.raises(EmbedderBusy):
            await embedder.embed("one more", within_s=2 * per_text)
        assert loop.time() - asked < 0.01
        assert embedder.refused == 1
        assert len(await asyncio.gather(*waiting)) == len(TEXTS)


async def test_texts_that_share_a_pass_are_not_counted_as_late(encoder: SentenceEncoder) -> None:
    """Four lookups at once share one pass: each is admitted when its time allows that
    pass, round after round (an estimate that took the wait for the batch as lateness
    grew until it refused the later ones), and the event loop's delay stays small."""
    async with BatchingEmbedder(encoder, window_ms=0, max_batch=8) as embedder:
        for _ in range(3):
            await embedder.embed("warm up", within_s=60)
        for round_ in range(12):
            within = 1.5 * embedder.times.seconds(4) + 0.01
            texts = [f"{t} (round {round_})" for t in TEXTS[:4]]
            await asyncio.gather(*(embedder.embed(t, within_s=within) for t in texts))
        assert embedder.refused == 0
        assert embedder.resume_s < 0.01


async def test_a_busy_event_loop_counts_in_the_expected_wait(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=0) as embedder:
        await embedder.embed("warm up", within_s=60)

        async def hog() -> None:
            time.sleep(0.05)  # a callback that holds the loop while a pass ends

        for n in range(20):
            text = asyncio.ensure_future(embedder.embed(f"text {n}", within_s=60))
            while not embedder.passing:
                await asyncio.sleep(0)
            await asyncio.gather(text, hog())  # the pass ends while the loop is held
        assert embedder.resume_s > 0.01
        blocker = asyncio.ensure_future(embedder.embed("running", within_s=60))
        await asyncio.sleep(0)
        assert embedder.expected_wait_s() > 2 * embedder.resume_s  # started, and resumed
        with pytest.raises(EmbedderBusy):
            await embedder.embed("one more", within_s=embedder.resume_s)
        await blocker


async def test_an_idle_embedder_always_takes_a_text(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder) as embedder:
        await embedder.embed("warm up")
        embedder.times.per_text_s = 10.0  # a first pass this slow must not lock lookups out
        assert embedder.expected_wait_s() == 0.0
        assert (await embedder.embed("hello", within_s=0.0)).vector.shape == (384,)
        assert embedder.refused == 0


async def test_a_batch_ends_before_the_earliest_deadline_in_it(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=0, max_batch=32) as embedder:
        await embedder.embed("warm up")
        embedder.times.per_text_s = 0.5  # as a slow model leaves the estimate
        before = encoder.forward_passes
        # The first may wait 1.2 s: a pass of three would end past that, so it runs with
        # one other; the rest, with a minute each, share the next pass.
        first = asyncio.ensure_future(embedder.embed(TEXTS[0], within_s=1.2))
        rest = [asyncio.ensure_future(embedder.embed(t, within_s=60)) for t in TEXTS[1:]]
        await asyncio.gather(first, *rest)
        assert encoder.forward_passes - before == 2


async def test_lookups_go_before_background_work(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=0, max_batch=2) as embedder:
        done: list[str] = []

        async def embed(text: str, within_s: float | None) -> None:
            await embedder.embed(text, within_s)
            done.append(text)

        stores = [asyncio.ensure_future(embed(t, None)) for t in TEXTS[:6]]
        await asyncio.sleep(0)  # queued (the first pair may be running already)
        await asyncio.gather(embed("a lookup", 60), *stores)
        assert done.index("a lookup") <= 2


async def test_background_work_alone_runs_in_short_passes_so_a_lookup_soon_gets_its_turn(
    encoder: SentenceEncoder,
) -> None:
    slow = SlowEncoder(encoder, per_text_s=0.02, one_answer=True)
    async with BatchingEmbedder(slow, window_ms=0, max_batch=32) as embedder:
        for n in range(3):  # measured: no fixed cost, 20 ms a text
            await embedder.embed(f"warm up {n}", within_s=60)
        stores = [asyncio.ensure_future(embedder.embed(t, None)) for t in TEXTS]
        await asyncio.sleep(0.005)  # the first pass of stores has started
        asked = time.monotonic()
        await embedder.embed("a lookup", within_s=0.1)  # all ten stores in one pass: 200 ms
        assert time.monotonic() - asked < 0.1
        await asyncio.gather(*stores)
    assert embedder.refused == 0
    # Stores alone run two at a time; the lookup's pass also takes what fits before its
    # deadline (two stores more).
    assert max(slow.sizes[3:]) <= 3 and len(slow.sizes[3:]) >= 4


async def test_passes_follow_each_other_while_the_event_loop_is_held(
    encoder: SentenceEncoder,
) -> None:
    """The embedder's thread takes the next batch itself when a pass ends: a busy loop,
    which would hand it over only at its next turn, does not leave the model idle with
    lookups waiting (with the loop handing batches over, two passes ran in the 200 ms)."""
    slow = SlowEncoder(encoder, per_text_s=0.02, one_answer=True)
    async with BatchingEmbedder(slow, window_ms=0, max_batch=1) as embedder:
        await embedder.embed("warm up", within_s=60)
        before = len(slow.sizes)
        waiting = [asyncio.ensure_future(embedder.embed(t, within_s=60)) for t in TEXTS[:5]]
        while len(slow.sizes) == before:  # the first of them has had its pass
            await asyncio.sleep(0.001)
        time.sleep(0.2)  # the loop held: the four left take 80 ms, one after the other
        assert len(slow.sizes) - before == 5
        await asyncio.gather(*waiting)
    assert slow.sizes == [1] * 6


def test_pass_times_tell_the_fixed_cost_from_the_cost_per_text() -> None:
    times = PassTimes()
    assert (times.per_text_s, times.seconds(8)) == (None, 0.0)
    times.observe(1, 0.5)  # the first pass is slow, and soon forgotten
    assert times.per_text_s == 0.5
    for texts in (1, 8, 2, 4, 1, 8):
        times.observe(texts, 0.002 + 0.003 * texts)
    assert abs(times.fixed_s - 0.002) < 1e-9 and abs(times.seconds(8) - 0.026) < 1e-9
    assert abs(times.seconds(16, passes=2) - 0.052) < 1e-9


async def test_stats_count_the_passes_their_texts_and_their_time(encoder: SentenceEncoder) -> None:
    """What the gateway exports as gateway_cache_embedder_{busy_seconds,texts}_total: the
    time counted is the passes' own (a model of 20 ms a text), not the time between them."""
    slow = SlowEncoder(encoder, per_text_s=0.02, one_answer=True)
    async with BatchingEmbedder(slow, window_ms=0, max_batch=8) as embedder:
        assert embedder.stats() == {"busy_s": 0.0, "texts": 0, "passes": 0, "refused": 0}
        await asyncio.gather(*(embedder.embed(t, within_s=60) for t in TEXTS[:4]))
        await asyncio.sleep(0.5)  # idle time is not busy time
        await embedder.embed(TEXTS[4])
        stats = embedder.stats()
    assert stats["texts"] == 5 and stats["passes"] == len(slow.sizes) >= 2
    assert 0.1 <= stats["busy_s"] < 0.4  # 0.6 and more with the idle half second
