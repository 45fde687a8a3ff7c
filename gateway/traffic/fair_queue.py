"""The fair queue's order: priority classes, then virtual token counters. Pure bookkeeping
(no clock, no I/O); `gateway.traffic.scheduler` drives it.

Who goes next when a slot frees up:

1. the highest priority class that has a waiter (lowest rank: "interactive" 0 before "batch" 1);
2. within it, the tenant with the lowest virtual token counter (VTC: Sheng et al.,
   "Fairness in Serving Large Language Models", OSDI 2024);
3. within a tenant, first come, first served.

A tenant's counter is the service it has received, in tokens divided by its weight:
`(input_tokens + output_weight * output_tokens) / weight`. Tokens, not requests: a 20,000
token prompt is a hundred 200-token ones. Output counts double by default (the paper's
w_q = 2) since each output token is a full decode step. The output is unknown at dispatch,
so dispatch charges `max_output_tokens` and completion corrects to the real usage; the
overcharge in between keeps one tenant from grabbing every slot before its first answer.

A tenant whose line is empty when a request of it arrives is lifted to the lowest counter
among tenants with waiters, or to the counter of the last tenant whose line emptied when
nobody waits (the paper's Algorithm 2), so that time spent below its share is not credit
to spend later in a burst. The line, not "queued or in flight": a light tenant always has
some request in flight, and lifted only when it had none, it banked the service a heavy
tenant got while it did not ask for it, and then took nearly every dispatch until the
heavy one's lead was spent (bench/capacity.py --quick --capacity-rps 30, load 5: the
noisy tenant was served nothing for 20 s after the burst that began its overload).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import count


def token_cost(input_tokens: int, output_tokens: int, weight: float, output_weight: float) -> float:
    """What serving a request adds to its tenant's virtual counter."""
    return (input_tokens + output_weight * output_tokens) / weight


def lifted_counter(counter: float, waiting_counters: list[float], last_left: float) -> float:
    """The counter of a tenant whose line was empty: never below the lowest of the tenants
    with waiters, or when none waits, below the last one's whose line emptied."""
    floor = min(waiting_counters) if waiting_counters else last_left
    return max(counter, floor)


@dataclass(eq=False)
class Entry:
    """One request in the queue, then in flight. Compared by identity."""

    tenant: str
    weight: float
    priority: str
    rank: int
    charge: float  # estimated counter increment, charged at dispatch
    deadline: float
    enqueued_at: float
    seq: int = 0
    steps: float = 1.0  # engine steps its prompt's prefill spans (`prefill_steps`)


