"""Error-bounded hits: whether to serve a near match, learned online under an error bound.

After vCache (L. G. Schroeder et al., "vCache: Verified Semantic Prompt Caching",
arXiv 2502.03771). Each cached entry keeps the labelled evidence its near matches produced:
(similarity, was the cached answer correct?). A logistic model of
P(correct | similarity) is fitted to it; a request at similarity `s` is

    serve    with probability p(s) = max over eps of  delta / (1 - alpha_eps(s)),
    explore  otherwise: the model answers too, the two answers are compared, and the
             comparison becomes one more piece of evidence (`update`),
    miss     when `s` is below the floor: not a candidate, nothing to learn,

where alpha_eps(s) = (1 - eps) * sigmoid(lower 1 - eps confidence bound of the logit at s)
is a lower bound on P(correct | s) that holds with probability 1 - eps. A served answer is
wrong with probability at most p(s) * (1 - alpha) <= delta, so the rate of wrong answers per
request stays at or under delta while the model is right; an explored request gets the
model's own answer, never a wrong one.

Where this differs from the paper's code, on purpose:
- the fit is a MAP logistic regression with a weak Gaussian prior, and its uncertainty the
  Laplace approximation (inverse Hessian at the MAP). The prior keeps the fit finite when
  the evidence separates perfectly (vCache falls back to a table of variances then);
- the confidence bound is on the logit at `s`, which is linear in the parameters, rather
  than on the threshold t = -intercept / slope by the delta method, which is unstable when
  the slope is near zero;
- the evidence is binned (`BIN_WIDTH`): counts of correct and wrong per similarity bin,
  so an entry's state stays bounded however many requests reach it.

Everything here is pure: `decide` draws from the rng it is given, `update` returns a new
state. Where the state lives (next to the entry) and who compares answers is the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal, Protocol

import orjson

Action = Literal["serve", "explore", "miss"]
BIN_WIDTH = 0.005  # similarity resolution of the evidence: at most 201 bins in [0, 1]
_NEWTON_STEPS = 50
_MAX_STEP = 4.0  # in prior standard deviations of the slope, or logits of the intercept
# The confidence levels the bound is taken over (vCache: 50 points in (0, 1)).
_EPSILONS = tuple(1e-6 + (1 - 2e-6) * i / 49 for i in range(50))
_QUANTILES = tuple((eps, NormalDist().inv_cdf(1 - eps)) for eps in _EPSILONS)


class Uniform(Protocol):
    """A source of uniform draws in [0, 1): `random.Random` is one."""

    def random(self) -> float: ...


@dataclass(frozen=True)
class BoundModel:
    """The model's fixed choices, the same for every entry. Chosen on synthetic streams
    (tests/cache/test_error_bound.py), never on the labelled pairs the benchmark replays."""

    floor: float = 0.80  # below: a miss, as the semantic tier's similarity_floor
    min_observations: int = 6  # vCache explores until an entry has this many labels
    centre: float = 0.90  # the logit is a + b * (s - centre); the prior is centred here
    prior_sd_intercept: float = 3.0  # P(correct | centre) a priori anywhere in ~(0.002, 0.998)
    prior_sd_slope: float = 40.0  # logits per unit of similarity: 4 per 0.1, a priori


@dataclass(frozen=True)
class Fit:
    """The posterior over (a, b), the logit being a + b * (s - centre)."""

    a: float
    b: float
    var_a: float
    cov_ab: float
    var_b: float

    def logit(self, similarity: float, centre: float) -> tuple[float, float]:
        """(mean, standard deviation) of the logit of P(correct) at `similarity`."""
        x = similarity - centre
        var = self.var_a + 2 * x * self.cov_ab + x * x * self.var_b
        return self.a + self.b * x, math.sqrt(max(var, 0.0))


@dataclass(frozen=True)
class Evidence:
    """One entry's state: (bin, correct, wrong) counts sorted by bin, and their fit."""

    bins: tuple[tuple[int, int, int], ...] = ()
    fit: Fit | None = None

    @property
    def observations(self) -> int:
        return sum(correct + wrong for _, correct, wrong in self.bins)

    def to_bytes(self) -> bytes:
        fit = None if self.fit is None else list(_fit_fields(self.fit))
        return orjson.dumps({"v": 1, "bins": self.bins, "fit": fit})

    @classmethod
    def from_bytes(cls, data: bytes) -> Evidence:
        raw = orjson.loads(data)
        if raw.get("v") != 1:
            raise ValueError(f"unknown evidence version: {raw.get('v')!r}")
        bins = tuple((int(k), int(c), int(w)) for k, c, w in raw["bins"])
        fit = None if raw["fit"] is None else Fit(*(float(v) for v in raw["fit"]))
        return cls(bins, fit)


