"""A backend's cold start: the one under way, what the requests that wait see, the last failure.

A cold-start episode runs from "no replica is ready" (a request found none, or the
autoscaler grew from zero) until one is, or the start fails. A backend has at most one at a
time; `ColdStarts` keeps it, records its events on the `ColdStartTimeline`, and settles it:
ready (its seconds feed the start estimates), or failed (each waiting request gets the
`ColdStartFailed`). Each request that waits holds a `ColdStartHandle`.

    starts.open(trigger, kind)        a new episode, now `starts.current`
    starts.mark(episode, event)       an event on its timeline (no episode: nothing)
    starts.ready(now)                 a replica is ready: the episode settles
    starts.settle_failed(episode, cause, outcome)
                                      it will get no replica: its waiters get the error
    starts.failed(cause)              remembered `retry_s`: `recent_failure(now)` tells
                                      the manager to fail fast rather than start again

An episode's `kind` is "wake" when an asleep replica is woken (`warmpool.sleep`) and no
process starts; wakes have their own estimate, as they take seconds where starts take minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import anyio

from warmpool.start_estimate import StartTimes
from warmpool.timeline import ColdStartTimeline, Event, Outcome

Kind = Literal["start", "wake"]


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


class Episode:
    """One cold start: from "no replica is ready" until one is, or the start fails."""

    def __init__(self, start_id: str, started_at: float, kind: Kind = "start") -> None:
        self.id = start_id
        self.started_at = started_at
        self.kind = kind  # "wake": an asleep replica is woken, no process is started
        self.ready_at: float | None = None
        self.failure: ColdStartFailed | None = None
        self.settled = anyio.Event()
        self.request_seen = False


class ColdStartHandle:
    """A request's view of the cold start it waits for; times are on the manager's clock."""

    def __init__(self, episode: Episode, timeline: ColdStartTimeline) -> None:
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


class ColdStarts:
    """One backend's cold-start episodes, its last failed start, and how long starts take."""

    def __init__(
        self,
        backend: str,
        model: str,
        timeline: ColdStartTimeline,
        *,
        clock: Callable[[], float],
        retry_s: float,
        start_history: Iterable[float] = (),  # past starts' seconds, oldest first
    ) -> None:
        self.backend = backend
        self.retry_s = retry_s
        self.current: Episode | None = None
        self._model = model
        self._timeline = timeline
        self._clock = clock
        self._failure: tuple[BaseException, float] | None = None  # (cause, when)
        self._start_times = StartTimes(start_history)
        self._wake_times = StartTimes()  # wakes, apart: seconds where starts take minutes

    def open(self, trigger: str, kind: Kind = "start") -> Episode:
        start_id = self._timeline.begin(self.backend, self._model, trigger, kind)
        self.current = Episode(start_id, self._clock(), kind)
        return self.current

    def mark(self, episode: Episode | None, event: Event) -> None:
        if episode is not None:
            self._timeline.mark(episode.id, event)

    def engine_phases(self, episode: Episode | None, phases: Mapping[str, float]) -> None:
        """Where the start went, as the replica's engine reported it."""
        if episode is not None:
            self._timeline.engine_phases(episode.id, phases)

    def waiter(self, episode: Episode) -> ColdStartHandle:
        """A request waits on `episode`: the first one is marked on its timeline."""
        if not episode.request_seen:
            episode.request_seen = True
            self._timeline.mark(episode.id, "request_arrived")
        return ColdStartHandle(episode, self._timeline)

    def ready(self, now: float) -> None:
        """A replica is ready: the episode under way (if any) settles, and is measured."""
        episode, self.current = self.current, None
        if episode is None:
            return
        self._failure = None
        episode.ready_at = now
        episode.settled.set()
        self._timeline.mark(episode.id, "ready")
        self.times(episode.kind).observe(now - episode.started_at)

    def settle_failed(
        self, episode: Episode, cause: BaseException, outcome: Outcome
    ) -> ColdStartFailed:
        """Ends a cold start that will not get a replica: its waiters get the error."""
        self.current = None
        episode.failure = self.error(cause)
        episode.settled.set()
        self._timeline.finish(episode.id, outcome, str(cause))
        return episode.failure

    def error(self, cause: BaseException) -> ColdStartFailed:
        return ColdStartFailed(self.backend, cause, self.retry_s)

    def failed(self, cause: BaseException) -> None:
        self._failure = (cause, self._clock())

    def succeeded(self) -> None:
        self._failure = None

    def recent_failure(self, now: float) -> BaseException | None:
        """The last failed start's cause, while its retry delay lasts."""
        if self._failure is not None and now - self._failure[1] < self.retry_s:
            return self._failure[0]
        return None

    def times(self, kind: Kind) -> StartTimes:
        return self._wake_times if kind == "wake" else self._start_times

    def estimate_s(self, next_kind: Callable[[], Kind]) -> float | None:
        """How long what a request would wait for takes: the episode under way, else
        `next_kind()` (None: none measured)."""
        return self._waited_for(next_kind).estimate_s()

    def remaining_s(self, next_kind: Callable[[], Kind]) -> float | None:
        """The estimate less what the episode under way has taken (None: none measured)."""
        elapsed = self._clock() - self.current.started_at if self.current else 0.0
        return self._waited_for(next_kind).remaining_s(elapsed)

    def expire(self) -> None:
        self._timeline.expire()

    def close(self) -> None:
        if self.current is not None:
            self.settle_failed(self.current, RuntimeError("the manager was closed"), "closed")
        self._timeline.finish_backend(self.backend)

    def _waited_for(self, next_kind: Callable[[], Kind]) -> StartTimes:
        return self.times(self.current.kind if self.current else next_kind())
