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

So lower classes dispatch from a token bucket: a request that finished gives one token (its
replacement is free), and tokens also accrue at one per `interval_s`, the engine's step
time, so what the engine runs grows by about one request a step; the bucket holds at most
`burst`. The top class is never paced. `interval_s` 0 turns pacing off (fixed limits: the
hand-set limit is taken to be right). Pure: the caller passes `now`.
"""

from __future__ import annotations

DEFAULT_BURST = 2.0
_EPSILON = 1e-9  # a token accrued over exactly one interval is a whole one, rounding aside


class Pacer:
    def __init__(self, burst: float = DEFAULT_BURST) -> None:
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self._burst = burst
        self._tokens = burst
        self._at: float | None = None
        self.interval_s = 0.0

    def set_interval(self, interval_s: float, now: float) -> None:
        """Tokens accrue at one per `interval_s` from now on (0: no pacing)."""
        self._refill(now)
        self.interval_s = max(0.0, interval_s)

    def ready(self, now: float) -> bool:
        return self.interval_s <= 0 or self._refill(now) >= 1.0 - _EPSILON

    def take(self, now: float) -> None:
        """A paced dispatch happened."""
        if self.interval_s > 0:
            self._tokens = self._refill(now) - 1.0

    def credit(self) -> None:
        """A request finished: one dispatch to replace it is free."""
        self._tokens = min(self._burst, self._tokens + 1.0)

    def wait_s(self, now: float) -> float:
        """Seconds until `ready` (0 if it is)."""
        missing = 1.0 - self._refill(now)
        return 0.0 if self.interval_s <= 0 or missing <= _EPSILON else missing * self.interval_s

    def _refill(self, now: float) -> float:
        if self._at is not None and self.interval_s > 0 and now > self._at:
            self._tokens = min(self._burst, self._tokens + (now - self._at) / self.interval_s)
        self._at = now
        return self._tokens
