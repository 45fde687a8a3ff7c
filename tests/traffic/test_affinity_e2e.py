"""Replica affinity through a real gateway in front of two upstream replicas of one
backend (`base_urls`): every request of a session reaches one replica, sessions spread
over both, the Messages and Responses APIs' session fields count, and with `affinity:
false` a session's requests go wherever there is most room."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.processes import Gateway, ServerProcess, start_fake_upstream, start_gateway
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-affinity-0123456789abcdef"


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    work = tmp_path_factory.mktemp("upstreams")
    started: list[tuple[ServerProcess, str]] = [start_fake_upstream(work) for _ in range(2)]
    yield [url for _, url in started]
    for server, _ in started:
        server.stop()


def _gateway(upstreams: list[str], work: Path, affinity: bool) -> Gateway:
    backend = fake_backend(upstreams[0], base_urls=upstreams[1:], affinity=affinity)
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [backend],
        "cache": {"enabled": False},
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    return start_gateway(config, work)


def _by_session(upstreams: list[str], sessions: list[str]) -> list[dict[str, int]]:
    """Per upstream, how many requests of each session it served (the fake counts `user`)."""
    counts = []
    for url in upstreams:
        stats = httpx.get(url.removesuffix("/v1") + "/_stats").json()
        counts.append({s: stats.get(f"user:{s}", 0) for s in sessions})
    return counts


async def _turns(gateway: Gateway, sessions: list[str], turns: int, together: bool) -> None:
    """Each session's turns in order; the sessions side by side or one after another."""
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:

        async def conversation(session: str) -> None:
            for turn in range(turns):
                body = {
                    "model": "echo",
                    "user": session,  # counted by the fake upstream
                    "messages": [{"role": "user", "content": f"turn {turn}"}],
                    "max_tokens": 4,
                }
                headers = {"authorization": f"Bearer {KEY}", "x-session-id": session}
                answer = await client.post("/chat/completions", json=body, headers=headers)
                assert answer.status_code == 200

        if together:
            await asyncio.gather(*(conversation(s) for s in sessions))
        else:
            for session in sessions:
                await conversation(session)


def test_a_sessions_requests_reach_one_replica(upstreams: list[str], tmp_path: Path) -> None:
    gateway = _gateway(upstreams, tmp_path, affinity=True)
    try:
        sessions = [f"aff-{i}" for i in range(12)]
        # One at a time: no replica is ever loaded past the bound, so nothing spills
        # (a busy home spilling is tests/traffic/test_affinity.py's).
        asyncio.run(_turns(gateway, sessions, 4, together=False))
    finally:
        gateway.stop()
    first, second = _by_session(upstreams, sessions)
    for s in sessions:
        assert sorted((first[s], second[s])) == [0, 4], (s, first[s], second[s])
    assert 0 < sum(1 for s in sessions if first[s]) < len(sessions)  # both replicas used


def test_without_affinity_a_session_goes_where_there_is_room(
    upstreams: list[str], tmp_path: Path
) -> None:
    gateway = _gateway(upstreams, tmp_path, affinity=False)
    try:
        sessions = [f"free-{i}" for i in range(12)]
        asyncio.run(_turns(gateway, sessions, 4, together=True))
    finally:
        gateway.stop()
    first, second = _by_session(upstreams, sessions)
    split = sum(1 for s in sessions if first[s] and second[s])
    assert split > 0  # some sessions were served by both replicas
