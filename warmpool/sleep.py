"""The sleep tier: replicas whose engine sleeps, between warm and stopped (vLLM's sleep mode).

`warmpool.autoscale` decides which replica sleeps, wakes or stops; `SleepTier` carries
sleeps and wakes out on the engine and keeps each replica's state until it is warm again:

    warm ─► dozing ─► asleep ─► waking ─► warm        (asleep ─► stopped: the manager's stop)
            POST /sleep?level=1        POST /wake_up
            (until /is_sleeping)       (until /is_sleeping is false)

A replica in the tier is not ready: the manager takes it out of the ready set the moment
it decides to put it to sleep, and it comes back only once awake, so no request is ever
sent to an engine that sleeps (vLLM's default sleep aborts what it runs). A wake asked for
while the replica dozes follows as soon as the sleep is done: one call at a time per
engine. Each transition runs as a task in the manager's task group; the manager hears of
every state change through `on_change`, and of a failed call through `on_failed`, called
as the replica leaves the tier and before `on_change` (its engine's state is unknown then:
the manager stops it, so it never rejoins the ready set).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from anyio.abc import TaskGroup

from backends.providers.replicas import Replica

SleepState = Literal["dozing", "asleep", "waking"]


class EngineSleep(Protocol):
    """An engine's sleep endpoints on one replica (`backends.engine_sleep.VllmSleep`);
    each call returns once the engine is in the state asked for."""

    async def sleep(self, replica: Replica) -> None: ...

    async def wake_up(self, replica: Replica) -> None: ...


@dataclass
class _Sleeper:
    replica: Replica
    state: SleepState
    last_active: float  # the replica's last work, for the policy's sleep_s
    wake_wanted: bool = False


class SleepTier:
    def __init__(
        self,
        engine: EngineSleep,
        on_change: Callable[[], None],
        on_failed: Callable[[str, str, Exception], None],  # (replica id, "sleep"|"wake", why)
    ) -> None:
        self._engine = engine
        self._on_change = on_change
        self._on_failed = on_failed
        self._sleepers: dict[str, _Sleeper] = {}

    def holds(self, replica_id: str) -> bool:
        return replica_id in self._sleepers

    def state(self, replica_id: str) -> SleepState | None:
        sleeper = self._sleepers.get(replica_id)
        return sleeper.state if sleeper is not None else None

    def count(self) -> int:
        return len(self._sleepers)

    def waking(self) -> int:
        return sum(s.state == "waking" or s.wake_wanted for s in self._sleepers.values())

    def asleep(self) -> dict[str, float]:
        """Dozing or asleep replicas (not those being woken) -> their last work."""
        return {
            replica_id: s.last_active
            for replica_id, s in self._sleepers.items()
            if s.state != "waking" and not s.wake_wanted
        }

    def sleep(self, tasks: TaskGroup, replica: Replica, last_active: float) -> None:
        if replica.id not in self._sleepers:
            self._sleepers[replica.id] = _Sleeper(replica, "dozing", last_active)
            tasks.start_soon(self._doze, self._sleepers[replica.id])
            self._on_change()

    def wake(self, tasks: TaskGroup, replica_id: str) -> None:
        sleeper = self._sleepers.get(replica_id)
        if sleeper is None or sleeper.state == "waking":
            return
        if sleeper.state == "dozing":
            sleeper.wake_wanted = True  # right after the sleep call returns
            return
        sleeper.state = "waking"
        tasks.start_soon(self._wake, sleeper)

    def forget(self, replica_id: str) -> None:
        """The replica is gone (stopped, crashed): a restarted engine comes up awake."""
        if self._sleepers.pop(replica_id, None) is not None:
            self._on_change()

    async def _doze(self, sleeper: _Sleeper) -> None:
        try:
            await self._engine.sleep(sleeper.replica)
        except Exception as exc:
            self._failed(sleeper, "sleep", exc)
            return
        if self._sleepers.get(sleeper.replica.id) is not sleeper:
            return  # forgotten while the call ran
        if sleeper.wake_wanted:
            sleeper.state, sleeper.wake_wanted = "waking", False
            await self._wake(sleeper)
            return
        sleeper.state = "asleep"
        self._on_change()

    async def _wake(self, sleeper: _Sleeper) -> None:
        try:
            await self._engine.wake_up(sleeper.replica)
        except Exception as exc:
            self._failed(sleeper, "wake", exc)
            return
        if self._sleepers.get(sleeper.replica.id) is sleeper:
            del self._sleepers[sleeper.replica.id]
            self._on_change()

    def _failed(self, sleeper: _Sleeper, action: str, exc: Exception) -> None:
        if self._sleepers.get(sleeper.replica.id) is not sleeper:
            return
        del self._sleepers[sleeper.replica.id]
        self._on_failed(sleeper.replica.id, action, exc)  # stopping it: never ready again
        self._on_change()
