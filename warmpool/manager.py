"""ColdStartManager: one backend's replicas, scaled by `warmpool.autoscale` and by requests.

The gateway calls, per request (synchronously, before it queues the request):

    handle = manager.activate()        None when a replica is ready, else a ColdStartHandle
                                       (a start is under way: the request waits in the
                                       queue); raises ColdStartFailed while the last start
                                       failed less than `retry_after_failure_s` ago
    handle.first_byte()                when a request that waited sends its first byte

`manager.prewarm(replicas, hold_s)` (the admin API) keeps at least `replicas` for
`hold_s` from now, as `floor()` (a schedule, `warmpool.schedule`) does at each tick. It
listens to `on_ready_change` (the ready set, after every change: set the scheduler's
capacity from it) and `on_start_failed` (a cold start failed: fail the requests it holds).
It reads each replica's work from `load()` (the request path's own in-flight count per
replica, and how many it finished): a replica is active at a tick when it has requests in
flight or finished one since the last tick.

Inside, a control loop (every `tick_s`) samples `demand()` (queued + in flight), asks
`desired_replicas` for a decision and applies it: growth (stage the weights if they are
not, then `provider.ensure`) and stops (`provider.stop_replica` of an idle replica) run as
tasks, so the loop never waits on them. `activate` takes the cold-start fast path at once,
without waiting for a tick; concurrent callers share one start. The manager never calls
`ensure` with a lower count (that would stop replicas still loading): it scales down only
by stopping a replica it chose, which leaves the ready set before it is stopped.

With a sleep tier (`engine_sleep` given and `policy.sleep_s` set), the decision's `sleep`
and `wake` go to `warmpool.sleep.SleepTier`: a replica leaves the ready set before its
engine is put to sleep and rejoins it once awake. A request that finds every replica
asleep wakes one through `activate`, exactly as it would start one: concurrent callers
share the wake, and the handle they get settles when the replica is awake. Listeners of
`on_sleep_change` get the number of replicas in the tier after every change.

This module decides and drives; its parts keep the state: `warmpool.cold_start` (the
start under way, its handles and timeline, the last failure, the start estimates),
`warmpool.ready_set` (the ready set and its listeners), `warmpool.signals` (what each
decision is made from), `warmpool.growth` (the growth task) and `warmpool.weights`
(staging the weights before a start).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from backends.providers.replicas import Replica, ReplicaEvent, ReplicaProvider
from warmpool.autoscale import (
    Decision,
    ReplicaLoad,
    ScalePolicy,
    ScaleSnapshot,
    desired_replicas,
    held_floor,
)
from warmpool.cold_start import ColdStartFailed, ColdStartHandle, ColdStarts, Kind
from warmpool.growth import Growth
from warmpool.ready_set import ReadyListener, ReadySet
from warmpool.signals import Sample, ScaleSignals
from warmpool.sleep import EngineSleep, SleepTier
from warmpool.timeline import ColdStartTimeline
from warmpool.weights import BackendWeights, Stager

__all__ = [
    "ColdStartFailed",
    "ColdStartHandle",
    "ColdStartManager",
    "ManagerSnapshot",
    "ReadyListener",
    "Stager",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManagerSnapshot:
    backend: str
    ready: int
    starting: int
    stopping: int
    desired: int
    target: int
    in_flight: int
    panic: bool
    reason: str
    cold_start: bool  # a start from zero ready is under way
    failure: str | None  # the last failed start, while its retry delay lasts
    floor: int = 0  # raised minimum now (a pre-warm or a scheduled window)
    asleep: int = 0  # replicas in the sleep tier (dozing, asleep or waking)


class ColdStartManager:
    def __init__(
        self,
        backend: str,
        provider: ReplicaProvider,
        policy: ScalePolicy,
        *,
        timeline: ColdStartTimeline,
        stager: Stager | None = None,
        weights_uri: str | None = None,
        model: str | None = None,  # the stager's name for the weights; default: backend
        pin_weights: bool = False,  # `staged: always`: pinned, and staged at start
        load: Callable[[], Mapping[str, ReplicaLoad]] = dict,  # per replica, see above
        demand: Callable[[], int] | None = None,  # queued + in flight; default: in flight
        capacity: Callable[[], float | None] = lambda: None,  # per ready replica, learned
        floor: Callable[[], int] = lambda: 0,  # scheduled minimum now (warmpool.schedule)
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.5,
        retry_after_failure_s: float = 5.0,
        start_history: Iterable[float] = (),  # past starts' seconds, oldest first
        engine_sleep: EngineSleep | None = None,  # the sleep tier, with policy.sleep_s
    ) -> None:
        self.backend = backend
        self._provider = provider
        self._policy = policy
        self._weights = BackendWeights(backend, stager, weights_uri, model or backend, pin_weights)
        self._signals = ScaleSignals(load, demand, capacity, floor)
        self._starts = ColdStarts(
            backend,
            self._weights.model,
            timeline,
            clock=clock,
            retry_s=retry_after_failure_s,
            start_history=start_history,
        )
        self._clock = clock
        self._tick_s = tick_s
        self._tier: SleepTier | None = None
        if engine_sleep is not None and policy.sleep_s is not None:
            self._tier = SleepTier(engine_sleep, self._sleep_changed, self._sleep_failed)
        self._ready = ReadySet(provider, self._tier, self._signals, self._starts, clock)
        self.on_ready_change: list[ReadyListener] = self._ready.on_change
        self.on_sleep_change: list[Callable[[int], None]] = self._ready.on_sleep_change
        self._growth = Growth(backend, provider, self._weights, self._starts)
        self.on_start_failed: list[Callable[[ColdStartFailed], None]] = self._growth.on_failed
        self._decision: Decision | None = None
        self._tg: TaskGroup | None = None
        self._events: MemoryObjectSendStream[ReplicaEvent] | None = None
        self._finished: anyio.Event | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, task_group: TaskGroup) -> None:
        """Starts the provider, then the manager's own tasks (in a task group of its own
        inside `task_group`): event intake, pinned staging, `min_replicas`, the loop."""
        send, receive = anyio.create_memory_object_stream[ReplicaEvent](math.inf)
        self._events = send
        self._provider.on_change.append(self._on_replica_event)
        await self._provider.start(task_group)
        await self._weights.open()
        self._finished = anyio.Event()
        await task_group.start(self._run, receive)

    async def close(self) -> None:
        """Stops the loop and pending starts and stops, then closes the provider."""
        self._closed = True
        if self._tg is not None and self._finished is not None:
            self._tg.cancel_scope.cancel()
            await self._finished.wait()
        if self._on_replica_event in self._provider.on_change:
            self._provider.on_change.remove(self._on_replica_event)
        if self._events is not None:
            self._events.close()
        await self._provider.close()
        self._starts.close()

    async def _run(
        self,
        events: MemoryObjectReceiveStream[ReplicaEvent],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        assert self._finished is not None
        try:
            async with events, anyio.create_task_group() as self._tg:
                self._tg.start_soon(self._take_events, events)
                if self._weights.pinned:
                    self._tg.start_soon(self._weights.prestage)
                self._ready.refresh()
                self.tick(trigger="startup")
                self._tg.start_soon(self._control_loop)
                task_status.started()
        finally:
            self._finished.set()

    # -- the gateway's calls -------------------------------------------------------------

    def activate(self) -> ColdStartHandle | None:
        now = self._clock()
        self._signals.request_arrived(now)
        if self._ready.replicas:
            return None
        if self._tg is None or self._closed:
            raise self._starts.error(RuntimeError("not running"))
        if (cause := self._starts.recent_failure(now)) is not None:
            raise self._starts.error(cause)
        episode = self._starts.current or self._starts.open("request", self._next_kind())
        handle = self._starts.waiter(episode)
        if not self._growth.running and self._provider.starting() == 0 and not self._ready.waking():
            arrival = (now, self._signals.demand() + 1)  # the caller is not queued yet
            snapshot = self._scale_snapshot(now, arrival)
            self._apply(desired_replicas(snapshot, self._policy))
        return handle

    def prewarm(self, replicas: int, hold_s: float) -> Decision:
        """Keeps at least `replicas` (within max_replicas) for `hold_s`, starting them now."""
        now = self._clock()
        self._signals.prewarm(replicas, now + hold_s, now)
        return self.tick(trigger="prewarm")

    def ready(self) -> list[Replica]:
        return list(self._ready.replicas)

    def expected_cold_start_s(self) -> float:
        """Seconds until a replica should be ready: for the scheduler (0 when one is, or
        while no start has been measured)."""
        return 0.0 if self._ready.replicas else self.start_remaining_s() or 0.0

    def start_estimate_s(self) -> float | None:
        """How long a start takes, learned from this backend's own (None: none measured)."""
        return self._starts.estimate_s(self._next_kind)

    def start_remaining_s(self) -> float | None:
        """The estimate less what the start under way has taken (None: none measured)."""
        return self._starts.remaining_s(self._next_kind)

    def snapshot(self) -> ManagerSnapshot:
        decision = self._decision
        now = self._clock()
        cause = self._starts.recent_failure(now)
        return ManagerSnapshot(
            self.backend,
            len(self._ready.replicas),
            self._provider.starting(),
            len(self._ready.stopping),
            decision.desired if decision else 0,
            decision.target if decision else 0,
            self._signals.in_flight(),
            decision.panicking(now, self._policy) if decision else False,
            decision.reason if decision else "",
            self._starts.current is not None,
            None if cause is None else f"{type(cause).__name__}: {cause}",
            floor=held_floor(self._signals.floors(now), now),
            asleep=self._ready.in_tier(),
        )

    # -- the control loop ----------------------------------------------------------------

    def tick(self, trigger: str = "autoscaler") -> Decision:
        """One decision: sample demand, decide, apply. The loop calls it every `tick_s`."""
        now = self._clock()
        self._ready.refresh()
        in_use = self._signals.sample(now, self._policy.stable_window_s)
        decision = desired_replicas(self._scale_snapshot(now), self._policy)
        self._apply(decision, trigger)
        if in_use:
            self._weights.touch()  # in use: last in line for eviction
        self._starts.expire()
        return decision

    async def _control_loop(self) -> None:
        while True:
            await anyio.sleep(self._tick_s)
            try:
                self.tick()
            except Exception:
                log.exception("%s: autoscaler tick failed", self.backend)

    def _scale_snapshot(self, now: float, arrival: Sample | None = None) -> ScaleSnapshot:
        return self._signals.snapshot(
            now,
            ready=tuple(replica.id for replica in self._ready.replicas),
            starting=self._provider.starting() + self._ready.waking(),  # a wake: a short start
            asleep=self._ready.asleep(),
            last_panic_at=self._decision.panic_at if self._decision else None,
            arrival=arrival,
        )

    def _apply(self, decision: Decision, trigger: str = "request") -> None:
        self._decision = decision
        for replica_id in decision.wake:
            self._begin_wake(replica_id, trigger)
        asleep = self._ready.in_tier()
        if decision.target > len(self._ready.replicas) + self._provider.starting() + asleep:
            self._grow(decision.target, trigger)
        for replica_id in decision.sleep:
            self._begin_sleep(replica_id)
        for replica_id in decision.stop:
            self._begin_stop(replica_id)

    # -- growth --------------------------------------------------------------------------

    def _grow(self, target: int, trigger: str) -> None:
        if self._growth.running or self._closed or self._tg is None:
            return  # one growth at a time; the next tick asks again if more is needed
        if self._starts.recent_failure(self._clock()) is not None:
            return
        episode = self._starts.current
        if episode is None and not self._ready.replicas:
            episode = self._starts.open(trigger)  # growth from zero: a cold start
        self._growth.begin(self._tg, target, episode)

    # -- scale-down ----------------------------------------------------------------------

    def _begin_stop(self, replica_id: str) -> None:
        """Takes the replica out of the ready set now, then stops it in a task."""
        busy = self._signals.busy(replica_id)
        if busy or replica_id in self._ready.stopping or self._tg is None:
            return
        if self._ready.mid_call(replica_id):
            return  # mid-call on its engine: the next tick asks again
        self._ready.stopping.add(replica_id)
        self._ready.refresh()
        self._tg.start_soon(self._stop, replica_id)

    async def _stop(self, replica_id: str) -> None:
        try:
            await self._provider.stop_replica(replica_id)
        except Exception as exc:
            log.warning("%s: stopping %s failed: %s", self.backend, replica_id, exc)
        finally:
            self._ready.stopping.discard(replica_id)
            self._ready.forget_sleeper(replica_id)
            self._ready.refresh()
        if self._starts.current is not None and not self._closed:
            self.tick()  # a request came while the last replica went: start one now

    # -- provider events -----------------------------------------------------------------

    def _on_replica_event(self, event: ReplicaEvent) -> None:
        if self._events is not None:
            self._events.send_nowait(event)  # handled once the provider's state is settled

    async def _take_events(self, events: MemoryObjectReceiveStream[ReplicaEvent]) -> None:
        async for event in events:
            self._ready.replica_event(event)

    # -- the sleep tier ------------------------------------------------------------------

    def _next_kind(self) -> Kind:
        """What a request finding nothing ready now waits for: a wake when a replica
        sleeps and none starts, else a start."""
        return "wake" if self._ready.asleep() and not self._provider.starting() else "start"

    def _begin_sleep(self, replica_id: str) -> None:
        """Takes the idle replica out of the ready set now, then sleeps it in a task."""
        busy = self._signals.busy(replica_id)
        replica = self._ready.find(replica_id)
        if self._tier is None or self._tg is None or replica is None or busy:
            return
        last = self._signals.last_active(replica_id, self._clock())
        self._tier.sleep(self._tg, replica, last)  # -> _sleep_changed: leaves ready

    def _begin_wake(self, replica_id: str, trigger: str) -> None:
        if self._tier is None or self._tg is None or self._closed:
            return
        episode = self._starts.current
        if episode is None and not self._ready.replicas:
            episode = self._starts.open(trigger, "wake")
        if episode is not None and episode.kind == "wake":
            self._starts.mark(episode, "wake_begun")
        self._tier.wake(self._tg, replica_id)

    def _sleep_changed(self) -> None:
        self._ready.tier_changed()

    def _sleep_failed(self, replica_id: str, action: str, exc: Exception) -> None:
        """The engine's state is unknown: the replica is stopped (it was idle, or wanted
        awake: then a start replaces it). A refused sleep (`refused`: the endpoint is not
        there) turns the tier off: an engine started without sleep mode refuses every time."""
        log.warning("%s: %s of %s failed: %s", self.backend, action, replica_id, exc)
        if action == "sleep" and getattr(exc, "refused", False):
            log.error("%s: sleep refused, scaling without the sleep tier", self.backend)
            self._policy = replace(self._policy, sleep_s=None)
        self._starts.mark(self._starts.current, "crashed")
        self._begin_stop(replica_id)
