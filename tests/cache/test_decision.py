"""The hit decision end to end on the real MiniLM model, the committed verifier and the
committed pair model.

The labelled pairs are written for these tests: paraphrases hit; negations, other
numbers, swapped directions and one-word contrasts miss.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from cache.cross import PairModel
from cache.decision import Candidate, Decision, DecisionSettings, decide
from cache.embedder import Embedded
from cache.torch_encoder import SentenceEncoder
from cache.verifier import PairVerifier

DEFAULT = DecisionSettings()

HITS = [
    # (query, cached prompt, tier)
    ("How do I reverse a list in Python?", "how do i reverse a list in python", "normalized"),
    (
        "Hi, what's the boiling point of water at sea level?",
        "What's the boiling point of water at sea level",
        "normalized",
    ),
    (
        "Can you explain closures in JavaScript, please?",
        "Explain closures in JavaScript.",
        "normalized",
    ),
    ("How can I rename a column in pandas?", "How do I rename a column in pandas?", "semantic"),
    ("how to check disk usage in linux", "How do I check disk usage in Linux?", "semantic"),
    ("What's the best way to learn touch typing?", "best way to learn touch typing", "semantic"),
    # a spelling variant, typos
    (
        "How do I initialise a new git repository?",
        "How do I initialize a new git repository?",
        "semantic",
    ),
    (
        "Whats the differnce between TCP and UDP?",
        "What's the difference between TCP and UDP",
        "semantic",
    ),
    ("Recomend a good book about habits", "Recommend a good book about habits", "semantic"),
]
MISSES = [
    # negation
    ("Can I take ibuprofen with food?", "Can I take ibuprofen without food?"),
    (
        "Write a cover letter that mentions my salary expectations",
        "Write a cover letter that doesn't mention my salary expectations",
    ),
    # numbers and operators
    ("Convert 5 km to miles", "Convert 8 km to miles"),
    ("Solve for x: 2x - 5 = 11", "Solve for x: 2x + 5 = 11"),
    ("Summarize the article in 3 bullet points", "Summarize the article in 5 bullet points"),
    # swapped direction, same words
    ("Convert a Python list to a tuple", "Convert a Python tuple to a list"),
    (
        "Translate from French to German: merci beaucoup",
        "Translate from German to French: merci beaucoup",
    ),
    ("Copy a file from my laptop to the server", "Copy a file from the server to my laptop"),
    ("Did the Romans conquer the Gauls?", "Did the Gauls conquer the Romans?"),
    # one-word contrasts between common words
    ("Sort the array in ascending order", "Sort the array in descending order"),
    ("Open a file for reading in Python", "Open a file for writing in Python"),
    ("Find the min of a list in Python", "Find the max of a list in Python"),
    (
        "How long does cooked chicken last in the fridge?",
        "How long does uncooked chicken last in the fridge?",
    ),
    (
        "Excel formula to get the first word of a cell",
        "Excel formula to get the last word of a cell",
    ),
    # another entity, an added constraint
    ("How do I center a div in CSS?", "How do I center a div in Tailwind?"),
    ("Write a poem about rain", "Write a short poem about rain"),
    # whose question it is, a choice, a question word against a yes/no question (the kinds
    # of false hits the QQP pairs showed)
    ("What do you think of my YouTube channel?", "What do you think of this YouTube channel?"),
    ("What should we do after the first date?", "What do you do after the first date?"),
    ("Is light the absence of darkness?", "Is darkness the absence of light, or is it light?"),
    ("When did the Vikings discover North America?", "Did the Vikings discover North America?"),
    ("Where can I buy a Lumia 640 in India?", "Where can I buy a Lumia 640 in India online?"),
]


def embed(encoder: SentenceEncoder, text: str) -> Embedded:
    return encoder.encode([text])[0]


def candidates(encoder: SentenceEncoder, query: Embedded, prompts: list[str]) -> list[Candidate]:
    out = []
    for prompt in prompts:
        entry = embed(encoder, prompt)
        out.append(Candidate(prompt, entry.features, float(np.dot(entry.vector, query.vector))))
    return out


# `lookup` decides as the gateway does: with the shipped pair model's second opinion.
_shipped_pair_model = functools.cache(PairModel.load)


def lookup(
    encoder: SentenceEncoder,
    verifier: PairVerifier,
    query: str,
    cached: list[str],
    settings: DecisionSettings = DEFAULT,
    second_opinion: bool = True,
) -> Decision:
    q = embed(encoder, query)
    pair_model = _shipped_pair_model() if second_opinion else None
    return decide(query, q, candidates(encoder, q, cached), settings, verifier, pair_model)


@pytest.mark.parametrize(("query", "cached", "tier"), HITS)
def test_paraphrases_hit(
    encoder: SentenceEncoder, verifier: PairVerifier, query: str, cached: str, tier: str
) -> None:
    decision = lookup(encoder, verifier, query, [cached])
    assert decision.hit, decision
    assert decision.index == 0
    assert decision.tier == tier


@pytest.mark.parametrize(("query", "cached"), MISSES)
def test_different_requests_miss(
    encoder: SentenceEncoder, verifier: PairVerifier, query: str, cached: str
) -> None:
    for a, b in ((query, cached), (cached, query)):
        decision = lookup(encoder, verifier, a, [b])
        assert not decision.hit, (a, b, decision)


def test_the_verifier_alone_separates_contrasts(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    """Without guards, the verifier still refuses one-word contrasts and swaps."""
    bare = replace(DEFAULT, guards=frozenset())
    refused = [
        ("Sort the array in ascending order", "Sort the array in descending order"),
        ("Convert a Python list to a tuple", "Convert a Python tuple to a list"),
        ("Write a poem about rain", "Write a short poem about rain"),
    ]
    for a, b in refused:
        assert not lookup(encoder, verifier, a, [b], bare).hit, (a, b)
    assert lookup(encoder, verifier, HITS[3][0], [HITS[3][1]], bare).hit


def test_the_right_entry_among_near_ones(encoder: SentenceEncoder, verifier: PairVerifier) -> None:
    cached = [
        "How do I drop a column in pandas?",
        "How do I rename a column in pandas?",
        "How do I rename a column in SQL?",
    ]
    decision = lookup(encoder, verifier, "How can I rename a column in pandas?", cached)
    assert decision.index == 1 and decision.tier == "semantic"


def test_tier_two_wins_over_a_closer_vector(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    query = embed(encoder, "Rename a git branch, please")
    exact = embed(encoder, "rename a git branch")
    near = [
        Candidate("Rename a git tag", exact.features, 0.999),
        Candidate("rename a git branch", exact.features, 0.5),
    ]
    decision = decide("Rename a git branch, please", query, near, DEFAULT, verifier)
    assert (decision.index, decision.tier, decision.reason) == (1, "normalized", "normalized")


def test_floor_top_k_and_switches(encoder: SentenceEncoder, verifier: PairVerifier) -> None:
    query, cached = HITS[3][0], [HITS[3][1]]
    assert (
        lookup(encoder, verifier, query, cached, replace(DEFAULT, similarity_floor=0.999)).reason
        == "below_floor"
    )
    assert not lookup(encoder, verifier, query, cached, replace(DEFAULT, semantic_tier=False)).hit
    assert not lookup(
        encoder, verifier, query, cached, replace(DEFAULT, verifier_threshold=1.01)
    ).hit
    assert lookup(encoder, verifier, query, [], DEFAULT).reason == "no_candidates"
    normalized_only = replace(DEFAULT, normalized_tier=False)
    assert lookup(encoder, verifier, HITS[0][0], [HITS[0][1]], normalized_only).tier == "semantic"
    with pytest.raises(ValueError, match="unknown guards"):
        DecisionSettings(guards=frozenset({"astrology"}))


def test_a_truncated_prompt_never_hits_semantically(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    long_a = "Review this text: " + "lorem ipsum dolor " * 120 + "and end with A."
    long_b = "Review this text: " + "lorem ipsum dolor " * 120 + "and end with B."
    decision = lookup(encoder, verifier, long_a, [long_b])
    assert not decision.hit
    assert decision.reason == "truncated"


def test_verifier_scores(encoder: SentenceEncoder, verifier: PairVerifier) -> None:
    same = [embed(encoder, t).features for t in HITS[3][:2]]
    swapped = [embed(encoder, t).features for t in MISSES[9]]
    high, low = verifier.score(*same), verifier.score(*swapped)
    assert 0.0 <= low < verifier.threshold <= high <= 1.0
    assert verifier.score_many(same[0], [same[1], swapped[1]])[0] == pytest.approx(high, abs=1e-5)
    assert 0.0 < verifier.threshold < 1.0


# Rewordings the verifier or the content-word rule refuses, and the pair model serves.
SECOND_OPINION_HITS = [
    (
        "What are the best science fiction novels?",
        "Which are the best science fiction novels to read?",
    ),
    ("How do I make money from blogging?", "How to make money with a blog?"),
    ("What are some good horror movies?", "Which are the best horror movies to watch?"),
    ("What is it like to work at a startup?", "What is it really like working at a startup?"),
]


@pytest.mark.parametrize(("query", "cached"), SECOND_OPINION_HITS)
def test_the_pair_model_serves_rewordings_the_verifier_refuses(
    encoder: SentenceEncoder, verifier: PairVerifier, query: str, cached: str
) -> None:
    for a, b in ((query, cached), (cached, query)):
        alone = lookup(encoder, verifier, a, [b], second_opinion=False)
        assert not alone.hit
        assert alone.reason in ("verifier", "guard:content")
        decision = lookup(encoder, verifier, a, [b])
        assert (decision.index, decision.tier, decision.reason) == (0, "semantic", "pair_model")
        assert decision.verifier_score is not None
        assert decision.verifier_score >= _shipped_pair_model().threshold
        stricter = replace(DEFAULT, pair_model_threshold=1.01)
        assert lookup(encoder, verifier, a, [b], stricter) == alone


@pytest.mark.parametrize(
    ("query", "cached", "guard"),
    [
        # the pair model scores these above its threshold: only the content rule is its to undo
        (
            "What are the best places to visit in Portugal?",
            "Which places should I visit in Portugal?",
            "person",
        ),
        (
            "How can I increase traffic to my website?",
            "How to increase my website traffic?",
            "direction",
        ),
    ],
)
def test_the_pair_model_never_overrules_another_guard(
    encoder: SentenceEncoder,
    verifier: PairVerifier,
    query: str,
    cached: str,
    guard: str,
) -> None:
    q, c = embed(encoder, query), embed(encoder, cached)
    pair_model = _shipped_pair_model()
    assert pair_model.score_many(q.features, [c.features])[0] >= pair_model.threshold
    decision = lookup(encoder, verifier, query, [cached])
    assert (decision.hit, decision.reason) == (False, f"guard:{guard}")


def test_the_pair_model_reads_the_most_similar_candidate_the_guards_let_through(
    encoder: SentenceEncoder, verifier: PairVerifier
) -> None:
    query, cached = SECOND_OPINION_HITS[2]
    closer = "What are some good horror movies you have seen?"  # whose: the person guard
    q = embed(encoder, query)
    near = candidates(encoder, q, [closer, cached])
    assert near[0].similarity > near[1].similarity
    assert lookup(encoder, verifier, query, [closer]).reason == "guard:person"
    # The closer candidate another guard refuses does not hide the rewording behind it.
    decision = lookup(encoder, verifier, query, [closer, cached])
    assert (decision.index, decision.reason) == (1, "pair_model")
