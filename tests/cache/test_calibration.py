"""The calibrated decision of an embedder without token features, and how its threshold is
chosen (cache/decision.py `calibrated_threshold`, cache/calibration.py)."""

from __future__ import annotations

import numpy as np

from cache.calibration import MIN_HITS, _lowest_threshold
from cache.decision import Candidate, DecisionSettings, decide
from cache.embedder import Embedded

QUERY = Embedded(np.ones(4, dtype=np.float32) / 2, b"")  # no token features


def test_a_calibrated_hit_is_the_most_similar_candidate_the_guards_let_through() -> None:
    settings = DecisionSettings(similarity_floor=0.9, calibrated_threshold=0.9)
    candidates = [
        Candidate("How do I reset my 2 passwords?", b"", 0.97),  # the numbers guard
        Candidate("How can I reset my password?", b"", 0.95),
        Candidate("How could I reset my password?", b"", 0.93),
    ]
    decided = decide("How do I reset my password?", QUERY, candidates, settings, None)
    assert (decided.index, decided.tier, decided.reason) == (1, "semantic", "calibrated")
    below = [Candidate("How can I reset my password?", b"", 0.85)]
    missed = decide("How do I reset my password?", QUERY, below, settings, None)
    assert missed.index is None and missed.reason == "below_floor"
    refused = decide("How do I reset my password?", QUERY, candidates[:1], settings, None)
    assert refused.index is None and refused.reason == "guard:numbers"


def test_without_a_threshold_or_a_verifier_there_is_no_semantic_hit() -> None:
    candidates = [Candidate("How can I reset my password?", b"", 0.99)]
    decided = decide("How do I reset my password?", QUERY, candidates, DecisionSettings(), None)
    assert decided.index is None and decided.reason == "semantic_tier_off"


def test_the_threshold_is_the_lowest_reaching_the_precision_with_enough_hits() -> None:
    true = [(0.99 - i / 100, True) for i in range(MIN_HITS + 2)]  # 0.99 .. 0.93
    passing = [*true, (0.935, False), (0.80, True), (0.79, False)]
    threshold, precision, hits = _lowest_threshold(passing, 0.85)
    assert threshold == 0.80 and hits == MIN_HITS + 3
    assert precision == (MIN_HITS + 3) / (MIN_HITS + 4)
    strict, _, _ = _lowest_threshold(passing, 1.0)
    assert strict == 0.94  # above the false pair at 0.935
    assert _lowest_threshold(true[: MIN_HITS - 1], 0.9)[0] is None  # too few to say
    tied = [(0.9, True)] * MIN_HITS + [(0.9, False)]
    assert _lowest_threshold(tied, 0.95)[0] is None  # a threshold takes all its ties
