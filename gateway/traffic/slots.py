"""A backend's concurrency slots: how many requests of each class may be in flight at
once. Pure counts and decisions (no clock, no I/O); `gateway.traffic.scheduler` moves the
counts and asks before each dispatch.

Each class counts only its own and higher classes' requests against the limit, so a higher
class never waits for a lower class's slot: batch requests are long, and a learned limit
full of them held interactive arrivals at the gateway for one to finish, although the
engine would have run them next (bench/slo_goodput.py, vLLM's CPU build at load 1:
interactive time to first token p99 5-7x the bare engine's). The engine then holds at most
the top class's limit plus the lower classes' requests already in flight, and lower classes
go only once the total is back under the limit; with priority scheduling the engine runs
the top class first anyway.

Lower classes also wait while a top-class stream that was sent awaits its first token
(`prefills`): a batching engine computes a prompt in one step with whatever else it
admitted, and a 256-token batch prompt adds about twice a bare step's time to it, so a
batch request sent then lands in the step the interactive request waits on
(bench/batch_interference.py --quick, two runs each at the same hour: interactive time to
first token p99 2.46x and 3.34x its unloaded value with this, 3.46x and 3.92x without;
batch lines per second unchanged, 9.3-9.6). Only streams are seen: a whole answer's first
token is not. Held for one engine step instead (by then the engine has begun the step
that computes the prompt), lower classes were released while a long step still ran, and
joined the interactive request's step: bench/batch_interference.py --quick, two runs
each, 3.33x and 3.63x against 2.10x and 2.53x held to the first token.
"""

from __future__ import annotations

import math

# While the top class is active, lower classes leave this share of the ceiling, rounded
# down, free for it: where the ceiling binds (a fixed limit) every slot is otherwise busy
# under overload, and an interactive arrival, first in line, still waited for a request to
# finish (bench/capacity.py, 5x: interactive time to first token p99 8x its unloaded value
# with a fixed limit). Rounded down, since a reserved slot idles whenever the top class
# does not fill it: one slot of 4 cost a quarter of a 4-slot upstream (bench/overload.py
# --quick, 5x: goodput and utilisation 0.80), where waiting for the first of 4 to finish
# costs the top class a quarter of a service time. A learned limit needs none: the top
# class counts only its own requests against it (`may_dispatch`).
RESERVED_SHARE = 0.1


class Slots:
    """The limit, the ceiling over every class, and what is in flight, by class rank."""

    def __init__(self, limit: int, top_rank: int) -> None:
        self.limit = limit
        self.ceiling = limit
        self.top_rank = top_rank
        self.in_flight = 0
        self.prefills = 0  # top-class streams sent and awaiting their first token
        self._by_rank: dict[int, int] = {}

    def set(self, limit: int, ceiling: int | None = None) -> None:
        """`limit` for each class (with the higher ones), `ceiling` (default: no higher)
        for all of them together."""
        self.limit = limit
        self.ceiling = limit if ceiling is None else max(ceiling, limit)

    def take(self, rank: int) -> None:
        self.in_flight += 1
        self._by_rank[rank] = self._by_rank.get(rank, 0) + 1

    def give_back(self, rank: int) -> None:
        self.in_flight -= 1
        self._by_rank[rank] -= 1

    def held(self, rank: int) -> int:
        """Requests in flight of this class and the higher ones: what it waits for."""
        return sum(n for r, n in self._by_rank.items() if r <= rank)

    def cap(self, rank: int, top_active: bool) -> int:
        """How many may be in flight in all for a request of this class to go: the
        ceiling; for lower classes less RESERVED_SHARE of it (rounded down) while the top
        class has been dispatching lately (`top_active`)."""
        if rank == self.top_rank or not top_active:
            return self.ceiling
        return self.ceiling - math.floor(RESERVED_SHARE * self.ceiling)

    def free(self, rank: int, top_active: bool) -> int:
        """Slots a request of this class could take now."""
        cap = self.cap(rank, top_active)
        return max(0, min(self.limit - self.held(rank), cap - self.in_flight))

    def may_dispatch(self, rank: int, top_active: bool) -> bool:
        """Within the limit and the ceiling (the module's docstring), and for a lower class
        not into the engine step that computes a top-class prompt."""
        if rank != self.top_rank and self.prefills:
            return False
        return self.free(rank, top_active) > 0
