"""A backend's ready replicas as the request path sees them: one pooled HTTP client, one
circuit breaker and one learned capacity each, and how many requests each is serving.

`ReplicaHandle.in_flight` is the one count of requests on a replica: replica choice picks
the one with the most headroom by it and its learned limit (gateway/traffic/capacity.py),
the capacity controller reads it, and the cold-start manager reads it (with `served`,
through `load`) so that scale-down only ever stops an idle replica. A replica that leaves
the ready set keeps its client until the requests reading from it are done; then the
client is closed (in the lifespan's task group), not kept until shutdown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from anyio.abc import TaskGroup

from backends.http import HttpUpstream
from backends.providers.replicas import Replica
from gateway.traffic.affinity import choose, load_bound
from gateway.traffic.breaker import BreakerCounts, CircuitBreaker
from gateway.traffic.capacity import ReplicaCapacity
from warmpool.autoscale import ReplicaLoad


@dataclass(eq=False)
class ReplicaHandle:
    id: str
    upstream: HttpUpstream
    breaker: CircuitBreaker | None
    capacity: ReplicaCapacity
    metrics_url: str = ""  # the engine's /metrics, when its backend declares an engine
    in_flight: int = 0
    served: int = 0  # requests finished, ever: tells the autoscaler it was busy
    on_idle: Callable[[ReplicaHandle], None] | None = None  # set once it has retired

    @property
    def open(self) -> bool:
        return self.breaker is not None and self.breaker.state == "open"

    def has_headroom(self) -> bool:
        return self.capacity.headroom(self.in_flight) > 0

    def done(self) -> None:
        """One request on this replica is over."""
        self.in_flight -= 1
        self.served += 1
        if self.in_flight == 0 and self.on_idle is not None:
            self.on_idle(self)


class ReplicaSet:
    def __init__(
        self,
        make_upstream: Callable[[str], HttpUpstream],
        make_breaker: Callable[[BreakerCounts], CircuitBreaker | None],
        tasks: TaskGroup,
        make_capacity: Callable[[], ReplicaCapacity],
        metrics_url: Callable[[str], str] = lambda base_url: "",
    ) -> None:
        self._make_upstream = make_upstream
        self._make_breaker = make_breaker
        self._make_capacity = make_capacity
        self._metrics_url = metrics_url
        self._tasks = tasks
        self.handles: dict[str, ReplicaHandle] = {}
        self._retired: set[ReplicaHandle] = set()
        self.breakers = BreakerCounts()  # all its replicas' breakers', gone ones' included

    def __len__(self) -> int:
        return len(self.handles)

    def update(self, ready: Iterable[Replica]) -> None:
        """Adopts the provider's ready set: new replicas get a client, gone ones lose
        theirs once the requests still reading from it are done."""
        wanted = {replica.id: replica for replica in ready}
        for replica_id in list(self.handles):
            if replica_id not in wanted:
                self._retire(self.handles.pop(replica_id))
        for replica_id, replica in wanted.items():
            if replica_id not in self.handles:
                upstream = self._make_upstream(replica.base_url)
                upstream.open()
                self.handles[replica_id] = ReplicaHandle(
                    replica_id,
                    upstream,
                    self._make_breaker(self.breakers),
                    self._make_capacity(),
                    self._metrics_url(replica.base_url),
                )

    def pick(self, tried: set[str], affinity: str | None = None) -> ReplicaHandle | None:
        """The replica whose circuit is not open, preferring one not yet tried (a retry
        goes to another replica when there is one): the request's own by its `affinity`
        key while that one has room (gateway/traffic/affinity.py), else the one with the
        most headroom (learned limit less in flight, engine queue and KV pressure; of
        equals the least busy)."""
        if len(self.handles) == 1:  # nothing to compare: once per request, kept cheap
            (only,) = self.handles.values()
            if only.open:
                self.breakers.rejected += 1
                return None
            return only
        usable = [h for h in self.handles.values() if not h.open]
        fresh = [h for h in usable if h.id not in tried]
        candidates = fresh or usable
        if not candidates:
            if self.handles:  # every circuit is open: the breakers turned it away
                self.breakers.rejected += 1
            return None
        if affinity is not None:
            bound = load_bound([h.in_flight for h in self.handles.values()])
            home = choose(candidates, affinity, bound)
            if home is not None:
                assert isinstance(home, ReplicaHandle)
                return home
        return max(candidates, key=lambda h: (h.capacity.headroom(h.in_flight), -h.in_flight))

    def load(self) -> dict[str, ReplicaLoad]:
        """Per ready replica: requests in flight and finished (for the autoscaler)."""
        return {h.id: ReplicaLoad(h.in_flight, h.served) for h in self.handles.values()}

    @property
    def retired(self) -> int:
        """Replicas gone from the ready set whose clients are still open."""
        return len(self._retired)

    def _retire(self, handle: ReplicaHandle) -> None:
        self._retired.add(handle)
        handle.on_idle = self._close_retired
        if handle.in_flight == 0:
            self._close_retired(handle)

    def _close_retired(self, handle: ReplicaHandle) -> None:
        if handle in self._retired:
            self._retired.discard(handle)
            self._tasks.start_soon(handle.upstream.close)

    async def close(self) -> None:
        for handle in [*self._retired, *self.handles.values()]:
            await handle.upstream.close()
        self._retired.clear()
        self.handles.clear()
