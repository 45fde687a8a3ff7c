"""The embedder: unit vectors and token features in one pass; concurrent calls share it."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from cache.batching import BatchingEmbedder
from cache.embedder import Embedded, embed_many
from cache.features import FeatureFormatError, TokenFeatures
from cache.torch_encoder import SentenceEncoder, native_bf16

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


def _token_cosines(a: Embedded, b: Embedded) -> npt.NDArray[np.float32]:
    fa, fb = TokenFeatures.from_bytes(a.features), TokenFeatures.from_bytes(b.features)
    np.testing.assert_array_equal(fa.ids, fb.ids)
    assert fa.truncated == fb.truncated
    x, y = fa.embeddings.astype(np.float32), fb.embeddings.astype(np.float32)
    cosines: npt.NDArray[np.float32] = (x * y).sum(1) / (
        np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    )
    return cosines


def test_the_fast_pass_computes_what_sentence_transformers_does(
    encoder: SentenceEncoder,
) -> None:
    model = encoder.model
    fast, library = SentenceEncoder(model, "float32"), SentenceEncoder(model, fast=False)
    assert fast.fast and not library.fast and fast.precision == "float32"
    texts = [*TEXTS, "word " * 400, ""]  # one truncated, one empty
    for got, want in zip(fast.encode(texts), library.encode(texts), strict=True):
        np.testing.assert_allclose(got.vector, want.vector, atol=1e-5)
        assert _token_cosines(got, want).min() > 0.99999


def test_bfloat16_stays_within_a_hair_of_float32(encoder: SentenceEncoder) -> None:
    model = encoder.model
    half, full = SentenceEncoder(model, "bfloat16"), SentenceEncoder(model, "float32")
    assert half.precision == "bfloat16"
    for got, want in zip(half.encode(TEXTS), full.encode(TEXTS), strict=True):
        assert float(got.vector @ want.vector) > 0.9999
        assert _token_cosines(got, want).min() > 0.999


def test_prepacked_bf16_weights_change_no_result(encoder: SentenceEncoder) -> None:
    import torch

    from cache.bert import BertForward

    bert = encoder.model[0].auto_model
    packed = BertForward(bert, torch.bfloat16)
    plain = BertForward(bert, torch.bfloat16, pack=False)
    assert not plain.packed
    assert packed.packed or not native_bf16()  # packs wherever bf16 is the default
    inputs = encoder.model.tokenizer(TEXTS, padding=True, return_tensors="pt")
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.inference_mode():
        assert torch.equal(packed(ids, mask), plain(ids, mask))
        assert torch.equal(packed(ids[:1, :9], mask[:1, :9]), plain(ids[:1, :9], mask[:1, :9]))


def test_features_reject_garbage() -> None:
    with pytest.raises(FeatureFormatError):
        TokenFeatures.from_bytes(b"nonsense bytes")


async def test_concurrent_calls_share_one_forward_pass(encoder: SentenceEncoder) -> None:
    unbatched = [encoder.encode([text])[0] for text in TEXTS[:8]]
    async with BatchingEmbedder(encoder, window_ms=200, max_batch=8) as embedder:
        before = encoder.forward_passes
        texts = TEXTS[:8]
        results = await asyncio.gather(*(embedder.embed(t, within_s=60) for t in texts))
        assert encoder.forward_passes - before == 1
    # The same vectors alone or padded in a batch, up to the rounding of the precision
    # (bf16 products are blocked differently for other batch shapes).
    for got, want in zip(results, unbatched, strict=True):
        assert float(got.vector @ want.vector) > 0.9999
        assert _token_cosines(got, want).min() > 0.999


async def test_batches_are_bounded_by_max_batch(encoder: SentenceEncoder) -> None:
    async with BatchingEmbedder(encoder, window_ms=200, max_batch=4) as embedder:
        before = encoder.forward_passes
        # Lookups with time to spare: stores alone are kept to short passes instead.
        results = await asyncio.gather(*(embedder.embed(text, within_s=60) for text in TEXTS))
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
        assert float(got.vector @ encoder.encode([text])[0].vector) > 0.9999
