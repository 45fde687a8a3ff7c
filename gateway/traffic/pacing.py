"""Pacing for lower-class dispatches: how fast what an engine runs may grow.

A continuous-batching engine folds each new request's prompt into its next steps (vLLM's
chunked prefill: up to `max_num_batched_tokens` a step), and a step with prompt tokens in
it takes longer for every request in the batch, the interactive ones waiting for their
first token included. A request that replaces one that finished adds one prompt to a step;
but when the limit jumps (a learned limit growing, or coming back after a measurement) or
work arrives at an idle engine, dozens of batch prompts dispatched in the same instant
fill several whole steps with prefill: bench/capacity.py at 5x saw interactive time to
first token reach ten times its unloaded value in those moments, while it stayed near twice
in between.

So lower classes dispatch from a token bucket that spreads their prompts over the engine's
steps. Tokens accrue at one per `interval_s`, the engine's step time, or faster where
lower-class requests have lately finished faster than that (RATE_HEADROOM times their
completions over RATE_WINDOW_S: an engine with a wide batch of short answers finishes
several a step, and one dispatch a step would cap what it finishes); the bucket holds one.
A finished request's replacement is not free: under overload, requests prefilled in the
same step finish in the same step (equal lengths, or limits reached together), and free
replacements sent them back into one step, so the cohort kept its steps long for good
(bench/capacity.py --quick at 5x, the fake engine's steps: 13% carried two to four batch
prompts, 43 to 123 ms, with free replacements and a bucket of two; with neither, 2 to 4%
carried two and none more). The top class is never paced. `interval_s` 0 turns
pacing off (fixed limits: the hand-set limit is taken to be right). Pure: the caller passes
`now`.

A dispatch costs the steps its prompt's prefill spans: one, unless the engine caps the
prompt tokens a request computes in a step (vLLM's `--long-prefill-token-threshold`, the
backend's `prefill_chunk_tokens`), when a 256-token prompt in 64-token chunks spans four.
Charging one for it let four batch prompts prefill side by side, a chunk each in every
step, and an interactive prompt's step carried them all (bench/batch_interference.py, the
engine chunking at 64, 1,000 lines: interactive time to first token p99 1.98x unloaded
charging one a dispatch, 1.50x charging four, at 10.4 and 10.1 batch lines/s). Completions
count in steps too, so the rate rule above compares like with like.
"""

from __future__ import annotations

import math

from common.window import WindowSums

RATE_WINDOW_S = 2.0  # lower-class completions counted for the rate
RATE_HEADROOM = 1.25  # dispatches may outpace completions by this much, for growth
_EPSILON = 1e-9  # a token accrued over exactly one interval is a whole one, rounding aside


def prefill_steps(input_tokens: int, chunk_tokens: int | None) -> float:
    """Engine steps a prompt's prefill spans: one, or one per chunk where the engine caps
    the prompt tokens a request computes in a step (`prefill_chunk_tokens`)."""
    if chunk_tokens is None:
        return 1.0
    return float(max(1, math.ceil(input_tokens / chunk_tokens)))


class Pacer:
    """The token bucket; it holds one token (see the module's docstring)."""

    def __init__(self) -> None:
        self._tokens = 1.0
        self._at: float | None = None
        self.interval_s = 0.0
        self._finished: WindowSums[None] = WindowSums(RATE_WINDOW_S)  # prompt steps

    def set_interval(self, interval_s: float, now: float) -> None:
        """Tokens accrue at one per `interval_s` at least from now on (0: no pacing)."""
        self._refill(now)
        self.interval_s = max(0.0, interval_s)

    def ready(self, now: float) -> bool:
        return self.interval_s <= 0 or self._refill(now) >= 1.0 - _EPSILON

    def take(self, now: float, steps: float = 1.0) -> None:
        """A paced dispatch happened, whose prompt spans `steps` engine steps."""
        if self.interval_s > 0:
            self._tokens = self._refill(now) - steps

    def finished(self, now: float, steps: float = 1.0) -> None:
        """A paced request of `steps` finished: the accrual keeps up with the completions."""
        self._refill(now)
        self._finished.add(now, None, steps)

    def rate_per_s(self, now: float) -> float | None:
        """Paced prompt steps allowed per second now (dispatches, where each prompt takes
        one step); None when pacing is off."""
        return None if self.interval_s <= 0 else 1.0 / self._interval(now)

    def wait_s(self, now: float) -> float:
        """Seconds until `ready` (0 if it is)."""
        missing = 1.0 - self._refill(now)
        if self.interval_s <= 0 or missing <= _EPSILON:
            return 0.0
        return missing * self._interval(now)

    def _interval(self, now: float) -> float:
        """One step, or less where lower-class requests finish faster than one a step."""
        self._finished.expire(now)
        if not self._finished:
            return self.interval_s
        steps = self._finished.get(None)
        return min(self.interval_s, RATE_WINDOW_S / (RATE_HEADROOM * steps))

    def _refill(self, now: float) -> float:
        if self._at is not None and self.interval_s > 0 and now > self._at:
            gained = (now - self._at) / self._interval(now)
            self._tokens = min(1.0, self._tokens + gained)
        self._at = now
        return self._tokens
