"""A backend's ready replicas as the request path sees them: one pooled HTTP client and
one circuit breaker each, and how many requests each is serving (to pick the least busy,
and so that scale-down only ever stops an idle one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from backends.http import HttpUpstream
from backends.providers.replicas import Replica
from gateway.breaker import CircuitBreaker


@dataclass
class ReplicaHandle:
    id: str
    upstream: HttpUpstream
    breaker: CircuitBreaker | None
    in_flight: int = 0

    @property
    def open(self) -> bool:
        return self.breaker is not None and self.breaker.state == "open"


class ReplicaSet:
    def __init__(
        self,
        make_upstream: Callable[[str], HttpUpstream],
        make_breaker: Callable[[], CircuitBreaker | None],
    ) -> None:
        self._make_upstream = make_upstream
        self._make_breaker = make_breaker
        self.handles: dict[str, ReplicaHandle] = {}
        self._retired: list[ReplicaHandle] = []

    def __len__(self) -> int:
        return len(self.handles)

    def update(self, ready: Iterable[Replica]) -> None:
        """Adopts the provider's ready set: new replicas get a client, gone ones lose theirs
        (closed later: requests still reading from it finish first)."""
        wanted = {replica.id: replica for replica in ready}
        for replica_id in list(self.handles):
            if replica_id not in wanted:
                self._retired.append(self.handles.pop(replica_id))
        for replica_id, replica in wanted.items():
            if replica_id not in self.handles:
                upstream = self._make_upstream(replica.base_url)
                upstream.open()
                self.handles[replica_id] = ReplicaHandle(replica_id, upstream, self._make_breaker())

    def pick(self, tried: set[str]) -> ReplicaHandle | None:
        """The least busy replica whose circuit is not open, preferring one not yet tried
        (a retry goes to another replica when there is one)."""
        usable = [h for h in self.handles.values() if not h.open]
        fresh = [h for h in usable if h.id not in tried]
        candidates = fresh or usable
        return min(candidates, key=lambda h: h.in_flight) if candidates else None

    async def close_retired(self) -> None:
        """Closes the clients of replicas that left once nothing reads from them."""
        idle = [h for h in self._retired if h.in_flight == 0]
        self._retired = [h for h in self._retired if h.in_flight > 0]
        for handle in idle:
            await handle.upstream.close()

    async def close(self) -> None:
        for handle in [*self._retired, *self.handles.values()]:
            await handle.upstream.close()
        self._retired.clear()
        self.handles.clear()
