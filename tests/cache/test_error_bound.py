"""The error-bounded hit policy on synthetic streams whose correctness law is known.

One entry receives near matches at similarities uniform over [0.8, 1.0]; whether serving
would be correct is drawn from the stated law. A served request is an error when it would
be wrong; an explored one reveals its label to `update`. The bound is on errors per request.
Tolerance: three binomial standard deviations of the error count over N requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from cache.error_bound import (
    BIN_WIDTH,
    NO_EVIDENCE,
    Evidence,
    decide,
    serve_probability,
    update,
)

Law = Callable[[float], float]  # similarity -> P(serving would be correct)


def sigmoid_law(threshold: float, slope: float) -> Law:
    return lambda s: 1.0 / (1.0 + math.exp(-slope * (s - threshold)))


@dataclass(frozen=True)
class Replay:
    error_rate: float
    hit_rate: float
    explored: list[bool]
    state: Evidence


def replay(law: Law, delta: float, n: int, seed: int) -> Replay:
    rng = random.Random(seed)
    state, errors, hits, explored = NO_EVIDENCE, 0, 0, []
    for _ in range(n):
        s = rng.uniform(0.8, 1.0)
        correct = rng.random() < law(s)
        action = decide(state, s, delta, rng)
        if action == "serve":
            hits += 1
            errors += not correct
        elif action == "explore":
            state = update(state, s, correct)
        explored.append(action == "explore")
    return Replay(errors / n, hits / n, explored, state)


def tolerance(delta: float, n: int) -> float:
    return 3 * math.sqrt(delta * (1 - delta) / n)


LAWS = {
    "sigmoid t=0.9 slope 60": sigmoid_law(0.90, 60.0),
    "sigmoid t=0.95 slope 150": sigmoid_law(0.95, 150.0),
    "flat 0.9 (similarity says nothing)": lambda s: 0.9,
    "step at 0.93 (not a sigmoid)": lambda s: 1.0 if s > 0.93 else 0.0,
}


@pytest.mark.parametrize("delta", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("law", LAWS)
def test_error_rate_stays_under_delta(law: str, delta: float) -> None:
    n = 3000
    result = replay(LAWS[law], delta, n, seed=11)
    assert result.error_rate <= delta + tolerance(delta, n), result.error_rate


def test_it_serves_where_the_evidence_says_it_is_safe() -> None:
    # Above s = 0.977 this law is right >= 99% of the time: ~11% of requests could be
    # served at delta = 0.01 by an oracle. Learning online must get a good part of it.
    result = replay(sigmoid_law(0.90, 60.0), 0.01, 3000, seed=3)
    assert result.hit_rate >= 0.06
    assert serve_probability(result.state, 0.99, 0.01) >= 0.7  # the oracle: 1
    assert serve_probability(result.state, 0.85, 0.01) <= 0.02


def test_explore_rate_falls_as_evidence_grows() -> None:
    result = replay(sigmoid_law(0.90, 60.0), 0.05, 3000, seed=5)
    first, last = result.explored[:300], result.explored[-300:]
    assert sum(first) / 300 > sum(last) / 300 + 0.05


def test_explores_until_min_observations() -> None:
    state = NO_EVIDENCE
    for _ in range(5):
        assert serve_probability(state, 0.99, 0.05) == 0.0
        state = update(state, 0.99, True)
    assert serve_probability(update(state, 0.99, True), 0.99, 0.05) > 0.05


def test_wrong_evidence_serves_only_at_the_floor_rate() -> None:
    # With every label wrong, P(correct) ~ 0: serving with chance delta keeps the bound.
    state = NO_EVIDENCE
    for _ in range(50):
        state = update(state, 0.95, False)
    assert serve_probability(state, 0.95, 0.02) == pytest.approx(0.02, abs=0.001)


def test_below_the_floor_is_a_miss() -> None:
    assert decide(NO_EVIDENCE, 0.79, 0.05, random.Random(0)) == "miss"
    assert decide(NO_EVIDENCE, 0.81, 0.05, random.Random(0)) == "explore"


def test_pure_same_draw_same_action_and_no_mutation() -> None:
    state = replay(sigmoid_law(0.90, 60.0), 0.05, 500, seed=2).state
    actions = {decide(state, 0.96, 0.05, random.Random(9)) for _ in range(5)}
    assert len(actions) == 1
    before = state.to_bytes()
    update(state, 0.96, False)
    assert state.to_bytes() == before


def test_state_is_bounded_and_round_trips() -> None:
    rng = random.Random(1)
    state = NO_EVIDENCE
    for _ in range(5000):
        state = update(state, rng.uniform(0.0, 1.0), rng.random() < 0.5)
    assert len(state.bins) <= round(1 / BIN_WIDTH) + 1
    assert state.observations == 5000
    assert len(state.to_bytes()) < 8000
    assert Evidence.from_bytes(state.to_bytes()) == state


def test_rejects_an_unknown_version_and_a_bad_delta() -> None:
    with pytest.raises(ValueError, match="version"):
        Evidence.from_bytes(b'{"v": 2, "bins": [], "fit": null}')
    with pytest.raises(ValueError, match="delta"):
        serve_probability(NO_EVIDENCE, 0.9, 0.0)
