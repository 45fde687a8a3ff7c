"""Requests held while a scale-to-zero backend starts, through a real gateway and a real
model-server process that takes 1.5 s to listen: keep-alives on a held stream (read by the
`openai` SDK), no refusal before a start is measured, `x-request-timeout` and SDK timeouts,
the refusal of a deadline shorter than the learned start time, and a default deadline that
grows to cover the start. The tests run in order: each start adds to the backend's history."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from bench.fake_upstream import on_demand_backend
from bench.processes import OPERATOR, Gateway, start_gateway
from tests.conftest import hash_of

# Its tests build on one another's starts, timed in wall time (a deadline against the learned
# start, that start times a margin): the module runs alone.
pytestmark = pytest.mark.serial

KEY = "sk-test-held-0123456789abcdef"
STARTUP_S = 1.5  # the model server listens only after this
KEEPALIVE_S = 0.3
CLASS_DEADLINE_S = 1.0  # shorter than any start here: only a held deadline covers one


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("held")
    command = ["{python}", "-m", "bench.fake_upstream", "--port", "{port}"]
    scaling = {"idle_s": 0.5, "last_replica_idle_s": 1.0, "stable_window_s": 1.0}
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "cache": {"enabled": False},
        "traffic": {
            "deadline_s": {"interactive": CLASS_DEADLINE_S},
            # A generous margin: starts on a busy two-core machine vary.
            "hold": {"keepalive_s": KEEPALIVE_S, "deadline_margin": 3.0},
        },
        "backends": [
            on_demand_backend(
                ["echo", "busy-429"],
                scaling,
                command=[*command, "--startup-delay-s", str(STARTUP_S)],
            )
        ],
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


class Recording(httpx.BaseTransport):
    """Passes every exchange through, noting when each piece of a body arrived."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.pieces: list[tuple[float, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        stream = _Noted(response.stream, self.pieces)
        return httpx.Response(response.status_code, headers=response.headers, stream=stream)

    def close(self) -> None:
        self.inner.close()


class _Noted(httpx.SyncByteStream):
    def __init__(self, stream: Any, pieces: list[tuple[float, bytes]]) -> None:
        self.stream = stream
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.stream:
            self.pieces.append((time.monotonic(), piece))
            yield piece

    def close(self) -> None:
        self.stream.close()


def sdk(gw: Gateway, recording: Recording, timeout_s: float = 30.0) -> openai.OpenAI:
    http = httpx.Client(transport=recording)
    return openai.OpenAI(
        base_url=gw.base_url, api_key=KEY, max_retries=0, timeout=timeout_s, http_client=http
    )


