"""Retries of one source call: exponential backoff with full jitter, a deadline per try.

Only `SourceUnavailable` (5xx, throttling, timeouts, cut connections) is retried; a missing
object or rejected credentials will not get better by asking again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

from common.backoff import Backoff
from warmpool.errors import SourceUnavailable

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransferRetryPolicy:
    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    # A whole try (request and body) gets this long; a stalled body counts as a failed try.
    attempt_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    @cached_property
    def backoff(self) -> Backoff:
        """Full jitter: spreads the retries of many chunks that failed together."""
        return Backoff(self.base_delay_s, self.max_delay_s)


async def with_retries(
    call: Callable[[], Awaitable[T]],
    policy: TransferRetryPolicy,
    what: str,
    rng: random.Random | None = None,
) -> T:
    rand = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return await _one_try(call, policy, what)
        except SourceUnavailable as exc:
            if attempt == policy.max_attempts:
                raise SourceUnavailable(f"{exc} (gave up after {attempt} tries)") from exc
            delay = policy.backoff.delay_s(attempt, rand=rand.random())
            log.info("retrying in %.2f s (try %d failed): %s", delay, attempt, exc)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")


async def _one_try(call: Callable[[], Awaitable[T]], policy: TransferRetryPolicy, what: str) -> T:
    try:
        async with asyncio.timeout(policy.attempt_timeout_s):
            return await call()
    except TimeoutError as exc:
        raise SourceUnavailable(f"{what}: no answer in {policy.attempt_timeout_s} s") from exc
