"""How late, on a busy event loop, a lookup's caller runs again after the lookup's time is
up; and so how early to set the timer that enforces the lookup budget.

The budget is a timer on the event loop (`anyio.fail_after`). On a loop busy with other
requests the timer's callback runs late, and the cancelled lookup resumes later still, so
a request waited on the cache longer than the budget it was promised: at concurrency 64
on a 2-core machine, `bench/cache_latency.py` measured the requests' waits on the cache
at 56 to 65 ms (p99) with a 50 ms budget. So the timer is set early by what the loop has
lately added: `timer_s` = budget - the largest lateness among the last `kept` lookups that
ended past their timer (none older than `max_age_s`), never less than half the budget.
The largest, not a mean: the budget bounds each request's wait, so its tail is what
counts, and the window forgets an outlier soon enough.

Lateness is measured against the timer actually set (a lookup that ends after it, cut or
just finished), so it stays a measurement of the loop whatever the compensation; an idle
loop is never late and leaves the whole budget. Pure: the caller passes the clock.
"""

from __future__ import annotations

import math
from collections import deque

KEPT = 128  # recent late lookups remembered
MAX_AGE_S = 60.0  # a lateness older than this says nothing about the loop now


class Lateness:
    def __init__(self, budget_s: float, *, kept: int = KEPT, max_age_s: float = MAX_AGE_S):
        if budget_s <= 0 or kept < 1 or max_age_s <= 0:
            raise ValueError("budget_s, kept and max_age_s must be positive")
        self.budget_s = budget_s
        self._max_age_s = max_age_s
        self._late: deque[tuple[float, float]] = deque(maxlen=kept)  # (when, seconds late)
        # Asked once per lookup: the largest is kept until a sample comes or it ages out.
        self._largest = 0.0
        self._valid_until = -math.inf

    def timer_s(self, now: float) -> float:
        """The timer to set for a lookup starting `now`, in seconds."""
        if now >= self._valid_until:
            self._refresh(now)
        return max(self.budget_s / 2, self.budget_s - self._largest)

    def ended(self, started: float, timer_s: float, now: float) -> None:
        """A lookup started at `started` with a timer of `timer_s` ended (its caller runs
        again) at `now`."""
        late = now - (started + timer_s)
        if late > 0:
            self._late.append((now, late))
            self._valid_until = -math.inf

    def _refresh(self, now: float) -> None:
        horizon = now - self._max_age_s
        recent = [(at, seconds) for at, seconds in self._late if at > horizon]
        at, self._largest = max(recent, key=lambda sample: sample[1], default=(now, 0.0))
        # Until the largest ages out; with none, until a sample comes.
        self._valid_until = at + self._max_age_s if recent else math.inf