def stream_text(client: openai.OpenAI, model: str = "echo", **extra: Any) -> str:
    with client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], stream=True, **extra
    ) as chunks:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def post(gw: Gateway, **headers: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = httpx.post(
        gw.base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {KEY}", **headers},
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    return answer, time.monotonic() - started


def capacity(gw: Gateway) -> dict[str, Any]:
    view: dict[str, Any] = httpx.get(gw.url + "/readyz", timeout=5, headers=OPERATOR).json()[
        "capacity"
    ]["on-demand"]
    return view


def at_zero(gw: Gateway, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(gw.url + "/readyz", timeout=5, headers=OPERATOR).json()["replicas"][
        "on-demand"
    ]:
        assert time.monotonic() < deadline, "the idle replica was not stopped"
        time.sleep(0.1)


def keep_alives(pieces: list[tuple[float, bytes]]) -> int:
    return sum(piece.count(b": waiting for model") for _, piece in pieces)


def test_without_a_measured_start_nothing_is_refused_and_timeouts_are_the_clients(
    gateway: Gateway,
) -> None:
    assert capacity(gateway)["start_estimate_s"] is None
    recording = Recording()
    started = time.monotonic()
    with sdk(gateway, recording) as client, pytest.raises(openai.APIError) as caught:
        stream_text(client, extra_headers={"x-request-timeout": "2"})  # dropped at 1 s
    took = time.monotonic() - started
    # Held, not refused: its stream opened, kept alive, and carried the deadline's error.
    assert keep_alives(recording.pieces) >= 1
    assert KEEPALIVE_S < took < 5, took
    assert "deadline" in caught.value.message, caught.value.message
    # The start it set off goes on. Asking for 20 s outlasts the class's 1 s: held through
    # the start and answered.
    answer, _ = post(gateway, **{"x-request-timeout": "20"})
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-cold-start-ms"]) >= STARTUP_S * 1000


def test_a_held_streams_own_upstream_error_is_its_final_event(gateway: Gateway) -> None:
    """A stream held through a whole start (from zero: the first test's start, already
    under way, could end before a keep-alive went out, and CI once saw a plain 429) whose
    upstream then answers its own error (a 429): that closes the stream the keep-alives
    opened, as a final error event."""
    at_zero(gateway)
    error, kept_alive = held_upstream_error(gateway, **{"x-request-timeout": "20"})
    assert kept_alive and not isinstance(error, openai.APIStatusError), error
    assert error.code == "busy", error


def held_upstream_error(gw: Gateway, **headers: str) -> tuple[openai.APIError, int]:
    """A held stream for the model that answers 429: the error, and the keep-alives."""
    recording = Recording()
    with sdk(gw, recording) as client, pytest.raises(openai.APIError) as caught:
        stream_text(client, model="busy-429", extra_headers=headers)
    return caught.value, keep_alives(recording.pieces)


def test_a_held_stream_gets_keep_alives_then_its_stream(gateway: Gateway) -> None:
    at_zero(gateway)
    recording = Recording()
    started = time.monotonic()
    # The SDK's read timeout (x-stainless-read-timeout: 30) bounds the hold of a stream
    # only as a floor: keep-alives reset the client's read timer.
    with sdk(gateway, recording) as client:
        assert stream_text(client) == "echo: hello"
    assert keep_alives(recording.pieces) >= int(STARTUP_S / KEEPALIVE_S) - 1
    times = [started] + [at for at, _ in recording.pieces]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < KEEPALIVE_S + 0.7, gaps  # a keep-alive every 0.3 s, busy machine
    assert b"".join(piece for _, piece in recording.pieces).rstrip().endswith(b"data: [DONE]")


def test_a_deadline_shorter_than_the_learned_start_is_refused_at_once(gateway: Gateway) -> None:
    at_zero(gateway)
    estimate = capacity(gateway)["start_estimate_s"]
    assert estimate is not None and estimate >= STARTUP_S
    refused, took = post(gateway, **{"x-request-timeout": "0.8"})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "cold_start_too_slow"
    assert int(refused.headers["retry-after"]) == math.ceil(estimate)
    assert took < 0.5, took
    # A stream is refused the same way, before its status line: the SDK sees the 503.
    with sdk(gateway, Recording()) as client, pytest.raises(openai.APIStatusError) as caught:
        stream_text(client, extra_headers={"x-request-timeout": "0.8"})
    assert caught.value.status_code == 503 and caught.value.code == "cold_start_too_slow"
    # The refusal started the backend; a request that names no deadline may wait for the
    # start (its estimate times the margin), not only its class's 1 s.
    answer, _ = post(gateway)
    assert answer.status_code == 200, answer.text
    assert "x-cold-start-ms" in answer.headers


def test_the_cold_start_report_shows_the_estimate(gateway: Gateway) -> None:
    printed = gateway.cli("report", "cold-start", "--since", "10m", "--format", "json")
    assert printed.returncode == 0, printed.stderr
    [row] = json.loads(printed.stdout)["models"]
    estimate = capacity(gateway)["start_estimate_s"]
    assert row["start_estimate_s"] == pytest.approx(estimate, abs=0.05)


def test_a_restarted_gateway_remembers_its_start_times(gateway: Gateway, tmp_path: Path) -> None:
    """Read back from the stored timelines (the same state folder)."""
    estimate = capacity(gateway)["start_estimate_s"]
    again = start_gateway(yaml.safe_load(gateway.config_path.read_text()), tmp_path)
    try:
        assert capacity(again)["start_estimate_s"] == pytest.approx(estimate, abs=0.05)
    finally:
        again.stop()
