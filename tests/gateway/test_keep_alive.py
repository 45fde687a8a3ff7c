"""Idle client connections: kept open for `limits.keep_alive_s`, then closed by the gateway,
or sooner for a new client when `limits.max_connections` are open.

A proxy or load balancer that pools connections to the gateway must close an idle one
before the gateway does: one it reuses as the gateway closes it reads a broken connection
(a client of the real-engine tests read exactly that, httpx.ReadError, when the gateway
closed at uvicorn's 5 s and the client's own pool kept connections 5 s too)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from bench.processes import Gateway, start_gateway
from gateway.settings import Limits
from tests.conftest import fake_backend
from tests.support.raw_http import read_answer

PROBE = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"


def _answered(sock: socket.socket) -> bool:
    """Whether a probe on this connection is answered 200 (False: the gateway closed it)."""
    try:
        sock.sendall(PROBE)
        status, _ = read_answer(sock)
    except ConnectionError:  # reset, broken pipe, or closed
        return False
    return status.startswith(b"HTTP/1.1 200 ")


def _gateway(fake_upstream: str, tmp_path: Path, limits: dict[str, int]) -> Gateway:
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "limits": limits,
    }
    return start_gateway(config, tmp_path)


def test_an_idle_connection_stays_open_for_keep_alive_s_then_closes(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = _gateway(fake_upstream, tmp_path, {"keep_alive_s": 2})
    try:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            assert _answered(sock)
            time.sleep(1.0)  # idle, under keep_alive_s: still open
            assert _answered(sock)
            time.sleep(3.0)  # idle past it: the gateway has closed it
            assert sock.recv(65536) == b""
    finally:
        gw.stop()


def test_the_default_outlasts_the_idle_timeouts_of_common_proxies() -> None:
    # nginx-ingress keeps upstream connections 60 s, as does AWS ALB; httpx and the openai
    # client 5 s. Each must close first.
    assert Limits().keep_alive_s > 60


def test_at_the_connection_cap_the_longest_idle_connection_gives_way(
    fake_upstream: str, tmp_path: Path
) -> None:
    """Idle connections, kept 75 s by default, never cost a new client a 503: at
    `limits.max_connections` the one idle longest is closed for it (busy ones are not:
    tests/security/test_abuse.py)."""
    gw = _gateway(fake_upstream, tmp_path, {"max_connections": 3})
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(3)]
    try:
        for sock in held:
            assert _answered(sock)
            time.sleep(0.1)  # idle longest: the first
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as new:
            assert _answered(new)
        assert held[0].recv(65536) == b""
        assert _answered(held[1]) and _answered(held[2])
    finally:
        for sock in held:
            sock.close()
        gw.stop()
