"""The embedder: unit vectors and token features in one pass; concurrent calls share it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cache.embedder import BatchingEmbedder, SentenceEncoder, embed_many
from cache.features import FeatureFormatError, TokenFeatures

TEXTS = [
    "How do I reverse a list in Python?",
    "Write a haiku about the sea",
    "Convert 5 km to miles",
    "What causes thunder?",
    "Summarize this memo in two sentences: 'The office moves to the fourth floor next week.'",
    "Explain recursion to a child",
    "SQL: count rows per day",
    "Best time to visit Iceland",
    "Is 91 prime?",
    "Translate 'good night' into Greek",
]


def test_encode_gives_unit_vectors_and_features(encoder: SentenceEncoder) -> None:
    (one,) = encoder.encode(["Convert 5 km to miles"])
    assert one.vector.dtype == np.float32
    assert one.vector.shape == (encoder.dimension,) == (384,)
    assert abs(float(np.linalg.norm(one.vector)) - 1.0) < 1e-5
    features = TokenFeatures.from_bytes(one.features)
    assert features.embeddings.shape == (len(features.ids), 384)
    assert features.ids[0] == 101 and features.ids[-1] == 102  # [CLS] ... [SEP]
    assert not features.truncated
    assert features.to_bytes() == one.features


def test_long_text_is_marked_truncated(encoder: SentenceEncoder) -> None:
    (long,) = encoder.encode(["word " * 400])
    assert TokenFeatures.from_bytes(long.features).truncated


def test_features_reject_garbage() -> None:
    with pytest.raises(FeatureFormatError):
        TokenFeatures.from_bytes(b"nonsense bytes")


async def test_concurrent_calls_share_one_forward_pass(encoder: SentenceEncoder) -> None:
    unbatched = [encoder.encode([text])[0] for text in TEXTS[:8]]
    async with BatchingEmbedder(encoder, window_ms=200, max_batch=8) as embedder:
        before = encoder.forward_passes
        results = await asyncio.gather(*(embedder.embed(text) for text in TEXTS[:8]))
        assert encoder.forward_passes - before == 1
    for got, want in zip(results, unbatched, strict=True):
        np.testing.assert_allclose(got.vector, want.vector, atol=1e-5)
        got_f, want_f = (
            TokenFeatures.from_bytes(got.features),
            TokenFeatures.from_bytes(want.features),
        )
        np.testing.assert_array_equal(got_f.ids, want_f.ids)
        np.testing.assert_allclose(got_f.embeddings, want_f.embeddings, atol=2e-2)


async def test_batches_are_bounded_by_max_batch(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=200, max_batch=4) as embedder:
        before = encoder.forward_passes
        results = await asyncio.gather(*(embedder.embed(text) for text in TEXTS))
        assert encoder.forward_passes - before == 3  # 4 + 4 + 2
    assert [r.vector.shape for r in results] == [(384,)] * len(TEXTS)


async def test_a_lone_call_waits_only_for_the_window(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=1, max_batch=32) as embedder:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await embedder.embed("hello")
        assert loop.time() - start < 5.0


async def test_embed_before_start_is_an_error(encoder: SentenceEncoder) -> None:
    embedder = BatchingEmbedder(encoder)
    with pytest.raises(RuntimeError):
        await embedder.embed("hello")


async def test_encoder_errors_reach_the_caller_and_batching_goes_on(
    encoder: SentenceEncoder,
) -> None:
    class Failing(SentenceEncoder):
        def __init__(self) -> None:
            self.calls = 0

        def encode(self, texts):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 1:
                raise ValueError("boom")
            return encoder.encode(texts)

    async with BatchingEmbedder(Failing(), window_ms=1) as embedder:
        with pytest.raises(ValueError, match="boom"):
            await embedder.embed("first")
        assert (await embedder.embed("second")).vector.shape == (384,)


def test_embed_many_keeps_order(encoder: SentenceEncoder) -> None:
    many = embed_many(encoder, TEXTS, batch=3)
    for text, got in zip(TEXTS, many, strict=True):
        np.testing.assert_allclose(got.vector, encoder.encode([text])[0].vector, atol=1e-5)
