"""Retries before the first byte: which failures, how long to wait, and the pool's budget.

This is the gateway's only retry layer (the upstream HTTP client never retries), so one
incoming request makes at most `max_attempts` upstream attempts. The caller asks only
while nothing has been sent to the client; after that, a failure is the client's to see.

Retried: a connection that could not be made, and HTTP 502, 503, 504 and 429 from the
upstream. 429 means "busy", not "broken": it is retried (preferably on another replica)
but the circuit breaker records it as a success. Not retried: timeouts and answers that
broke off (the upstream may have done the work; doing it twice costs GPU time), other
statuses (the answer stands).

Per attempt: `should_retry` (pure) decides, then `RetryBudget.try_spend` (per backend pool)
must agree.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import Literal

from common.backoff import Backoff

# What an upstream attempt ended with: an HTTP status, or a failure with no status.
UpstreamFailure = Literal["connect_error", "timeout", "protocol_error"]
AttemptOutcome = int | UpstreamFailure

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
_WHOLE = 1.0 - 1e-9  # ten deposits of 0.2 add up to 1.9999999999999998: two tokens


@dataclass(frozen=True)
class UpstreamRetryPolicy:
    max_attempts: int = 3
    base_s: float = 0.05
    cap_s: float = 2.0
    # A longer Retry-After is relayed to the client instead: holding the request (and its
    # queue slot) that long helps nobody, and the client can decide to wait.
    max_retry_after_s: float = 2.0

    @cached_property
    def backoff(self) -> Backoff:
        """Full jitter: spreads retries of requests that failed together, instead of
        sending them back together."""
        return Backoff(self.base_s, self.cap_s)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_s: float
    # why: the outcome retried ("connect_error", "status_503", ...), or why not
    # ("not_retryable", "attempts_exhausted", "retry_after_beyond_deadline", "deadline")
    reason: str


def is_retryable(outcome: AttemptOutcome) -> bool:
    return outcome == "connect_error" or (
        isinstance(outcome, int) and outcome in RETRYABLE_STATUSES
    )


def should_retry(
    attempt: int,
    outcome: AttemptOutcome,
    retry_after_s: float | None,
    deadline_remaining_s: float,
    *,
    rng: Callable[[], float] = random.random,
    policy: UpstreamRetryPolicy = UpstreamRetryPolicy(),
) -> RetryDecision:
    """Whether to make attempt `attempt + 1` after attempt `attempt` (from 1) failed.

    The upstream's `Retry-After` is a floor on the delay. It is always honoured, even when
    the next attempt goes to another replica: the gateway cannot tell a replica's limit
    from one shared by the pool (a hosted API's account limit, say).
    """
    if not is_retryable(outcome):
        return RetryDecision(False, 0.0, "not_retryable")
    if attempt >= policy.max_attempts:
        return RetryDecision(False, 0.0, "attempts_exhausted")
    if retry_after_s is not None and retry_after_s >= deadline_remaining_s:
        return RetryDecision(False, 0.0, "retry_after_beyond_deadline")
    if retry_after_s is not None and retry_after_s > policy.max_retry_after_s:
        return RetryDecision(False, 0.0, "retry_after_too_long")
    delay = max(policy.backoff.delay_s(attempt, rand=rng()), retry_after_s or 0.0)
    if delay >= deadline_remaining_s:
        return RetryDecision(False, 0.0, "deadline")
    label = outcome if isinstance(outcome, str) else f"status_{outcome}"
    return RetryDecision(True, delay, label)


def parse_retry_after(value: str | None, now_epoch_s: float) -> float | None:
    """`Retry-After` in seconds from now: delta-seconds or an HTTP date; None if absent or
    unreadable (an unreadable header is no reason to fail the request)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when: datetime = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_epoch_s)


@dataclass(frozen=True)
class RetryBudgetSnapshot:
    requests: int
    retries: int
    exhausted: int
    tokens: float


class RetryBudget:
    """Retries a backend pool may make: about `ratio` per incoming request, at least
    `min_per_s` per second.

    Each incoming request deposits `ratio` tokens (up to `max_tokens`); a retry takes one.
    When that is empty, a reserve refilled at `min_per_s` (holding at most that many)
    still lets light traffic retry. So, however many attempts fail, upstream attempts stay
    within about `(1 + ratio) * incoming + min_per_s * seconds`: an outage is not multiplied.

    Why this and not the two usual ones:
    - Envoy's budget (retries in flight <= 20% of active requests, min 3) states the same
      intent as a concurrency limit, so its bound on attempts per request shifts with how
      long failed and retried attempts take, and every retry must be bracketed by hooks.
      This is its 20% and its minimum of 3, counted per request instead.
    - gRPC's throttle (tokens 10, -1 per failure, +0.1 per success, retries only above
      half) turns retries off entirely once about 9% of attempts fail. One dead replica in
      a pool of five fails 20% of first attempts, and exactly those are the retries that
      succeed on another replica; this budget still covers them.
    `max_tokens` bounds the burst at the start of an outage to credit saved beforehand.
    """

    def __init__(
        self,
        ratio: float = 0.2,
        min_per_s: float = 3.0,
        max_tokens: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ratio < 0 or min_per_s < 0 or max_tokens < 1:
            raise ValueError("ratio and min_per_s must be >= 0, max_tokens >= 1")
        self._ratio = ratio
        self._min_per_s = min_per_s
        self._max_tokens = max_tokens
        self._clock = clock
        self._tokens = 0.0
        # A reserve below one token could never pay for a retry.
        self._reserve_cap = max(1.0, min_per_s) if min_per_s > 0 else 0.0
        self._reserve = self._reserve_cap
        self._refilled_at = clock()
        self.requests = 0
        self.retries = 0
        self.exhausted = 0

    def on_request(self) -> None:
        """Once per incoming request, before its first attempt (not once per attempt)."""
        self.requests += 1
        self._tokens = min(self._max_tokens, self._tokens + self._ratio)

    def try_spend(self) -> bool:
        """Takes one retry from the budget; False (and counted) when there is none."""
        self._refill()
        if self._tokens >= _WHOLE:
            self._tokens -= 1.0
        elif self._reserve >= _WHOLE:
            self._reserve -= 1.0
        else:
            self.exhausted += 1
            return False
        self.retries += 1
        return True

    def snapshot(self) -> RetryBudgetSnapshot:
        return RetryBudgetSnapshot(self.requests, self.retries, self.exhausted, self._tokens)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._refilled_at)
        self._refilled_at = now
        self._reserve = min(self._reserve_cap, self._reserve + elapsed * self._min_per_s)
