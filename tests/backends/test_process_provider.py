"""ProcessProvider against real subprocesses: `mini_server.py` plays the model server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from backends.errors import LaunchError
from backends.providers.errors import ProviderClosed, ReplicaNotFound
from backends.providers.process import ProcessLaunch, ProcessProvider, ProcessTimings
from backends.providers.replicas import Replica, ReplicaEvent
from backends.providers.restart_policy import RestartBackoff
from tests.backends.support import (
    MINI_SERVER,
    alive,
    phases,
    record,
    running,
    servers,
    wait_until,
)

FAST = ProcessTimings(ready_timeout_s=10, probe_interval_s=0.05, probe_timeout_s=1, grace_s=5)
QUICK_BACKOFF = RestartBackoff(initial_s=0.05, max_s=0.2)


def mini(state: Path, *extra: str, weights: str | None = None) -> ProcessLaunch:
    command = ["{python}", str(MINI_SERVER), "--port", "{port}", "--state-dir", str(state)]
    return ProcessLaunch(command=[*command, *extra], weights=weights)


def provider_for(
    launch: ProcessLaunch, timings: ProcessTimings = FAST
) -> tuple[ProcessProvider, list[ReplicaEvent]]:
    provider = ProcessProvider("mini", launch, timings, QUICK_BACKOFF)
    return provider, record(provider)


def started_pids(events: list[ReplicaEvent]) -> list[int]:
    return [int(e.detail.split()[1]) for e in events if e.phase == "process_started"]


async def test_ensure_one_starts_one_process_ready_only_once_health_answers_200(
    tmp_path: Path,
) -> None:
    launch = mini(tmp_path, "--ready-after", "1.0", "--weights", "{weights}", weights="/w/m")
    provider, events = provider_for(launch)
    async with running(provider):
        await provider.ensure(1)
        assert (provider.starting(), provider.ready()) == (1, [])
        await wait_until(lambda: servers(tmp_path), "the server to listen")
        [info] = servers(tmp_path).values()
        port = int(str(info["port"]))
        async with httpx.AsyncClient() as client:
            health = await client.get(f"http://127.0.0.1:{port}/health")
        assert health.status_code == 503  # the port is open, the model is not loaded
        assert provider.ready() == []
        await wait_until(provider.ready, "the replica to be ready")
        assert provider.ready() == [Replica("mini-1", f"http://127.0.0.1:{port}/v1")]
        await provider.ensure(1)
        await anyio.sleep(0.2)
        assert len(servers(tmp_path)) == 1
        assert (provider.starting(), len(provider.ready())) == (0, 1)
        assert phases(events) == ["process_started", "ready"]
        assert info["weights"] == "/w/m"
        assert abs(float(str(info["spawned_at"])) - time.time()) < 30


async def test_killed_process_is_reported_crashed_and_restarted(tmp_path: Path) -> None:
    provider, events = provider_for(mini(tmp_path))
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the replica to be ready")
        [first] = started_pids(events)
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: phases(events).count("ready") == 2, "the restart")
        assert phases(events) == ["process_started", "ready", "crashed", "process_started", "ready"]
        crashed = next(event for event in events if event.phase == "crashed")
        assert (crashed.replica_id, crashed.detail) == ("mini-1", "killed by signal 9")
        [replica] = provider.ready()
        assert replica.id == "mini-1"
        assert not alive(first)
        assert all(alive(pid) for pid in started_pids(events)[1:])


async def test_process_that_exits_on_its_own_is_restarted(tmp_path: Path) -> None:
    provider, events = provider_for(mini(tmp_path))
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the replica to be ready")
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(provider.ready()[0].base_url.removesuffix("/v1") + "/crash")
        await wait_until(lambda: phases(events).count("ready") == 2, "the restart")
        crashed = [event.detail for event in events if event.phase == "crashed"]
        assert crashed == ["exited with code 3"]


async def test_stop_replica_stops_it_for_good(tmp_path: Path) -> None:
    provider, events = provider_for(mini(tmp_path))
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the replica to be ready")
        [replica] = provider.ready()
        await provider.stop_replica(replica.id)
        assert (provider.ready(), provider.starting()) == ([], 0)
        assert not alive(started_pids(events)[0])
        await anyio.sleep(0.3)
        assert phases(events) == ["process_started", "ready", "stopped"]
        with pytest.raises(ReplicaNotFound):
            await provider.stop_replica(replica.id)


async def test_stop_replica_lets_an_in_flight_request_finish(tmp_path: Path) -> None:
    provider, _ = provider_for(mini(tmp_path))
    answers: list[int] = []
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the replica to be ready")
        [replica] = provider.ready()
        root = replica.base_url.removesuffix("/v1")

        async def slow_request() -> None:
            async with httpx.AsyncClient() as client:
                answers.append((await client.get(f"{root}/slow?s=0.8")).status_code)

        async with anyio.create_task_group() as requests:
            requests.start_soon(slow_request)
            await anyio.sleep(0.2)  # the request is in the server now
            await provider.stop_replica(replica.id)
            assert provider.ready() == []
    assert answers == [200]


async def test_stop_replica_kills_a_process_that_ignores_sigterm_after_grace(
    tmp_path: Path,
) -> None:
    timings = ProcessTimings(ready_timeout_s=10, probe_interval_s=0.05, grace_s=0.3)
    provider, events = provider_for(mini(tmp_path, "--ignore-sigterm"), timings)
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the replica to be ready")
        started = anyio.current_time()
        await provider.stop_replica(provider.ready()[0].id)
        assert 0.25 < anyio.current_time() - started < 3
        assert not alive(started_pids(events)[0])


async def test_ensure_zero_stops_all_and_close_leaves_no_process(tmp_path: Path) -> None:
    provider, events = provider_for(mini(tmp_path, "--ready-after", "0.3"))
    async with running(provider):
        await provider.ensure(2)
        await wait_until(lambda: len(provider.ready()) == 2, "two ready replicas")
        await provider.ensure(0)
        assert (provider.ready(), provider.starting()) == ([], 0)
        assert phases(events).count("stopped") == 2
        assert not any(alive(pid) for pid in started_pids(events))
        await provider.ensure(3)  # then close while they are still loading
        await wait_until(lambda: len(started_pids(events)) == 5, "three more processes")
    pids = started_pids(events)
    assert not any(alive(pid) for pid in pids), [pid for pid in pids if alive(pid)]
    assert phases(events).count("stopped") == 5
    with pytest.raises(ProviderClosed):
        await provider.ensure(1)


async def test_ensure_lower_count_stops_the_replica_not_ready_yet(tmp_path: Path) -> None:
    provider, events = provider_for(mini(tmp_path))
    async with running(provider):
        await provider.ensure(1)
        await wait_until(provider.ready, "the first replica")
        await provider.ensure(2)
        await provider.ensure(1)  # mini-2 is still loading: it goes, mini-1 stays
        assert [replica.id for replica in provider.ready()] == ["mini-1"]
        stopped = [event.replica_id for event in events if event.phase == "stopped"]
        assert stopped == ["mini-2"]


async def test_server_that_never_gets_ready_is_killed_and_restarted(tmp_path: Path) -> None:
    timings = ProcessTimings(ready_timeout_s=0.4, probe_interval_s=0.05, grace_s=2)
    provider, events = provider_for(mini(tmp_path, "--ready-after", "60"), timings)
    async with running(provider):
        await provider.ensure(1)
        await wait_until(lambda: len(started_pids(events)) == 2, "a second attempt")
        crashed = next(event for event in events if event.phase == "crashed")
        assert crashed.detail == "not ready within 0.4 s"
        assert not alive(started_pids(events)[0])
        assert (provider.ready(), provider.starting()) == ([], 1)


async def test_missing_executable_is_a_crash_and_stopping_ends_the_backoff(
    tmp_path: Path,
) -> None:
    launch = ProcessLaunch(command=[str(tmp_path / "no-such-server"), "--port", "{port}"])
    provider = ProcessProvider("gone", launch, FAST, RestartBackoff(initial_s=30))
    events = record(provider)
    async with running(provider):
        await provider.ensure(1)
        await wait_until(lambda: "crashed" in phases(events), "the launch failure")
        assert events[0].detail.startswith("cannot start")
        with anyio.fail_after(2):  # not the 30 s backoff
            await provider.ensure(0)
        assert phases(events) == ["crashed", "stopped"]


def test_weights_placeholder_without_weights_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="weights"):
        ProcessProvider("m", ProcessLaunch(command=["vllm", "serve", "{weights}"]))
