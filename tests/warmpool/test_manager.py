"""ColdStartManager with a fake provider (and the real WeightStager on an in-memory source),
a hand-driven clock and hand-driven ticks; then once with real processes, 0 -> 1 -> 0."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup

from backends.providers.errors import ReplicaNotFound
from backends.providers.process import ProcessProvider
from backends.providers.replicas import Phase, Replica, ReplicaEvent, notify
from backends.providers.restart_policy import RestartBackoff
from tests.backends.support import wait_until
from tests.backends.test_process_provider import FAST, mini
from warmpool.autoscale import ReplicaLoad, ScalePolicy
from warmpool.errors import SourceNotFound
from warmpool.manager import ColdStartFailed, ColdStartHandle, ColdStartManager
from warmpool.retry import TransferRetryPolicy
from warmpool.source import RemoteObject, S3Location, WeightSource
from warmpool.staging import WeightStager
from warmpool.timeline import (
    ColdStartRecord,
    ColdStartTimeline,
    JsonLinesSink,
    MemorySink,
    phase_durations,
)

URI = "s3://weights/tiny/"
NEVER = 3600.0  # tick_s: the loop stays asleep; tests call tick() themselves


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeReplicaProvider:
    """An in-memory ReplicaProvider: replicas load until `load()` (or `load_after_s`)."""

    def __init__(self, load_after_s: float | None = None) -> None:
        self.name = "fake"
        self.on_change: list[Callable[[ReplicaEvent], None]] = []
        self.ensure_calls: list[int] = []
        self.stop_calls: list[str] = []
        self.closed = False
        self._load_after_s = load_after_s
        self._ready: dict[str, Replica] = {}
        self._loading: list[str] = []
        self._numbers = iter(range(1, 1000))
        self._task_group: TaskGroup | None = None
        self._timers = anyio.CancelScope()

    async def start(self, task_group: TaskGroup) -> None:
        self._task_group = task_group

    async def ensure(self, count: int) -> None:
        self.ensure_calls.append(count)
        for _ in range(count - len(self._ready) - len(self._loading)):
            replica_id = f"fake-{next(self._numbers)}"
            self._loading.append(replica_id)
            self._emit("process_started", replica_id)
            if self._load_after_s is not None:
                assert self._task_group is not None
                self._task_group.start_soon(self._load_later, replica_id)
        while len(self._ready) + len(self._loading) > count:  # not-ready first
            victim = self._loading.pop() if self._loading else list(self._ready)[-1]
            self._ready.pop(victim, None)
            self._emit("stopped", victim)

    def ready(self) -> list[Replica]:
        return list(self._ready.values())

    def starting(self) -> int:
        return len(self._loading)

    async def stop_replica(self, replica_id: str) -> None:
        self.stop_calls.append(replica_id)
        if replica_id in self._loading:
            raise AssertionError(f"asked to stop {replica_id}, which is still loading")
        if self._ready.pop(replica_id, None) is None:
            raise ReplicaNotFound(replica_id)
        await anyio.sleep(0)
        self._emit("stopped", replica_id)

    async def close(self) -> None:
        self.closed = True
        self._timers.cancel()

    def load(self, *replica_ids: str) -> None:
        for replica_id in replica_ids or list(self._loading):
            self._loading.remove(replica_id)
            self._ready[replica_id] = Replica(replica_id, f"http://{replica_id}/v1")
            self._emit("ready", replica_id)

    def crash(self, replica_id: str) -> None:
        """It ends on its own; like ProcessProvider, the replica restarts (loads again)."""
        del self._ready[replica_id]
        self._emit("crashed", replica_id)
        self._loading.append(replica_id)
        self._emit("process_started", replica_id)

    async def _load_later(self, replica_id: str) -> None:
        assert self._load_after_s is not None
        with self._timers:
            await anyio.sleep(self._load_after_s)
            if replica_id in self._loading:
                self.load(replica_id)

    def _emit(self, phase: Phase, replica_id: str) -> None:
        notify(self.on_change, ReplicaEvent(self.name, phase, replica_id, time.time()))


class MemorySource:
    """A WeightSource over a dict; `gate` holds the listing until set; `missing` fails it."""

    def __init__(self, files: dict[str, bytes], *, missing: bool = False) -> None:
        self.files = files
        self.missing = missing
        self.gate: anyio.Event | None = None
        self.listings = 0

    @asynccontextmanager
    async def open(self) -> AsyncIterator[WeightSource]:
        yield self

    async def list_objects(self, location: S3Location) -> list[RemoteObject]:
        self.listings += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.missing:
            raise SourceNotFound(f"no objects under {location}")
        return [
            RemoteObject(location.bucket, location.prefix + name, name, len(data), _md5(data))
            for name, data in self.files.items()
        ]

    async def read_range(self, obj: RemoteObject, start: int, stop: int) -> bytes:
        return self.files[obj.name][start:stop]

    async def read_into(self, obj: RemoteObject, start: int, buffer: memoryview) -> None:
        buffer[:] = self.files[obj.name][start : start + len(buffer)]


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


class Metrics:
    def __init__(self) -> None:
        self.cold_starts: list[str] = []
        self.phases: list[tuple[str, str, float]] = []

    def on_cold_start(self, backend: str) -> None:
        self.cold_starts.append(backend)

    def on_phase(self, backend: str, phase: str, seconds: float) -> None:
        self.phases.append((backend, phase, seconds))


class Rig:
    """A manager on a fake provider, with what it reported."""

    def __init__(self, policy: ScalePolicy, clock: FakeClock, **kw: Any) -> None:
        self.clock = clock
        self.provider = kw.pop("provider", None) or FakeReplicaProvider()
        self.sink = MemorySink()
        self.metrics = Metrics()
        self.timeline = ColdStartTimeline(self.sink, self.metrics, clock=clock)
        self.queued = 0
        self.load: dict[str, ReplicaLoad] = {}  # what the request path would count
        self.manager = ColdStartManager(
            "llm",
            self.provider,
            policy,
            timeline=self.timeline,
            load=lambda: self.load,
            demand=lambda: self.queued,
            clock=clock,
            tick_s=kw.pop("tick_s", NEVER),
            **kw,
        )
        self.ready_sets: list[list[str]] = []
        self.failures: list[ColdStartFailed] = []
        self.manager.on_ready_change.append(lambda r: self.ready_sets.append([x.id for x in r]))
        self.manager.on_start_failed.append(self.failures.append)

    def ids(self) -> list[str]:
        return [replica.id for replica in self.manager.ready()]

    def request_started(self, replica_id: str) -> None:
        in_flight, served = self.load.get(replica_id, ReplicaLoad(0, 0))
        self.load[replica_id] = ReplicaLoad(in_flight + 1, served)

    def request_finished(self, replica_id: str) -> None:
        in_flight, served = self.load[replica_id]
        self.load[replica_id] = ReplicaLoad(in_flight - 1, served + 1)


async def settled(handle: ColdStartHandle) -> None:
    """Until the start `handle` waits for is over; raises its failure, if it failed."""
    await wait_until(
        lambda: handle.ready_at is not None or handle.failure is not None, "the start to settle"
    )
    if handle.failure is not None:
        raise handle.failure


@asynccontextmanager
async def running(
    policy: ScalePolicy, clock: FakeClock | None = None, **kw: Any
) -> AsyncIterator[Rig]:
    rig = Rig(policy, clock or FakeClock(), **kw)
    async with anyio.create_task_group() as task_group:
        await rig.manager.start(task_group)
        try:
            yield rig
        finally:
            with anyio.fail_after(5):
                await rig.manager.close()


def stager(tmp_path: Path, source: MemorySource) -> WeightStager:
    retry = TransferRetryPolicy(max_attempts=1)
    return WeightStager(
        tmp_path / "cache", source.open, 1 << 30, readahead="none", retry=retry, parallelism=2
    )


# -- activation -------------------------------------------------------------------------


async def test_twenty_concurrent_activations_start_one_replica_and_all_wait_for_it() -> None:
    async with running(ScalePolicy(max_replicas=4)) as rig:
        handles: list[ColdStartHandle] = []
        waited: list[float | None] = []

        async def request() -> None:
            handle = rig.manager.activate()
            assert handle is not None
            handles.append(handle)
            rig.queued += 1
            await settled(handle)
            waited.append(handle.cold_start_s)

        async with anyio.create_task_group() as requests:
            for _ in range(20):
                requests.start_soon(request)
            await wait_until(lambda: rig.provider.starting() == 1, "the one start")
            await anyio.sleep(0.05)
            assert rig.provider.ensure_calls == [1]
            assert len({handle.id for handle in handles}) == 1
            rig.clock.advance(4.0)
            rig.provider.load()
        assert waited == [4.0] * 20
        assert rig.ready_sets == [["fake-1"]]
        assert rig.manager.activate() is None
        assert rig.provider.ensure_calls == [1]
        assert rig.metrics.cold_starts == ["llm"]


async def test_activation_while_warm_returns_none_and_does_not_start() -> None:
    async with running(ScalePolicy(min_replicas=1)) as rig:
        await wait_until(lambda: rig.provider.starting() == 1, "min_replicas")
        rig.provider.load()
        await wait_until(rig.manager.ready, "the ready set")
        assert rig.manager.activate() is None
        assert rig.provider.ensure_calls == [1]
        [record] = rig.sink.records  # a start no request waited for ends at ready
        assert (record.trigger, record.outcome) == ("startup", "ready")


async def test_a_crash_while_requests_are_held_is_the_providers_to_restart() -> None:
    async with running(ScalePolicy()) as rig:
        handle = rig.manager.activate()
        assert handle is not None
        await wait_until(lambda: rig.provider.starting() == 1, "the start")
        rig.provider.load()
        await settled(handle)
        rig.provider.crash("fake-1")
        await wait_until(lambda: rig.manager.ready() == [], "the crash")
        second = rig.manager.activate()
        assert second is not None and second.id != handle.id
        rig.manager.tick()
        await anyio.sleep(0.05)
        assert rig.provider.ensure_calls == [1]  # the replica is starting again: no new one
        rig.provider.load()
        await settled(second)
        second.first_byte()
        record = rig.sink.records[-1]
        assert [name for name, _ in record.events] == ["request_arrived", "ready", "first_byte"]
        assert rig.ready_sets == [["fake-1"], [], ["fake-1"]]


# -- scale-down -------------------------------------------------------------------------

DOWN = ScalePolicy(
    max_replicas=2, stable_window_s=5, panic_window_s=1, idle_s=10, last_replica_idle_s=30
)


async def test_idle_scale_down_to_zero_honours_both_delays_and_in_flight_requests() -> None:
    async with running(DOWN, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        assert manager.activate() is not None
        await wait_until(lambda: provider.starting() == 1, "the cold start")
        provider.load()
        rig.queued = 4
        for _ in range(2):  # sustained: 2 per replica is the target
            clock.advance(1)
            manager.tick()
        await wait_until(lambda: provider.starting() == 1, "the second replica")
        provider.load()
        await wait_until(lambda: len(manager.ready()) == 2, "two ready")
        rig.queued = 0
        rig.request_started("fake-1")

        clock.now = 11.0  # fake-2 ready at 2: idle 9 s
        manager.tick()
        clock.now = 12.5  # idle 10.5 s; fake-1 is busy
        assert manager.tick().stop == ("fake-2",)
        await wait_until(lambda: provider.stop_calls == ["fake-2"], "fake-2 to stop")
        assert rig.ids() == ["fake-1"]

        clock.now = 500.0  # long idle, but a request is in flight
        assert manager.tick().stop == ()
        rig.request_finished("fake-1")
        clock.now = 501.0  # the tick after the request ended sees it: active at 501
        assert manager.tick().stop == ()
        clock.now = 530.0
        assert manager.tick().reason == "hold 1 (want 0): no replica idle for 30 s"
        clock.now = 531.0
        decision = manager.tick()
        assert (decision.target, decision.stop) == (0, ("fake-1",))
        await wait_until(lambda: provider.ready() == [], "fake-1 to stop")
        assert provider.stop_calls == ["fake-2", "fake-1"]
        assert rig.ready_sets == [["fake-1"], ["fake-1", "fake-2"], ["fake-1"], []]
        assert provider.ensure_calls == [1, 2]  # never lowered: stops went by stop_replica


async def test_a_replica_still_loading_is_never_stopped_nor_counted_down() -> None:
    async with running(DOWN, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        manager.activate()
        await wait_until(lambda: provider.starting() == 1, "the cold start")
        provider.load()
        rig.queued = 4
        for _ in range(2):
            clock.advance(1)
            manager.tick()
        await wait_until(lambda: provider.starting() == 1, "the second replica")
        rig.queued = 0
        for _ in range(5):  # fake-2 loads for ages; fake-1 is idle throughout
            clock.advance(100)
            assert manager.tick().reason == "hold 2 (want 0): a replica is still starting"
        assert provider.stop_calls == [] and provider.ensure_calls == [1, 2]
        provider.load()
        await wait_until(lambda: len(manager.ready()) == 2, "two ready")
        clock.advance(11)
        assert manager.tick().stop == ("fake-1",)  # idle longest (fake-2 was just ready)


async def test_a_request_arriving_as_the_last_replica_goes_starts_one_again() -> None:
    policy = ScalePolicy(stable_window_s=1, panic_window_s=1, idle_s=0, last_replica_idle_s=0)
    async with running(policy, FakeClock(0.0)) as rig:
        rig.manager.activate()
        await wait_until(lambda: rig.provider.starting() == 1, "the cold start")
        rig.provider.load()
        rig.clock.advance(5)
        assert rig.manager.tick().stop == ("fake-1",)
        handle = rig.manager.activate()  # before the stop task ran
        assert handle is not None
        await wait_until(lambda: rig.provider.starting() == 1, "a new start")
        rig.provider.load()
        await settled(handle)
        assert rig.provider.stop_calls == ["fake-1"]


# -- scale-up ---------------------------------------------------------------------------


async def test_scale_up_under_sustained_queue_after_the_window() -> None:
    policy = ScalePolicy(min_replicas=1, max_replicas=3, stable_window_s=10, panic_window_s=2)
    async with running(policy, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        await wait_until(lambda: provider.starting() == 1, "min_replicas")
        provider.load()
        for _ in range(10):  # quiet
            clock.advance(1)
            manager.tick()
        rig.queued = 3  # 1.5x the target: above it, below panic
        decisions = []
        for _ in range(10):
            clock.advance(1)
            decisions.append(manager.tick())
        assert decisions[0].target == 1  # not at the first sample...
        assert decisions[-1].target == 2  # ...but within the stable window
        assert not any(d.panicking(clock(), policy) for d in decisions)
        await wait_until(lambda: provider.ensure_calls == [1, 2], "the scale-up")
        assert manager.snapshot().desired == 2


async def test_panic_scales_to_the_burst_at_once_and_holds_a_stable_window() -> None:
    policy = ScalePolicy(max_replicas=4, stable_window_s=10, panic_window_s=2, idle_s=0)
    async with running(policy, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        manager.activate()
        await wait_until(lambda: provider.starting() == 1, "the cold start")
        provider.load()
        await wait_until(manager.ready, "ready")
        rig.queued = 20
        clock.advance(1)
        decision = manager.tick()
        assert (decision.target, decision.reason) == (4, "panic: scale up 1 -> 4")
        await wait_until(lambda: provider.starting() == 3, "three more")
        provider.load()
        await wait_until(lambda: len(manager.ready()) == 4, "four ready")
        assert manager.snapshot().panic
        rig.queued = 0
        for _ in range(9):
            clock.advance(1)
            assert manager.tick().target == 4
        clock.advance(1)  # a stable window after the last panic
        assert len(manager.tick().stop) == 1
        await wait_until(lambda: len(manager.ready()) == 3, "one fewer")


async def test_warm_pool_keeps_extra_ready_replicas() -> None:
    policy = ScalePolicy(min_replicas=1, max_replicas=4, warm_pool=1, idle_s=0)
    async with running(policy, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        await wait_until(lambda: provider.starting() == 2, "min_replicas + warm pool")
        provider.load()
        for _ in range(100):
            clock.advance(1)
            assert manager.tick().stop == ()
        assert len(manager.ready()) == 2
        rig.queued = 3  # one busy replica's worth and a half: need 2, plus one warm
        for _ in range(60):
            clock.advance(1)
            manager.tick()
        await wait_until(lambda: provider.ensure_calls == [2, 3], "the warm one on top")


# -- weights ----------------------------------------------------------------------------


async def test_pinned_weights_are_staged_at_start_and_not_on_the_request_path(
    tmp_path: Path,
) -> None:
    source = MemorySource({"w.bin": b"w" * 3000, "config.json": b"{}"})
    async with stager(tmp_path, source) as weights:
        kw = {"stager": weights, "weights_uri": URI, "model": "tiny", "pin_weights": True}
        async with running(ScalePolicy(), **kw) as rig:
            await wait_until(lambda: weights.is_staged("tiny"), "the pinned staging")
            assert [e.model for e in weights.snapshot() if e.pinned] == ["tiny"]
            assert rig.provider.ensure_calls == []  # min_replicas 0: staged, not started
            handle = rig.manager.activate()
            assert handle is not None
            await wait_until(lambda: rig.provider.starting() == 1, "the start")
            rig.provider.load()
            await settled(handle)
            handle.first_byte()
        [record] = rig.sink.records
        assert "staging_begun" not in [name for name, _ in record.events]
        assert source.listings == 1
        staged = weights.staged("tiny")
        assert staged is not None and (staged.path / "w.bin").read_bytes() == b"w" * 3000


async def test_weights_are_staged_before_the_first_start_and_timed(tmp_path: Path) -> None:
    source = MemorySource({"w.bin": b"x" * 5000})
    source.gate = anyio.Event()
    async with stager(tmp_path, source) as weights:
        kw = {"stager": weights, "weights_uri": URI, "model": "tiny"}
        async with running(ScalePolicy(), FakeClock(0.0), **kw) as rig:
            handles = [rig.manager.activate() for _ in range(3)]
            await wait_until(lambda: source.listings == 1, "the staging")
            assert rig.provider.ensure_calls == []  # weights first
            rig.clock.now = 2.0
            source.gate.set()
            await wait_until(lambda: rig.provider.starting() == 1, "the start after staging")
            await anyio.sleep(0.02)  # the manager takes the provider's event
            rig.clock.now = 5.0
            rig.provider.load()
            await wait_until(rig.manager.ready, "ready")
            rig.clock.now = 5.5
            for handle in handles[:2]:
                assert handle is not None
                handle.first_byte()  # the second call changes nothing
    [record] = rig.sink.records
    assert [name for name, _ in record.events] == [
        "request_arrived",
        "staging_begun",
        "staging_done",
        "process_started",
        "ready",
        "first_byte",
    ]
    assert record.phases == {"staging": 2.0, "loading": 3.0, "first_byte": 0.5, "total": 5.5}
    assert (record.outcome, record.backend, record.model) == ("served", "llm", "tiny")
    assert sorted(p for _, p, _ in rig.metrics.phases) == sorted(record.phases)


async def test_staging_failure_fails_the_held_requests_at_once(tmp_path: Path) -> None:
    source = MemorySource({}, missing=True)
    source.gate = anyio.Event()
    async with stager(tmp_path, source) as weights:
        kw = {"stager": weights, "weights_uri": URI, "retry_after_failure_s": 5.0}
        async with running(ScalePolicy(), FakeClock(0.0), **kw) as rig:
            handles = [rig.manager.activate() for _ in range(3)]
            errors: list[ColdStartFailed] = []

            async def wait(handle: ColdStartHandle | None) -> None:
                assert handle is not None
                with pytest.raises(ColdStartFailed) as caught:
                    await settled(handle)
                errors.append(caught.value)

            with anyio.fail_after(2):
                async with anyio.create_task_group() as waiters:
                    for handle in handles:
                        waiters.start_soon(wait, handle)
                    await anyio.sleep(0.01)
                    source.gate.set()
            assert len(errors) == 3 and len(rig.failures) == 1
            failure = rig.failures[0]
            assert isinstance(failure.__cause__, SourceNotFound)
            assert not failure.temporary and failure.retry_after_s == 5.0
            assert "cold start failed: SourceNotFound" in str(failure)
            with pytest.raises(ColdStartFailed):  # within the retry delay: fail fast
                rig.manager.activate()
            assert rig.manager.snapshot().failure is not None
            rig.manager.tick()
            assert source.listings == 1 and rig.provider.ensure_calls == []
            rig.clock.advance(5.0)
            source.missing = False
            source.files = {"w.bin": b"ok"}
            handle = rig.manager.activate()  # after it: try again
            assert handle is not None
            await wait_until(lambda: rig.provider.starting() == 1, "the retried start")
        assert [r.outcome for r in rig.sink.records] == ["failed", "closed"]
        assert "no objects under" in rig.sink.records[0].detail


# -- timeline ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "phases"),
    [
        ([], {}),
        ([("request_arrived", 0.0)], {}),
        (
            [("process_started", 1.0), ("ready", 4.0)],
            {"loading": 3.0, "total": 3.0},
        ),
        (
            [
                ("request_arrived", 0.0),
                ("process_started", 0.5),
                ("crashed", 2.0),
                ("process_started", 3.0),
                ("ready", 7.0),
                ("first_byte", 7.25),
            ],
            {"loading": 4.0, "first_byte": 0.25, "total": 7.25},
        ),
    ],
)
def test_phase_durations(events: list[tuple[str, float]], phases: dict[str, float]) -> None:
    assert phase_durations(events) == phases


def test_timeline_ends_without_a_first_byte_after_the_grace_time(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    sink = JsonLinesSink(tmp_path / "cold.jsonl")
    timeline = ColdStartTimeline(sink, clock=clock, first_byte_grace_s=10)
    start = timeline.begin("llm", "tiny", "request")
    timeline.mark(start, "request_arrived")
    clock.now = 3.0
    timeline.mark(start, "ready")
    clock.now = 12.9
    timeline.expire()
    assert timeline.is_open(start)
    clock.now = 13.0
    timeline.expire()
    assert not timeline.is_open(start)
    timeline.first_byte(start)  # too late: ignored
    [line] = (tmp_path / "cold.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["outcome"], record["phases"]) == ("no_first_byte", {"total": 3.0})


def test_a_wall_clock_step_changes_no_duration() -> None:
    """Durations are read on the monotonic clock; the record's times are the wall clock's
    at the beginning plus the time elapsed since, so they agree with the phases."""
    steady, wall = FakeClock(50.0), FakeClock(1_700_000_000.0)
    sink = MemorySink()
    timeline = ColdStartTimeline(sink, clock=steady, wall=wall, first_byte_grace_s=10)
    start = timeline.begin("llm", "tiny", "request")
    timeline.mark(start, "request_arrived")
    steady.advance(4.0)
    wall.advance(-3600.0)  # set back an hour (NTP) while the replica loads
    timeline.mark(start, "ready")
    wall.advance(7200.0)  # and then an hour forward: no grace time has passed
    timeline.expire()
    assert timeline.is_open(start)
    steady.advance(0.5)
    timeline.first_byte(start)
    [record] = sink.records
    assert (record.outcome, record.phases) == ("served", {"first_byte": 0.5, "total": 4.5})
    assert record.begun_at == 1_700_000_000.0
    assert [at for _, at in record.events] == [1_700_000_000.0, 1_700_000_004.0, 1_700_000_004.5]


def test_a_broken_sink_or_metrics_hook_does_not_break_the_timeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def write(self, record: ColdStartRecord) -> None:
            raise OSError("disk full")

        def on_cold_start(self, backend: str) -> None:
            raise RuntimeError("boom")

        def on_phase(self, backend: str, phase: str, seconds: float) -> None:
            raise RuntimeError("boom")

    timeline = ColdStartTimeline(Broken(), Broken())
    start = timeline.begin("llm", "tiny", "startup")
    timeline.mark(start, "ready")
    assert not timeline.is_open(start)
    assert "disk full" in caplog.text


# -- real processes ---------------------------------------------------------------------


async def test_process_provider_scales_from_zero_to_one_and_back(tmp_path: Path) -> None:
    provider = ProcessProvider(
        "mini", mini(tmp_path, "--ready-after", "0.3"), FAST, RestartBackoff(initial_s=0.05)
    )
    policy = ScalePolicy(
        stable_window_s=0.3, panic_window_s=0.1, idle_s=0.1, last_replica_idle_s=0.5
    )
    sink = MemorySink()
    in_queue = 0
    load: dict[str, ReplicaLoad] = {}
    manager = ColdStartManager(
        "mini",
        provider,
        policy,
        timeline=ColdStartTimeline(sink),
        load=lambda: load,
        demand=lambda: in_queue,
        tick_s=0.05,
    )
    ready_sets: list[int] = []
    manager.on_ready_change.append(lambda replicas: ready_sets.append(len(replicas)))
    async with anyio.create_task_group() as task_group:
        await manager.start(task_group)
        try:
            handle = manager.activate()
            assert handle is not None
            in_queue = 1
            with anyio.fail_after(10):
                await settled(handle)
            in_queue = 0
            [replica] = manager.ready()
            load[replica.id] = ReplicaLoad(1, 0)
            await anyio.sleep(0.8)  # longer than last_replica_idle_s, but a request is in
            assert manager.ready() == [replica] and provider.ready() == [replica]
            load[replica.id] = ReplicaLoad(0, 1)
            handle.first_byte()
            started = anyio.current_time()
            await wait_until(lambda: provider.ready() == [] and not provider.starting(), "zero")
            assert anyio.current_time() - started >= 0.45
            assert manager.activate() is not None  # and back up on demand
            await wait_until(manager.ready, "the second cold start")
        finally:
            with anyio.fail_after(10):
                await manager.close()
    assert ready_sets == [1, 0, 1]
    assert [r.outcome for r in sink.records] == ["served", "closed"]
    assert 0.25 < sink.records[0].phases["loading"] < 5
