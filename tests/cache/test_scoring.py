"""The verifier scored for many lookups in one pass: the same scores as one lookup at a
time, one pass for the questions of one loop turn, and unreadable features fail only the
lookup that asked about them.
The real MiniLM features and the shipped verifier."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from cache.scoring import BatchingScorer
from cache.torch_encoder import SentenceEncoder
from cache.verifier import PairVerifier

QUERIES = ["How do I sort a list in Python?", "How can I reverse a string in Go?"]
CANDIDATES = [
    ["How to sort a list in Python?", "How do I sort a list descending in Python?"],
    ["How do I reverse a string in Go?"],
]


def features(encoder: SentenceEncoder, texts: list[str]) -> list[bytes]:
    return [e.features for e in encoder.encode(texts)]


def test_one_pass_over_several_queries_scores_each_as_alone(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    queries = features(encoder, QUERIES)
    candidates = [features(encoder, c) for c in CANDIDATES]
    together = verifier.score_pairs(list(zip(queries, candidates, strict=True)))
    alone = [verifier.score_many(q, c) for q, c in zip(queries, candidates, strict=True)]
    assert [len(s) for s in together] == [2, 1]
    for got, want in zip(together, alone, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert verifier.score_pairs([(queries[0], [])]) == [[]]


class Counting:
    """The shipped verifier, with the number of questions in each of its passes."""

    def __init__(self, verifier: PairVerifier) -> None:
        self.verifier = verifier
        self.threshold = verifier.threshold
        self.passes: list[int] = []

    def score_pairs(self, asks: Sequence[tuple[bytes, Sequence[bytes]]]) -> list[list[float]]:
        self.passes.append(len(asks))
        return self.verifier.score_pairs(asks)


async def test_questions_of_one_loop_turn_share_one_pass(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    queries = features(encoder, QUERIES)
    candidates = [features(encoder, c) for c in CANDIDATES]
    counting = Counting(verifier)
    scorer = BatchingScorer(counting)
    asked = [scorer.score_many(q, c) for q, c in zip(queries, candidates, strict=True)]
    cancelled = asyncio.ensure_future(scorer.score_many(queries[0], candidates[0]))
    await asyncio.sleep(0)  # asked, then given up before the pass
    cancelled.cancel()
    scores = await asyncio.gather(*asked)
    assert counting.passes == [2]  # the cancelled question was not scored
    for got, q, c in zip(scores, queries, candidates, strict=True):
        assert got == pytest.approx(verifier.score_many(q, c), abs=1e-6)
    # Alone or batched, the same scores up to rounding: on an AVX-512 CPU a batch of two
    # sums in another order, and the last digits moved (5e-10).
    alone = await scorer.score_many(queries[1], candidates[1])
    assert alone == pytest.approx(scores[1], abs=1e-6)
    assert counting.passes == [2, 1]  # a question alone: its own pass, in the next turn


async def test_unreadable_features_fail_only_the_question_that_holds_them(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    counting = Counting(verifier)
    scorer = BatchingScorer(counting)
    q = features(encoder, QUERIES)
    results = await asyncio.gather(
        scorer.score_many(q[0], q[1:]),
        scorer.score_many(q[1], [b"not token features"]),
        return_exceptions=True,
    )
    assert results[0] == pytest.approx(verifier.score_many(q[0], q[1:]), abs=1e-6)
    assert isinstance(results[1], ValueError)
    assert counting.passes == [2, 1, 1]  # the shared pass failed: then each alone
