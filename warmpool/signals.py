"""What the autoscaler decides from: one backend's demand and work, gathered between decisions.

`warmpool.autoscale.desired_replicas` is a pure function of a `ScaleSnapshot`; the manager
keeps a `ScaleSignals` and has it build one at each decision. It holds:

- demand samples (`demand()`: queued + in flight) over the policy's stable window, one
  per tick (`sample`);
- each ready replica's last work: a replica is active at a tick when it has requests in
  flight or finished one since the last tick (`load()` counts both), and a replica counts
  as active the moment it becomes ready (`track`);
- the last request's arrival, and the raised floors: pre-warms (`prewarm`, each until its
  time) and the schedule's floor now (`floor()`, `warmpool.schedule`).

The manager passes what it knows of its replicas (ready, starting, asleep) and the time in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from warmpool.autoscale import Floor, ReplicaLoad, ScaleSnapshot

Sample = tuple[float, int]  # (when, queued + in flight)


class ScaleSignals:
    def __init__(
        self,
        load: Callable[[], Mapping[str, ReplicaLoad]],  # per replica
        demand: Callable[[], int] | None = None,  # queued + in flight; default: in flight
        capacity: Callable[[], float | None] = lambda: None,  # per ready replica, learned
        floor: Callable[[], int] = lambda: 0,  # scheduled minimum now
    ) -> None:
        self._load = load
        self._demand = demand or (lambda: self.in_flight())
        self._capacity = capacity
        self._scheduled = floor
        self._prewarms: list[Floor] = []
        self._samples: deque[Sample] = deque()
        self._served: dict[str, int] = {}  # per replica, at the last tick
        self._last_active: dict[str, float] = {}
        self._last_request_at: float | None = None

    def demand(self) -> int:
        return self._demand()

    def in_flight(self) -> int:
        return sum(work.in_flight for work in self._load().values())

    def busy(self, replica_id: str) -> bool:
        work = self._load().get(replica_id)
        return work is not None and work.in_flight > 0

    def last_active(self, replica_id: str, default: float) -> float:
        return self._last_active.get(replica_id, default)

    def request_arrived(self, now: float) -> None:
        self._last_request_at = now

    def sample(self, now: float, window_s: float) -> bool:
        """Takes this tick's sample; True if the backend has work (demand now, or a
        replica that worked since the last tick)."""
        busy = self._note_activity(now)
        demand = self._demand()
        self._samples.append((now, demand))
        horizon = now - window_s
        while self._samples[0][0] < horizon:
            self._samples.popleft()
        return bool(demand) or busy

    def track(self, ready: Iterable[str], now: float) -> None:
        """The ready set changed: forgets replicas gone, and counts new ones as active now."""
        ids = set(ready)
        for replica_id in [r for r in self._last_active if r not in ids]:
            del self._last_active[replica_id]
            self._served.pop(replica_id, None)
        for replica_id in ids:
            self._last_active.setdefault(replica_id, now)

    def prewarm(self, replicas: int, until: float, now: float) -> None:
        self._prewarms = [f for f in self._prewarms if now < f.until]
        self._prewarms.append(Floor(replicas, until))

    def floors(self, now: float) -> tuple[Floor, ...]:
        """Pre-warms not yet over, and the schedule's floor for this decision only."""
        scheduled = Floor(self._scheduled(), math.inf)
        return (*(f for f in self._prewarms if now < f.until), scheduled)

    def snapshot(
        self,
        now: float,
        *,
        ready: tuple[str, ...],
        starting: int,
        asleep: Mapping[str, float],
        last_panic_at: float | None,
        arrival: Sample | None = None,  # a request not queued yet
    ) -> ScaleSnapshot:
        samples = (*self._samples, arrival) if arrival else tuple(self._samples)
        return ScaleSnapshot(
            now,
            ready,
            starting,
            samples,
            {replica_id: work.in_flight for replica_id, work in self._load().items()},
            dict(self._last_active),
            self._last_request_at,
            last_panic_at,
            self._capacity(),
            floors=self.floors(now),
            asleep=asleep,
        )

    def _note_activity(self, now: float) -> bool:
        """Marks replicas that had work since the last tick as active now; True if any."""
        busy = False
        for replica_id, work in self._load().items():
            if work.in_flight or work.served != self._served.get(replica_id, 0):
                busy = True
                if replica_id in self._last_active:
                    self._last_active[replica_id] = now
            self._served[replica_id] = work.served
        return busy