NO_EVIDENCE = Evidence()
DEFAULT_MODEL = BoundModel()


def decide(
    state: Evidence,
    similarity: float,
    delta: float,
    rng: Uniform,
    model: BoundModel = DEFAULT_MODEL,
) -> Action:
    """Serve the cached answer, explore (also ask the model and compare), or miss."""
    if similarity < model.floor:
        return "miss"
    return (
        "serve" if rng.random() < serve_probability(state, similarity, delta, model) else "explore"
    )


def serve_probability(
    state: Evidence, similarity: float, delta: float, model: BoundModel = DEFAULT_MODEL
) -> float:
    """The largest chance of serving that keeps P(serve and wrong) <= delta under the
    fitted model: 0 until the entry has `min_observations` labels."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), not {delta}")
    if state.fit is None or state.observations < model.min_observations:
        return 0.0
    mean, sd = state.fit.logit(similarity, model.centre)
    best = max(delta / (1.0 - (1.0 - eps) * _sigmoid(mean - z * sd)) for eps, z in _QUANTILES)
    return min(best, 1.0)


def update(
    state: Evidence, similarity: float, correct: bool, model: BoundModel = DEFAULT_MODEL
) -> Evidence:
    """The state with one more labelled near match, refitted."""
    bins = _counted(state.bins, _bin(similarity), correct)
    return replace(state, bins=bins, fit=fit(bins, model))


def fit(bins: tuple[tuple[int, int, int], ...], model: BoundModel = DEFAULT_MODEL) -> Fit:
    """MAP logistic regression on binned counts by Newton's method, with its Laplace
    covariance. Two parameters and at most 201 bins: a few hundred microseconds."""
    a = b = 0.0
    for _ in range(_NEWTON_STEPS):
        ga, gb, haa, hab, hbb = _gradient_hessian(bins, a, b, model)
        det = haa * hbb - hab * hab
        step_a, step_b = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        # Damped: a full Newton step can overshoot far from the optimum of a logistic fit.
        size = max(abs(step_a), abs(step_b) / model.prior_sd_slope)
        if size > _MAX_STEP:
            step_a, step_b = step_a * _MAX_STEP / size, step_b * _MAX_STEP / size
        a, b = a + step_a, b + step_b
        if abs(step_a) + abs(step_b) < 1e-9:
            break
    _, _, haa, hab, hbb = _gradient_hessian(bins, a, b, model)
    det = haa * hbb - hab * hab
    return Fit(a, b, hbb / det, -hab / det, haa / det)


def _gradient_hessian(
    bins: tuple[tuple[int, int, int], ...], a: float, b: float, model: BoundModel
) -> tuple[float, float, float, float, float]:
    """Gradient of the log posterior and its negated Hessian (positive definite: the
    prior adds its precision, so Newton's step always exists)."""
    pa, pb = model.prior_sd_intercept**-2, model.prior_sd_slope**-2
    ga, gb, haa, hab, hbb = -a * pa, -b * pb, pa, 0.0, pb
    for k, correct, wrong in bins:
        x = k * BIN_WIDTH - model.centre
        p = _sigmoid(a + b * x)
        n = correct + wrong
        residual, weight = correct - n * p, n * p * (1.0 - p)
        ga, gb = ga + residual, gb + residual * x
        haa, hab, hbb = haa + weight, hab + weight * x, hbb + weight * x * x
    return ga, gb, haa, hab, hbb


def _counted(
    bins: tuple[tuple[int, int, int], ...], k: int, correct: bool
) -> tuple[tuple[int, int, int], ...]:
    counts = {b: (c, w) for b, c, w in bins}
    c, w = counts.get(k, (0, 0))
    counts[k] = (c + 1, w) if correct else (c, w + 1)
    return tuple((b, c, w) for b, (c, w) in sorted(counts.items()))


def _bin(similarity: float) -> int:
    return round(min(max(similarity, 0.0), 1.0) / BIN_WIDTH)


def _fit_fields(fit: Fit) -> tuple[float, float, float, float, float]:
    return fit.a, fit.b, fit.var_a, fit.cov_ab, fit.var_b


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)
