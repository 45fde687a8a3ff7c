"""The sleep tier driven by ColdStartManager against real processes: bench.fake_engine with
`--enable-sleep-mode` (vLLM's sleep endpoints, faked faithfully) under ProcessProvider,
talked to by backends.engine_sleep.VllmSleep over loopback. No mocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from backends.engine_sleep import VllmSleep
from backends.providers.process import ProcessLaunch, ProcessProvider
from backends.providers.restart_policy import RestartBackoff
from tests.backends.support import wait_until
from tests.backends.test_process_provider import FAST
from warmpool.autoscale import ReplicaLoad, ScalePolicy
from warmpool.manager import ColdStartHandle, ColdStartManager
from warmpool.timeline import ColdStartTimeline, Event, MemorySink

WAKE_S = 0.3  # the fake engine's own wake time


def engine(*extra: str) -> ProcessLaunch:
    command = ["{python}", "-m", "bench.fake_engine", "--port", "{port}", "--step-a-ms", "1"]
    return ProcessLaunch(command=[*command, *extra], ready_path="/health")


SLEEPY = engine("--enable-sleep-mode", "--wake-s", str(WAKE_S), "--doze-s", "0.05")


@dataclass
class Rig:
    manager: ColdStartManager
    provider: ProcessProvider
    sink: MemorySink
    load: dict[str, ReplicaLoad] = field(default_factory=dict)
    in_sleep_tier: list[int] = field(default_factory=list)  # on_sleep_change, in order

    def engine_stats(self) -> dict[str, Any]:
        [replica] = self.provider.ready()
        url = replica.base_url.removesuffix("/v1")
        return dict(httpx.get(url + "/_stats", timeout=5).json())

    def asleep(self) -> bool:
        """Out of the ready set for the sleep tier (dozing: the engine may not sleep yet)."""
        return self.manager.snapshot().asleep == 1 and not self.manager.ready()

    def engine_asleep(self) -> bool:
        return self.asleep() and self.engine_stats()["sleeps"] > self.engine_stats()["wakes"]


@asynccontextmanager
async def running(launch: ProcessLaunch, policy: ScalePolicy) -> AsyncIterator[Rig]:
    provider = ProcessProvider("llm", launch, FAST, RestartBackoff(initial_s=0.05))
    sink = MemorySink()
    load: dict[str, ReplicaLoad] = {}
    manager = ColdStartManager(
        "llm",
        provider,
        policy,
        timeline=ColdStartTimeline(sink),
        load=lambda: load,
        demand=lambda: sum(w.in_flight for w in load.values()),
        tick_s=0.05,
        engine_sleep=VllmSleep(timeout_s=10),
    )
    rig = Rig(manager, provider, sink, load)
    manager.on_sleep_change.append(rig.in_sleep_tier.append)
    async with anyio.create_task_group() as task_group:
        await manager.start(task_group)
        try:
            yield rig
        finally:
            with anyio.fail_after(10):
                await manager.close()


async def serve_once(rig: Rig) -> ColdStartHandle:
    """A request that finds nothing ready: it waits for its start (or wake), and is served."""
    handle = rig.manager.activate()
    assert handle is not None
    with anyio.fail_after(20):
        while handle.ready_at is None:
            assert handle.failure is None, handle.failure
            await anyio.sleep(0.01)
    [replica] = rig.manager.ready()
    served = rig.load.get(replica.id, ReplicaLoad(0, 0)).served
    rig.load[replica.id] = ReplicaLoad(0, served + 1)  # it ran, and finished
    handle.first_byte()
    return handle


async def test_idle_replica_sleeps_and_twenty_requests_share_one_wake() -> None:
    policy = ScalePolicy(idle_s=0.3, sleep_s=60, stable_window_s=0.3, panic_window_s=0.1)
    async with running(SLEEPY, policy) as rig:
        start = await serve_once(rig)
        [replica] = rig.provider.ready()
        await wait_until(rig.engine_asleep, "the idle replica asleep", timeout_s=10)
        assert rig.engine_stats()["sleeps"] == 1 and rig.provider.ready() == [replica]
        handles = [rig.manager.activate() for _ in range(20)]
        ids = {h.id if h is not None else None for h in handles}
        assert len(ids) == 1 and start.id not in ids and None not in ids
        with anyio.fail_after(10):
            await serve_once(rig)
        assert rig.manager.ready() == [replica]  # the same process, woken: nothing started
        stats = rig.engine_stats()
        assert (stats["wakes"], rig.manager.snapshot().asleep) == (1, 0)
        assert all(h is not None and h.ready_at is not None for h in handles)
    kinds = [(r.kind, r.outcome) for r in rig.sink.records]
    assert kinds[:2] == [("start", "served"), ("wake", "served")]
    woke = rig.sink.records[1]
    assert [name for name, _ in woke.events][:3] == ["request_arrived", "wake_begun", "ready"]
    assert WAKE_S <= woke.phases["wake"] < WAKE_S + 2
    assert "loading" not in woke.phases
    assert rig.in_sleep_tier[:2] == [1, 0]


async def test_requests_while_it_falls_asleep_wake_it_right_after() -> None:
    dozy = engine("--enable-sleep-mode", "--wake-s", str(WAKE_S), "--doze-s", "0.8")
    policy = ScalePolicy(idle_s=0.3, sleep_s=60, stable_window_s=0.3, panic_window_s=0.1)
    async with running(dozy, policy) as rig:
        await serve_once(rig)
        await wait_until(rig.asleep, "the idle replica leaving the ready set", timeout_s=10)
        assert rig.engine_stats()["sleeps"] == 0  # its POST /sleep takes 0.8 s
        handles = [rig.manager.activate() for _ in range(5)]
        with anyio.fail_after(10):
            await serve_once(rig)
        stats = rig.engine_stats()
        assert (stats["sleeps"], stats["wakes"]) == (1, 1)
        assert all(h is not None and h.ready_at is not None for h in handles)
    [woke] = [r for r in rig.sink.records if r.kind == "wake"]
    assert WAKE_S < woke.phases["wake"] < 0.8 + WAKE_S + 2  # the rest of the doze, the wake


async def test_asleep_replica_stops_after_sleep_s_then_a_request_starts_one() -> None:
    policy = ScalePolicy(idle_s=0.2, sleep_s=1.2, stable_window_s=0.2, panic_window_s=0.1)
    async with running(SLEEPY, policy) as rig:
        await serve_once(rig)
        await wait_until(rig.asleep, "the idle replica asleep", timeout_s=10)
        asleep_at = anyio.current_time()
        await wait_until(lambda: rig.manager.snapshot().asleep == 0, "the replica stopped", 10)
        assert not rig.provider.ready()
        assert anyio.current_time() - asleep_at >= 0.7  # sleep_s - idle_s, less a tick
        assert rig.manager.snapshot().asleep == 0 and rig.in_sleep_tier == [1, 0]
        again = await serve_once(rig)  # from zero: a start, no wake
        assert again.cold_start_s is not None
    assert [r.kind for r in rig.sink.records][:2] == ["start", "start"]


async def test_an_engine_that_refuses_to_sleep_is_stopped_and_the_tier_turned_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = ScalePolicy(idle_s=0.2, sleep_s=60, stable_window_s=0.2, panic_window_s=0.1)
    async with running(engine(), policy) as rig:  # no --enable-sleep-mode: 404
        await serve_once(rig)
        await wait_until(lambda: not rig.provider.ready(), "the replica stopped", timeout_s=10)
        assert rig.manager.snapshot().asleep == 0
        await serve_once(rig)  # back with a start
        await anyio.sleep(0.5)  # idle past idle_s: now it waits for last_replica_idle_s
        assert rig.manager.ready() and rig.manager.snapshot().asleep == 0
    assert "sleep refused" in caplog.text
    records = [json.loads(json.dumps(r.to_json())) for r in rig.sink.records]
    assert all(r["kind"] == "start" for r in records)


def test_a_wakes_metrics_are_its_own_series() -> None:
    """A wake is no cold start: no on_cold_start, and phases named wake_*."""
    seen: list[tuple[str, ...]] = []

    class Metrics:
        def on_cold_start(self, backend: str) -> None:
            seen.append(("cold_start", backend))

        def on_phase(self, backend: str, phase: str, seconds: float) -> None:
            seen.append((phase,))

    clock = iter([0.0, 0.0, 0.0, 0.25, 0.5]).__next__
    timeline = ColdStartTimeline(MemorySink(), Metrics(), clock=clock)
    woke = timeline.begin("llm", "m", "request", "wake")
    events: tuple[Event, ...] = ("request_arrived", "wake_begun", "ready", "first_byte")
    for event in events:
        timeline.mark(woke, event)
    assert seen == [("wake",), ("wake_first_byte",), ("wake_total",)]
