"""Helpers for provider tests: run a provider in a task group, wait for conditions, events."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from backends.providers.replicas import ReplicaEvent, ReplicaProvider

# A stand-in model server (its docstring says what it answers); it writes what it is,
# pid included, to its `--state-dir` once it listens (`servers`).
MINI_SERVER = Path(__file__).with_name("mini_server.py")


def servers(state: Path) -> dict[int, dict[str, object]]:
    """pid -> what each mini server wrote once it was listening."""
    infos = (json.loads(path.read_text()) for path in state.glob("*.json"))
    return {int(info["pid"]): info for info in infos}


@asynccontextmanager
async def running(provider: ReplicaProvider) -> AsyncIterator[None]:
    """Starts the provider in a task group and closes it on the way out, whatever happens."""
    async with anyio.create_task_group() as task_group:
        await provider.start(task_group)
        try:
            yield
        finally:
            with anyio.fail_after(20):
                await provider.close()


async def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 8.0) -> None:
    deadline = anyio.current_time() + timeout_s
    while not predicate():
        if anyio.current_time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await anyio.sleep(0.02)


def record(provider: ReplicaProvider) -> list[ReplicaEvent]:
    events: list[ReplicaEvent] = []
    provider.on_change.append(events.append)
    return events


def phases(events: list[ReplicaEvent]) -> list[str]:
    return [event.phase for event in events]


def alive(pid: int) -> bool:
    """Whether a process exists (a zombie counts: it has not been reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
