"""ColdStartManager: one backend's replicas, scaled by `warmpool.autoscale` and by requests.

The gateway calls, per request (synchronously, before it queues the request):

    handle = manager.activate()        None when a replica is ready, else a ColdStartHandle
                                       (a start is under way: the request waits in the
                                       queue); raises ColdStartFailed while the last start
                                       failed less than `retry_after_failure_s` ago
    handle.first_byte()                when a request that waited sends its first byte

and listens to `on_ready_change` (the ready set, after every change: set the scheduler's
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
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

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
)
from warmpool.timeline import ColdStartTimeline, Outcome

log = logging.getLogger(__name__)

ReadyListener = Callable[[list[Replica]], None]


class Stager(Protocol):
    """What the manager needs of `warmpool.staging.WeightStager`."""

    async def open(self) -> None: ...

    def is_staged(self, model: str) -> bool: ...

    def touch(self, model: str) -> None: ...

    def pin(self, model: str) -> None: ...

    async def stage(self, model: str, uri: str) -> object: ...


class ColdStartFailed(Exception):
    """A start failed (staging, or the provider refused); `__cause__` says why.

    `temporary` is the cause's own flag (staging errors carry one) or True; the gateway
    answers 503 with `Retry-After: retry_after_s` when it is temporary.
    """

    def __init__(self, backend: str, cause: BaseException, retry_after_s: float) -> None:
        super().__init__(f"{backend}: cold start failed: {type(cause).__name__}: {cause}")
        self.backend = backend
        self.retry_after_s = retry_after_s
        self.temporary = bool(getattr(cause, "temporary", True))
        self.__cause__ = cause


class _Episode:
    """One cold start: from "no replica is ready" until one is, or the start fails."""

    def __init__(self, start_id: str, started_at: float) -> None:
        self.id = start_id
        self.started_at = started_at
        self.ready_at: float | None = None
        self.failure: ColdStartFailed | None = None
        self.settled = anyio.Event()
        self.request_seen = False


class ColdStartHandle:
    """A request's view of the cold start it waits for; times are on the manager's clock."""

    def __init__(self, episode: _Episode, timeline: ColdStartTimeline) -> None:
        self._episode = episode
        self._timeline = timeline

    @property
    def id(self) -> str:
        return self._episode.id

    @property
    def started_at(self) -> float:
        return self._episode.started_at

    @property
    def ready_at(self) -> float | None:
        return self._episode.ready_at

    @property
    def cold_start_s(self) -> float | None:
        """How long the start took, once a replica is ready (for the response header)."""
        ready_at = self._episode.ready_at
        return None if ready_at is None else ready_at - self._episode.started_at

    @property
    def failure(self) -> ColdStartFailed | None:
        return self._episode.failure

    def first_byte(self) -> None:
        self._timeline.first_byte(self._episode.id)


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
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.5,
        retry_after_failure_s: float = 5.0,
        expected_cold_start_s: float = 30.0,  # until one has been measured
    ) -> None:
        self.backend = backend
        self.on_ready_change: list[ReadyListener] = []
        self.on_start_failed: list[Callable[[ColdStartFailed], None]] = []
        self._provider = provider
        self._policy = policy
        self._timeline = timeline
        self._stager = stager if weights_uri is not None else None
        self._weights_uri = weights_uri or ""
        self._model = model or backend
        self._pin = pin_weights
        self._load = load
        self._demand = demand or (lambda: sum(w.in_flight for w in load().values()))
        self._capacity = capacity
        self._clock = clock
        self._tick_s = tick_s
        self._retry_s = retry_after_failure_s
        self._estimate_s = expected_cold_start_s
        self._ready: list[Replica] = []
        self._stopping: set[str] = set()
        self._served: dict[str, int] = {}  # per replica, at the last tick
        self._last_active: dict[str, float] = {}
        self._last_request_at: float | None = None
        self._samples: deque[tuple[float, int]] = deque()
        self._decision: Decision | None = None
        self._episode: _Episode | None = None
        self._growing = False
        self._failure: tuple[BaseException, float] | None = None  # (cause, when)
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
        if self._stager is not None:
            await self._stager.open()
            if self._pin:
                self._stager.pin(self._model)
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
        if self._episode is not None:
            self._settle_failed(self._episode, RuntimeError("the manager was closed"), "closed")
        self._timeline.finish_backend(self.backend)

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
                if self._pin and self._stager is not None:
                    self._tg.start_soon(self._prestage)
                self._refresh_ready()
                self.tick(trigger="startup")
                self._tg.start_soon(self._control_loop)
                task_status.started()
        finally:
            self._finished.set()

    # -- the gateway's calls -------------------------------------------------------------

    def activate(self) -> ColdStartHandle | None:
        now = self._clock()
        self._last_request_at = now
        if self._ready:
            return None
        if self._tg is None or self._closed:
            raise ColdStartFailed(self.backend, RuntimeError("not running"), self._retry_s)
        if self._failure is not None and now - self._failure[1] < self._retry_s:
            raise ColdStartFailed(self.backend, self._failure[0], self._retry_s)
        episode = self._episode or self._open_episode("request")
        if not episode.request_seen:
            episode.request_seen = True
            self._timeline.mark(episode.id, "request_arrived")
        if not self._growing and self._provider.starting() == 0:
            arrival = (now, self._demand() + 1)  # the caller is not queued yet
            self._apply(desired_replicas(self._scale_snapshot(now, arrival), self._policy))
        return ColdStartHandle(episode, self._timeline)

    def ready(self) -> list[Replica]:
        return list(self._ready)

    def expected_cold_start_s(self) -> float:
        """Seconds until a replica should be ready (0 when one is): for the scheduler."""
        if self._ready:
            return 0.0
        elapsed = self._clock() - self._episode.started_at if self._episode else 0.0
        return max(0.0, self._estimate_s - elapsed)

    def snapshot(self) -> ManagerSnapshot:
        decision = self._decision
        now = self._clock()
        failure = None
        if self._failure is not None and now - self._failure[1] < self._retry_s:
            failure = f"{type(self._failure[0]).__name__}: {self._failure[0]}"
        return ManagerSnapshot(
            self.backend,
            len(self._ready),
            self._provider.starting(),
            len(self._stopping),
            decision.desired if decision else 0,
            decision.target if decision else 0,
            sum(w.in_flight for w in self._load().values()),
            decision.panicking(now, self._policy) if decision else False,
            decision.reason if decision else "",
            self._episode is not None,
            failure,
        )

    # -- the control loop ----------------------------------------------------------------

    def tick(self, trigger: str = "autoscaler") -> Decision:
        """One decision: sample demand, decide, apply. The loop calls it every `tick_s`."""
        now = self._clock()
        self._refresh_ready()
        busy = self._note_activity(now)
        demand = self._demand()
        self._samples.append((now, demand))
        horizon = now - self._policy.stable_window_s
        while self._samples[0][0] < horizon:
            self._samples.popleft()
        decision = desired_replicas(self._scale_snapshot(now), self._policy)
        self._apply(decision, trigger)
        if self._stager is not None and (demand or busy):
            self._stager.touch(self._model)  # in use: last in line for eviction
        self._timeline.expire()
        return decision

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

    async def _control_loop(self) -> None:
        while True:
            await anyio.sleep(self._tick_s)
            try:
                self.tick()
            except Exception:
                log.exception("%s: autoscaler tick failed", self.backend)

    def _scale_snapshot(
        self, now: float, arrival: tuple[float, int] | None = None
    ) -> ScaleSnapshot:
        samples = (*self._samples, arrival) if arrival else tuple(self._samples)
        return ScaleSnapshot(
            now,
            tuple(replica.id for replica in self._ready),
            self._provider.starting(),
            samples,
            {replica_id: work.in_flight for replica_id, work in self._load().items()},
            dict(self._last_active),
            self._last_request_at,
            self._decision.panic_at if self._decision else None,
            self._capacity(),
        )

    def _apply(self, decision: Decision, trigger: str = "request") -> None:
        self._decision = decision
        if decision.target > len(self._ready) + self._provider.starting():
            self._grow(decision.target, trigger)
        for replica_id in decision.stop:
            self._begin_stop(replica_id)

    # -- growth --------------------------------------------------------------------------

    def _grow(self, target: int, trigger: str) -> None:
        if self._growing or self._closed or self._tg is None:
            return  # one growth at a time; the next tick asks again if more is needed
        if self._failure is not None and self._clock() - self._failure[1] < self._retry_s:
            return
        self._growing = True
        episode = self._episode
        if episode is None and not self._ready:
            episode = self._open_episode(trigger)
        self._tg.start_soon(self._grow_to, target, episode)

    async def _grow_to(self, target: int, episode: _Episode | None) -> None:
        try:
            await self._ensure_weights(episode)
            live = len(self._provider.ready()) + self._provider.starting()
            if target > live:  # never lower: ensure() would stop replicas still loading
                await self._provider.ensure(target)
        except Exception as exc:
            self._start_failed(exc, episode)
        else:
            self._failure = None
        finally:
            self._growing = False

    async def _ensure_weights(self, episode: _Episode | None) -> None:
        if self._stager is None:
            return
        if self._stager.is_staged(self._model):
            self._stager.touch(self._model)
            return
        if episode is not None:
            self._timeline.mark(episode.id, "staging_begun")
        await self._stager.stage(self._model, self._weights_uri)
        if episode is not None:
            self._timeline.mark(episode.id, "staging_done")

    async def _prestage(self) -> None:
        try:
            await self._ensure_weights(None)
        except Exception as exc:  # the first request tries again, and reports it
            log.warning("%s: staging pinned weights at start failed: %s", self.backend, exc)

    def _open_episode(self, trigger: str) -> _Episode:
        start_id = self._timeline.begin(self.backend, self._model, trigger)
        self._episode = _Episode(start_id, self._clock())
        return self._episode

    def _start_failed(self, exc: Exception, episode: _Episode | None) -> None:
        self._failure = (exc, self._clock())
        log.warning("%s: start failed: %s: %s", self.backend, type(exc).__name__, exc)
        held = self._episode
        if held is not None and (held is episode or not self._provider.starting()):
            failure = self._settle_failed(held, exc, "failed")
            for listener in self.on_start_failed:
                _safely(listener, failure)

    def _settle_failed(
        self, episode: _Episode, cause: BaseException, outcome: Outcome
    ) -> ColdStartFailed:
        """Ends a cold start that will not get a replica: its waiters get the error."""
        self._episode = None
        episode.failure = ColdStartFailed(self.backend, cause, self._retry_s)
        episode.settled.set()
        self._timeline.finish(episode.id, outcome, str(cause))
        return episode.failure

    # -- scale-down ----------------------------------------------------------------------

    def _begin_stop(self, replica_id: str) -> None:
        """Takes the replica out of the ready set now, then stops it in a task."""
        work = self._load().get(replica_id)
        busy = work is not None and work.in_flight > 0
        if busy or replica_id in self._stopping or self._tg is None:
            return
        self._stopping.add(replica_id)
        self._refresh_ready()
        self._tg.start_soon(self._stop, replica_id)

    async def _stop(self, replica_id: str) -> None:
        try:
            await self._provider.stop_replica(replica_id)
        except Exception as exc:
            log.warning("%s: stopping %s failed: %s", self.backend, replica_id, exc)
        finally:
            self._stopping.discard(replica_id)
            self._refresh_ready()
        if self._episode is not None and not self._closed:
            self.tick()  # a request came while the last replica went: start one now

    # -- the ready set -------------------------------------------------------------------

    def _on_replica_event(self, event: ReplicaEvent) -> None:
        if self._events is not None:
            self._events.send_nowait(event)  # handled once the provider's state is settled

    async def _take_events(self, events: MemoryObjectReceiveStream[ReplicaEvent]) -> None:
        async for event in events:
            episode = self._episode
            if episode is not None:
                if event.phase == "process_started" or _grew(event):
                    self._timeline.mark(episode.id, "process_started")
                elif event.phase == "crashed":
                    self._timeline.mark(episode.id, "crashed")
            self._refresh_ready()

    def _refresh_ready(self) -> None:
        ready = [r for r in self._provider.ready() if r.id not in self._stopping]
        if ready == self._ready:
            return
        now = self._clock()
        ids = {replica.id for replica in ready}
        for replica_id in [r for r in self._last_active if r not in ids]:
            del self._last_active[replica_id]
            self._served.pop(replica_id, None)
        for replica_id in ids:
            self._last_active.setdefault(replica_id, now)  # just ready: counts as active
        self._ready = ready
        if ready and self._episode is not None:
            self._episode_ready(self._episode, now)
        for listener in self.on_ready_change:
            _safely(listener, list(ready))

    def _episode_ready(self, episode: _Episode, now: float) -> None:
        self._episode = None
        self._failure = None
        episode.ready_at = now
        episode.settled.set()
        self._timeline.mark(episode.id, "ready")
        took = now - episode.started_at
        self._estimate_s = 0.5 * self._estimate_s + 0.5 * took


def _grew(event: ReplicaEvent) -> bool:
    """A Kubernetes "scaled" event that raised the count ("0->1")."""
    if event.phase != "scaled":
        return False
    before, _, after = event.detail.partition("->")
    return before.isdigit() and after.isdigit() and int(after) > int(before)


def _safely(listener: Callable[..., None], *args: object) -> None:
    try:
        listener(*args)
    except Exception:
        log.exception("cold-start listener %r failed", listener)
