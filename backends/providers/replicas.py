"""The interface every replica provider implements, and the events it reports.

A provider owns the lifecycle of a backend's replicas; a caller (the cold-start manager)
decides how many there should be and which one to stop. `ready()` is a snapshot: a
replica is in it only after its readiness probe passed (model loaded and answering), and
leaves it the moment it crashes or is asked to stop, before it is drained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from anyio.abc import TaskGroup

Phase = Literal["process_started", "ready", "crashed", "stopped", "scaled"]


@dataclass(frozen=True)
class Replica:
    id: str
    base_url: str  # OpenAI-style root, for example http://127.0.0.1:PORT/v1


@dataclass(frozen=True)
class ReplicaEvent:
    """One step in a replica's life, for the ready set and for cold-start timelines.

    process_started  a process was launched (or a scale-up was accepted for Kubernetes)
    ready            its readiness probe passed: it joined `ready()`
    crashed          it ended or vanished without being asked to; `detail` says how
    stopped          it was asked to stop and is gone
    scaled           Kubernetes only: the desired replica count was written (`detail`: "1->0")
    """

    provider: str
    phase: Phase
    replica_id: str | None
    at: float  # unix time, from the provider's clock
    base_url: str | None = None
    detail: str = ""
    # `ready` only: where the start went, as the replica's engine reported it (seconds per
    # phase, for example backends/vllm_startup.py's); empty when unknown.
    phases: Mapping[str, float] = field(default_factory=dict)


ReplicaListener = Callable[[ReplicaEvent], None]


def notify(listeners: Sequence[ReplicaListener], event: ReplicaEvent) -> None:
    """Listeners run on the event loop, inline: they must not block (post to a stream)."""
    for listener in listeners:
        listener(event)


class ReplicaProvider(Protocol):
    name: str
    on_change: list[ReplicaListener]

    async def start(self, task_group: TaskGroup) -> None:
        """Starts background supervision in `task_group`; call once, before `ensure`."""
        ...

    async def ensure(self, count: int) -> None:
        """Asks for `count` replicas: starts missing ones without waiting for them to be
        ready, and stops surplus ones (not-ready first, then the newest)."""
        ...

    def ready(self) -> list[Replica]: ...

    def starting(self) -> int:
        """Replicas asked for that have not passed their readiness probe yet."""
        ...

    async def stop_replica(self, replica_id: str) -> None:
        """Stops one replica and lowers the desired count by one; never restarts it."""
        ...

    async def close(self) -> None: ...
