"""Helpers for provider tests: run a provider in a task group, wait for conditions, events."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from backends.providers.replicas import ReplicaEvent, ReplicaProvider


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
