"""How early to set the timer that enforces the lookup budget, so that requests seldom
wait on the cache past it even when a busy event loop resumes them late.

The budget is a timer on the event loop (`anyio.fail_after`). On a loop busy with other
requests the timer's callback runs late, and the cut lookup's caller resumes later still,
so a request waits on the cache longer than the budget it was promised. So the timer is
set early by a margin: `timer_s` = budget - margin, the margin never more than half the
budget.

The margin is steered by the outcome itself, online: each lookup that waited past the
budget raises it by `step_s`, and each one within it lowers it by `step_s` x `share` /
(1 - `share`), so it settles where about `share` of the lookups counted wait past the
budget (a stochastic-approximation quantile, as in Robbins-Monro: the margin at which the
waits' 1 - `share` quantile meets the budget). A cluster of late lookups (a burst whose
timers fire together) raises it at once; it falls back only as lookups end in time, not
with the clock, so an idle spell keeps what the last burst taught.

Earlier versions set the timer early by the largest lateness past the timer among the
recent late lookups (alone, then twice it). Lateness on a loaded loop is not forecast well
by its recent past, nor by the load: at concurrency 64 in `bench/cache_latency.py --quick
--model-ms 200` (synthetic prompts, a throwaway trace) it was 3 ms at the median and 8 ms
at p90 at any number of lookups in flight, and the next stall often beat the window's
largest. With the largest alone, the waits' p99 sat at the budget (42.4 to 50.9 ms in 21
runs, four past it); with twice it, 33.7 to 48.2 ms in eleven runs and 54.6 in one, for a
timer near its floor and more lookups failed open. Steering by the outcome needs no model
of the loop: 44.0 to 46.4 ms in five runs with 67 semantic queries (three of them
alternated with the largest-lateness rule: 48.3 to 50.2 ms, semantic hits/s the same
within the noise), 42.2 and 42.7 ms in two with 22. Raising the margin by each overshoot
instead of a step overreacted to single stalls (p99 36-43 ms, a third fewer semantic
hits/s); a share of 1% with such raises let p99 reach 48-49.5 ms.

Pure: the caller measures the waits.
"""

from __future__ import annotations

SHARE = 0.005  # of the lookups counted, the share let wait past the budget
STEP_S = 0.001  # how far one lookup past the budget raises the margin


class Lateness:
    def __init__(self, budget_s: float, *, share: float = SHARE, step_s: float = STEP_S):
        if budget_s <= 0 or step_s <= 0 or not 0 < share < 0.5:
            raise ValueError("budget_s and step_s must be positive, share in (0, 0.5)")
        self.budget_s = budget_s
        self._raise_s = step_s
        self._lower_s = step_s * share / (1 - share)
        self.margin_s = 0.0

    @property
    def timer_s(self) -> float:
        """The timer to set for a lookup starting now, in seconds."""
        return self.budget_s - self.margin_s

    def ended(self, waited_s: float) -> None:
        """A lookup ended: its caller ran again `waited_s` after it started."""
        if waited_s > self.budget_s:
            self.margin_s = min(self.budget_s / 2, self.margin_s + self._raise_s)
        else:
            self.margin_s = max(0.0, self.margin_s - self._lower_s)
