"""Cold-start timelines: what happened, and when, between a request and its first byte.

A cold start begins when a backend with no ready replica must start one (for a request,
at startup, or on the autoscaler's word) and is recorded as events with wall-clock times
(the wall clock read once, at the beginning, plus the monotonic time elapsed since: a
wall-clock step while a replica loads changes no duration, here or in the report):

    request_arrived ─► staging_begun ─► staging_done ─► process_started ─► ready ─► first_byte
                       (only when the weights were not staged yet)   (crashed: a failed try)

A wake (an asleep replica's engine woken, `kind: "wake"`; see `warmpool.sleep`) has its
own shorter line, no process being started:

    request_arrived ─► wake_begun ─► ready ─► first_byte

The cold-start manager marks all of them but `first_byte`, which the gateway marks when
the first answer's first byte leaves for a client that waited. A start that no request
waits for ends at `ready`; one that fails ends at once; one whose waiting requests never
got a first byte (shed, client gone) ends `first_byte_grace_s` after `ready` (`expire`).

A finished timeline becomes a `ColdStartRecord`: handed to the `TimelineSink` (the state
store, for the cold-start report) and split into phases for the `TimelineMetrics` hook
(Prometheus histograms in the gateway; nothing here imports prometheus):

    staging     staging_begun → staging_done
    engine_*    where the start went inside the engine, as it reported it (a vLLM process
                replica: imports_and_processes, weights, compile_and_warmup, kv_cache,
                api_server, read from its log by backends/vllm_startup.py)
    loading     the last process_started before ready → ready (weights load + probe)
    wake        wake_begun → ready (the engine's /wake_up, and the gateway seeing it)
    first_byte  ready → first_byte
    total       the first event → first_byte (or ready, when no request waited)

The metrics hook gets a wake's phases as `wake`, `wake_first_byte` and `wake_total`, and
no `on_cold_start`: a start's series stay starts only.

Sinks and hooks run inline on the event loop: they must not block (post to a stream).
An exception in one is logged and does not reach the cold start.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

log = logging.getLogger(__name__)

Event = Literal[
    "request_arrived",
    "staging_begun",
    "staging_done",
    "process_started",
    "ready",
    "first_byte",
    "crashed",
    "wake_begun",
]
Outcome = Literal["served", "ready", "failed", "no_first_byte", "closed"]
PHASES = ("staging", "loading", "wake", "first_byte", "total")


@dataclass(frozen=True)
class ColdStartRecord:
    id: str
    backend: str
    model: str
    trigger: str  # "request", "startup", "autoscaler" or "prewarm"
    outcome: Outcome
    events: tuple[tuple[str, float], ...]  # (event, unix time), in the order they happened
    phases: Mapping[str, float]  # seconds, for the phases whose ends were both seen
    detail: str = ""  # why it failed, for "failed"
    begun_at: float | None = None  # unix time of `begin` (a start may fail before any event)
    kind: str = "start"  # or "wake": an asleep replica woken, no process started

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "backend": self.backend,
            "model": self.model,
            "trigger": self.trigger,
            "outcome": self.outcome,
            "events": [{"event": name, "at": at} for name, at in self.events],
            "phases": dict(self.phases),
            "detail": self.detail,
            "begun_at": self.begun_at,
            "kind": self.kind,
        }


class TimelineSink(Protocol):
    def write(self, record: ColdStartRecord) -> None:
        """Keeps a finished timeline; must not block (post it to a writer task)."""
        ...


class TimelineMetrics(Protocol):
    def on_cold_start(self, backend: str) -> None: ...

    def on_phase(self, backend: str, phase: str, seconds: float) -> None: ...


def phase_durations(events: Sequence[tuple[str, float]]) -> dict[str, float]:
    first: dict[str, float] = {}
    for name, at in events:
        first.setdefault(name, at)
    phases: dict[str, float] = {}
    if "staging_begun" in first and "staging_done" in first:
        phases["staging"] = first["staging_done"] - first["staging_begun"]
    ready = first.get("ready")
    if ready is not None and "wake_begun" in first:
        phases["wake"] = ready - first["wake_begun"]
    if ready is not None:
        launches = [at for name, at in events if name == "process_started" and at <= ready]
        if launches:  # a crashed try before it is part of the total, not of the load time
            phases["loading"] = ready - launches[-1]
    served = first.get("first_byte")
    if served is not None and ready is not None:
        phases["first_byte"] = served - ready
    end = served if served is not None else ready
    if end is not None and events:
        phases["total"] = end - min(at for _, at in events)
    return phases


@dataclass
class _Open:
    id: str
    backend: str
    model: str
    trigger: str
    begun_at: float  # the wall clock's time
    started: float  # the monotonic clock's, at the same moment
    kind: str = "start"
    events: list[tuple[str, float]] = field(default_factory=list)  # monotonic times
    engine: dict[str, float] = field(default_factory=dict)  # `engine_<phase>` -> seconds

    def has(self, event: str) -> bool:
        return any(name == event for name, _ in self.events)

    def wall_events(self) -> tuple[tuple[str, float], ...]:
        return tuple((name, self.begun_at + at - self.started) for name, at in self.events)


class ColdStartTimeline:
    """Open timelines by id; may be shared by the managers of several backends.

    `clock` measures durations (monotonic); `wall` dates each timeline's beginning."""

    def __init__(
        self,
        sink: TimelineSink | None = None,
        metrics: TimelineMetrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        first_byte_grace_s: float = 120.0,
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._grace_s = first_byte_grace_s
        self._open: dict[str, _Open] = {}
        self._numbers = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]  # ids stay distinct across gateway replicas

    def begin(self, backend: str, model: str, trigger: str, kind: str = "start") -> str:
        start_id = f"{backend}-{self._prefix}-{next(self._numbers)}"
        timeline = _Open(start_id, backend, model, trigger, self._wall(), self._clock(), kind)
        self._open[start_id] = timeline
        if self._metrics is not None and kind == "start":
            _safely(self._metrics.on_cold_start, backend)
        return start_id

    def mark(self, start_id: str, event: Event) -> None:
        """Records `event` now; a start that no request waits for ends at `ready`."""
        timeline = self._open.get(start_id)
        if timeline is None:
            return  # finished already (a late event)
        timeline.events.append((event, self._clock()))
        if event == "first_byte":
            self.finish(start_id, "served")
        elif event == "ready" and not timeline.has("request_arrived"):
            self.finish(start_id, "ready")

    def engine_phases(self, start_id: str, phases: Mapping[str, float]) -> None:
        """Where the start went, as its engine reported it (backends/vllm_startup.py): kept
        in the record's phases as `engine_<phase>`, beside the timeline's own."""
        timeline = self._open.get(start_id)
        if timeline is not None:
            timeline.engine.update({f"engine_{name}": s for name, s in phases.items()})

    def first_byte(self, start_id: str) -> None:
        """The gateway's call, for each request that waited; only the first one counts."""
        self.mark(start_id, "first_byte")

    def is_open(self, start_id: str) -> bool:
        return start_id in self._open

    def finish(self, start_id: str, outcome: Outcome, detail: str = "") -> ColdStartRecord | None:
        timeline = self._open.pop(start_id, None)
        if timeline is None:
            return None
        phases: dict[str, float] = {}
        if outcome in ("served", "ready", "no_first_byte"):
            phases = {**phase_durations(timeline.events), **timeline.engine}
        record = ColdStartRecord(
            timeline.id,
            timeline.backend,
            timeline.model,
            timeline.trigger,
            outcome,
            timeline.wall_events(),
            phases,
            detail,
            timeline.begun_at,
            timeline.kind,
        )
        if self._metrics is not None:
            for phase, seconds in phases.items():
                name = phase if record.kind == "start" or phase == "wake" else f"wake_{phase}"
                _safely(self._metrics.on_phase, record.backend, name, seconds)
        if self._sink is not None:
            _safely(self._sink.write, record)
        return record

    def finish_backend(self, backend: str, outcome: Outcome = "closed") -> None:
        """Ends the backend's open timelines (its manager is closing)."""
        for timeline in [t for t in self._open.values() if t.backend == backend]:
            self.finish(timeline.id, outcome)

    def expire(self) -> None:
        """Ends timelines whose waiting requests got no first byte within the grace time."""
        now = self._clock()
        for timeline in list(self._open.values()):
            ready = next((at for name, at in timeline.events if name == "ready"), None)
            if ready is not None and now - ready >= self._grace_s:
                self.finish(timeline.id, "no_first_byte")


def _safely(call: Callable[..., None], *args: object) -> None:
    """A broken sink or metrics hook is logged; it never fails the cold start."""
    try:
        call(*args)
    except Exception:
        log.exception("cold-start timeline hook %r failed", call)


class MemorySink:
    """Keeps records in a list (tests, and a gateway without a state store)."""

    def __init__(self) -> None:
        self.records: list[ColdStartRecord] = []

    def write(self, record: ColdStartRecord) -> None:
        self.records.append(record)


class JsonLinesSink:
    """Appends one JSON line per record. A small blocking write per cold start (cold starts
    are seconds apart at most): for tests and single-process tools, not the state store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: ColdStartRecord) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
