"""How long to wait before trying again: one exponential backoff policy for every retry loop.

    backoff = Backoff(base_s=0.05, cap_s=2.0)          # full jitter, doubling
    await anyio.sleep(backoff.delay_s(attempt, rand=rng.random()))

After `attempt` failures in a row (from 1) the delay grows to `base_s * factor**(attempt - 1)`,
never above `cap_s`. With `jitter="full"` the delay is uniform below that (`rand` in [0, 1),
drawn by the caller: the policy stays a pure function); with `"none"` it is exactly that.
Full jitter is for many clients that failed together (requests, chunks, batch lines): spread
out, they do not come back together. One process restarting alone needs none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Jitter = Literal["full", "none"]


@dataclass(frozen=True)
class Backoff:
    base_s: float  # the delay after the first failure (before jitter)
    cap_s: float  # no delay is longer
    factor: float = 2.0  # growth per further failure
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError("base_s and cap_s must be >= 0")
        if self.factor < 1:
            raise ValueError("factor must be >= 1: a backoff never shrinks")

    def ceiling_s(self, attempt: int) -> float:
        """The delay after `attempt` failures before jitter: `min(cap_s, base_s *
        factor**(attempt - 1))`; `attempt` <= 1 gives `base_s` (capped)."""
        if self.base_s == 0 or self.factor == 1:
            return min(self.cap_s, self.base_s)
        try:
            grown = self.base_s * math.pow(self.factor, max(0, attempt - 1))
        except OverflowError:  # beyond any float, so beyond the cap: no reason to fail
            return self.cap_s
        return min(self.cap_s, grown)

    def delay_s(self, attempt: int, *, rand: float | None = None) -> float:
        """Seconds to wait after `attempt` failures in a row; `rand`, uniform in [0, 1),
        is required by full jitter and ignored without."""
        ceiling = self.ceiling_s(attempt)
        if self.jitter == "none":
            return ceiling
        if rand is None:
            raise ValueError("full jitter needs rand")
        return ceiling * rand
