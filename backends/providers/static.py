"""Static OpenAI-compatible upstreams: always on, never started or stopped by the gateway.

Without a `ready_path` every upstream is always ready. With one, each is probed every
`probe_interval_s` and `ready()` holds those whose last probe passed; changes are reported
as "ready" and "crashed" events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from urllib.parse import urljoin

import anyio
from anyio.abc import TaskGroup

from backends.probe import ReadinessProbe
from backends.providers.errors import ReplicaNotFound
from backends.providers.replicas import (
    Phase,
    Replica,
    ReplicaEvent,
    ReplicaListener,
    notify,
)


class StaticProvider:
    def __init__(
        self,
        name: str,
        base_urls: Sequence[str],
        *,
        ready_path: str | None = None,
        probe_interval_s: float = 5.0,
        probe_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.on_change: list[ReplicaListener] = []
        self._replicas = [Replica(f"{name}/{i}", url) for i, url in enumerate(base_urls)]
        self._ready_path = ready_path
        self._interval_s = probe_interval_s
        self._probe = ReadinessProbe(probe_timeout_s)
        self._clock = clock
        self._up = {replica.id: ready_path is None for replica in self._replicas}
        self._loop = anyio.CancelScope()

    async def start(self, task_group: TaskGroup) -> None:
        if self._ready_path is None:
            return
        await self._probe.open()
        await self._probe_all()  # ready() is accurate as soon as start() returns
        task_group.start_soon(self._probe_forever)

    async def ensure(self, count: int) -> None:
        """Static upstreams are always on: there is nothing to start or stop."""

    def ready(self) -> list[Replica]:
        return [replica for replica in self._replicas if self._up[replica.id]]

    def starting(self) -> int:
        return 0

    async def stop_replica(self, replica_id: str) -> None:
        """A no-op for a known upstream (it is not ours to stop)."""
        if replica_id not in self._up:
            raise ReplicaNotFound(f"{self.name} has no replica {replica_id!r}")

    async def close(self) -> None:
        self._loop.cancel()
        await self._probe.close()

    async def _probe_forever(self) -> None:
        with self._loop:
            while True:
                await anyio.sleep(self._interval_s)
                await self._probe_all()

    async def _probe_all(self) -> None:
        assert self._ready_path is not None
        for replica in self._replicas:
            up = await self._probe.passes(urljoin(replica.base_url, self._ready_path))
            if up != self._up[replica.id]:
                self._up[replica.id] = up
                phase: Phase = "ready" if up else "crashed"
                detail = "" if up else f"{self._ready_path} probe failed"
                event = ReplicaEvent(
                    self.name, phase, replica.id, self._clock(), replica.base_url, detail
                )
                notify(self.on_change, event)