class FairQueue:
    """Waiters by class and tenant, and the tenants' virtual counters."""

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._lines: dict[str, int] = {}  # tenant -> its waiters, all classes
        self._last_left: str | None = None  # the last tenant whose line emptied
        self._since: dict[tuple[int, str], float] = {}  # (class, tenant) -> line began
        self._waiting: dict[int, dict[str, deque[Entry]]] = {}
        self._depth: dict[int, int] = {}
        self._seq = count()

    def __len__(self) -> int:
        return sum(self._depth.values())

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    def depth(self, rank: int) -> int:
        return self._depth.get(rank, 0)

    def ahead(self, rank: int) -> int:
        """Waiters of this class and higher ones."""
        return sum(n for r, n in self._depth.items() if r <= rank)

    def ahead_of(self, tenant: str, weight: float, rank: int, position: int | None = None) -> int:
        """Waiters a newcomer of `tenant` would wait for, as the fair queue interleaves:
        every waiter of higher classes; in its own class, its tenant's own backlog and, of
        each other tenant, as many as the weights let through in as many rounds.
        `position`: for the tenant's waiter at that index instead (0 is its next).

        Counting the whole class instead would refuse a light tenant because of a heavy
        one's backlog, and admit the heavy one's newcomers only to drop them later.
        """
        higher = sum(n for r, n in self._depth.items() if r < rank)
        same = self._waiting.get(rank, {})
        own = len(same.get(tenant, ())) if position is None else position
        others = sum(
            min(len(queue), math.ceil((own + 1) * queue[0].weight / weight))
            for other, queue in same.items()
            if other != tenant and queue
        )
        return higher + own + others

    def line(self, tenant: str, rank: int) -> int:
        """How many of a tenant's requests wait in a class."""
        return len(self._waiting.get(rank, {}).get(tenant, ()))

    def backlogged_since(self, tenant: str, rank: int) -> float | None:
        """Since when a tenant's line in a class has had waiters without a break (the
        arrival of the waiter that began it); None while it is empty."""
        return self._since.get((rank, tenant))

    def waiting_weights(self, rank: int) -> dict[str, float]:
        """The weights of the tenants with waiters in a class."""
        return {tenant: queue[0].weight for tenant, queue in self._waiting.get(rank, {}).items()}

    def push(self, entry: Entry) -> None:
        entry.seq = next(self._seq)
        self._lift(entry.tenant)
        self._lines[entry.tenant] = self._lines.get(entry.tenant, 0) + 1
        tenants = self._waiting.setdefault(entry.rank, {})
        if entry.tenant not in tenants:
            self._since[(entry.rank, entry.tenant)] = entry.enqueued_at
        tenants.setdefault(entry.tenant, deque()).append(entry)
        self._depth[entry.rank] = self._depth.get(entry.rank, 0) + 1

    def peek(self) -> Entry | None:
        """The next to dispatch: top class, lowest counter, oldest (ties go to the oldest)."""
        if not self._waiting:
            return None
        tenants = self._waiting[min(self._waiting)]
        if len(tenants) == 1:  # the common case under one tenant's load: no comparison
            return next(iter(tenants.values()))[0]
        best = min(tenants.values(), key=lambda q: (self._counters[q[0].tenant], q[0].seq))
        return best[0]

    def overtakes(self, entry: Entry) -> bool:
        """Whether queued `entry` may be dispatched before some waiter: one of a lower
        class, or of another tenant in its class (the counters interleave tenants). If
        not, it waits behind everyone and lengthens no one's wait."""
        for rank, tenants in self._waiting.items():
            if rank > entry.rank or (rank == entry.rank and len(tenants) > 1):
                return True
        return False

    def tenants_waiting(self) -> list[tuple[int, str]]:
        """(class rank, tenant) of every tenant with waiters."""
        return [(rank, tenant) for rank, tenants in self._waiting.items() for tenant in tenants]

    def newest(self, rank: int, tenant: str) -> tuple[Entry, int] | None:
        """A tenant's newest waiter in a class, and its index in the tenant's line."""
        waiting = self._waiting.get(rank, {}).get(tenant)
        if not waiting:
            return None
        return waiting[-1], len(waiting) - 1

    def newest_below(self, rank: int) -> Entry | None:
        """The newest waiter of the lowest class below `rank`: the one to displace."""
        lower = [r for r in self._waiting if r > rank]
        if not lower:
            return None
        return max((q[-1] for q in self._waiting[max(lower)].values()), key=lambda e: e.seq)

    def dispatch_at_once(self, entry: Entry) -> None:
        """Straight to in flight when nobody waits: as `push` then `dispatch`."""
        self._lift(entry.tenant)
        self._last_left = entry.tenant
        self._counters[entry.tenant] += entry.charge

    def dispatch(self, entry: Entry) -> None:
        """Queued → in flight: charge the estimate."""
        self._unlink(entry)
        self._counters[entry.tenant] += entry.charge

    def withdraw(self, entry: Entry) -> None:
        """Leaves the queue without service (cancelled, expired, displaced)."""
        self._unlink(entry)

    def complete(self, entry: Entry, actual_charge: float) -> None:
        """In flight → done: replace the estimate by what was really used."""
        self._counters[entry.tenant] += actual_charge - entry.charge

    def _lift(self, tenant: str) -> None:
        """A request of `tenant` arrives: lifted if its line is empty (module docstring)."""
        if tenant not in self._lines:
            waiting = [self._counters[t] for t in self._lines]
            last = self.counter(self._last_left) if self._last_left is not None else 0.0
            self._counters[tenant] = lifted_counter(self.counter(tenant), waiting, last)

    def _unlink(self, entry: Entry) -> None:
        tenants = self._waiting[entry.rank]
        waiting = tenants[entry.tenant]
        if waiting[0] is entry:
            waiting.popleft()
        else:
            waiting.remove(entry)
        if not waiting:
            del tenants[entry.tenant]
            del self._since[(entry.rank, entry.tenant)]
            if not tenants:
                del self._waiting[entry.rank]
        self._depth[entry.rank] -= 1
        self._lines[entry.tenant] -= 1
        if not self._lines[entry.tenant]:
            del self._lines[entry.tenant]
            self._last_left = entry.tenant
