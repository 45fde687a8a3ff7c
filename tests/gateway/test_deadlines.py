"""Time limits a client's request lives under, through a real gateway process: its deadline
bounds the upstream attempt (not only the queue), and its body must arrive in time."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import orjson
import pytest
import yaml
from aiohttp import web
from anyio.abc import TaskGroup

from backends.http import HttpTimeouts, HttpUpstream
from backends.providers.replicas import Replica
from bench.fake_upstream import MODELS
from bench.processes import Gateway, start_gateway
from gateway.errors import DeadlineExceeded
from gateway.metrics import Metrics
from gateway.traffic.capacity import fixed_capacity
from gateway.traffic.deadline import Deadline
from gateway.traffic.forward import forward
from gateway.traffic.pool import Admitted, Pool
from gateway.traffic.replica_set import ReplicaSet
from gateway.traffic.retry import RetryBudget
from gateway.traffic.scheduler import FairScheduler
from gateway.usage import TokenUsage
from tests.conftest import GatewayFactory, fake_backend, hash_of
from tests.support.aiohttp_server import served

KEY = "sk-test-deadline-0123456789abcdef"
BODY_TIMEOUT_S = 1.0
READ_S = 2.5
OTHERS = [model for model in MODELS if model != "hang-midstream"]


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("deadlines")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "limits": {"body_timeout_s": BODY_TIMEOUT_S},
        # read_s (first byte, then between chunks) is beyond every client deadline here.
        # Each test of a deadline has a backend (and a queue) of its own.
        "backends": [
            fake_backend(fake_upstream, models=OTHERS, timeouts={"read_s": READ_S}),
            *(
                fake_backend(fake_upstream, name=name, models=[name], timeouts={"read_s": READ_S})
                for name in ("slow-whole", "slow-streamed")
            ),
            fake_backend(
                fake_upstream,
                name="streams",
                models=["hang-midstream"],
                timeouts={"read_s": READ_S},
            ),
        ],
        "cache": {"enabled": False},
        "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


def post(gateway: Gateway, body: dict[str, Any], timeout_s: str) -> tuple[httpx.Response, float]:
    headers = {"authorization": f"Bearer {KEY}", "x-request-timeout": timeout_s}
    started = time.monotonic()
    response = httpx.post(
        gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30
    )
    return response, time.monotonic() - started


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize("model", ["slow-whole", "slow-streamed"])
def test_slow_upstream_gets_504_just_before_the_clients_deadline(
    gateway: Gateway, fake_upstream: str, model: str
) -> None:
    upstream_port = int(fake_upstream.split(":")[2].split("/")[0])
    assert gateway.server.process is not None
    before = upstream_connections(gateway.server.process.pid, upstream_port)
    response, seconds = post(gateway, chat(model, x_delay=4, stream=model == "slow-streamed"), "2")
    assert response.status_code == 504, response.text
    assert response.json()["error"] == {
        "message": f"The request's deadline passed before the upstream '{model}' answered.",
        "type": "timeout_error",
        "param": None,
        "code": "deadline_exceeded",
    }
    # Not the read timeout (2.5 s), and before the client would have given up on its own.
    assert 1.5 <= seconds < 2.0, seconds
    # The upstream request was cancelled: its connection is closed, not left to the upstream.
    # Usually at once; on a loaded machine a connection can still be settling (or idle in
    # the pool, which closes it after aiohttp's 15 s keep-alive): what must never happen is
    # a connection held open for good. The other connections to this upstream are the health
    # probes' (one kept alive per backend, every 2 s); `before` can catch a moment when some
    # of them are being replaced (seen under load: 2 of the 4), so it counts them all.
    probes = len(yaml.safe_load(gateway.config_path.read_text())["backends"])
    wait_until(
        lambda: (
            upstream_connections(gateway.server.process.pid, upstream_port) <= max(before, probes)
        ),
        timeout_s=20,
    )


def stream_events(gateway: Gateway, headers: dict[str, str]) -> tuple[list[str], float]:
    """A streamed request to `hang-midstream` (two events at once, then the upstream
    hangs): its `data:` lines, and how long the stream lasted."""
    body = chat("hang-midstream", stream=True)
    started = time.monotonic()
    with httpx.stream(
        "POST",
        gateway.base_url + "/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY}", **headers},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    return events, time.monotonic() - started


def test_a_started_stream_is_cut_at_the_clients_whole_request_deadline(
    gateway: Gateway, fake_upstream: str
) -> None:
    """`x-request-timeout` is the whole answer's deadline: a stream still flowing then ends
    with `deadline_exceeded` at the deadline itself (not before: its tokens are the
    client's), and the upstream request is given up."""
    stats_url = fake_upstream.removesuffix("/v1") + "/_stats"
    abandoned = httpx.get(stats_url).json()["abandoned_streams"]
    events, seconds = stream_events(gateway, {"x-request-timeout": "1.5"})
    assert len(events) == 3, events
    error = orjson.loads(events[-1][6:])["error"]
    assert error["code"] == "deadline_exceeded", error
    assert "x-request-timeout" in error["message"]
    assert 1.5 <= seconds < READ_S, seconds
    wait_until(lambda: httpx.get(stats_url).json()["abandoned_streams"] > abandoned, 10)


def test_a_started_stream_is_not_cut_by_a_read_timeout(gateway: Gateway) -> None:
    """The SDKs' timeouts are per read: a stream that has begun is not cut at theirs
    (1.5 s) but at the backend's read timeout (2.5 s), the longest silence it bears."""
    events, seconds = stream_events(gateway, {"x-stainless-read-timeout": "1.5"})
    assert len(events) == 3, events
    assert orjson.loads(events[-1][6:])["error"]["code"] == "upstream_timeout"
    assert seconds >= READ_S, seconds


def test_answers_within_the_deadline_are_untouched(gateway: Gateway) -> None:
    response, _ = post(gateway, chat("slow", x_delay=0.2), "2")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: hi"


def test_a_body_dribbled_past_the_limit_gets_408_and_the_connection_closes(
    gateway: Gateway,
) -> None:
    body = orjson.dumps(chat("echo"))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(head + body[:5])
        sock.settimeout(0.2)
        received = b""
        for byte in body[5:]:
            try:
                received += sock.recv(65536)
            except TimeoutError:
                sock.sendall(bytes([byte]))  # one byte every 0.2 s: never done in time
                continue
            except ConnectionResetError:
                pass  # the gateway answered and hung up (see read_until_closed)
            break
        sock.settimeout(10)
        received += read_until_closed(sock)
        seconds = time.monotonic() - started
    head_part, _, payload = received.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 408 "), received
    assert orjson.loads(payload)["error"] == {
        "message": f"The request body did not arrive within {BODY_TIMEOUT_S:g} s.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_timeout",
    }
    # uvloop times its timers from the loop's clock, read once per turn and rounded to the
    # millisecond: the 408 can come a little before a full second of this clock (0.99998
    # s in one CI run), never a tenth of it early.
    assert BODY_TIMEOUT_S - 0.05 <= seconds < BODY_TIMEOUT_S + 3, seconds


def read_until_closed(sock: socket.socket) -> bytes:
    """What arrives until the peer hangs up, by FIN or by RST.

    A byte the test sent just after the gateway answered and closed makes the
    gateway's kernel reset the connection (nothing reads it any more), so the
    hang-up may come as ECONNRESET after the answer rather than as EOF."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_a_body_sent_in_time_is_served(gateway: Gateway) -> None:
    response, _ = post(gateway, chat("echo"), "5")
    assert response.status_code == 200, response.text


def upstream_connections(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` to loopback `port` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


def wait_until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time limit"
        time.sleep(0.05)


async def test_a_streams_first_byte_counts_toward_the_deadline() -> None:
    """An upstream that sends a stream's headers at once but its first event late: the
    deadline still applies until that event; one in time is relayed whole, first bytes
    included. (The fake upstream sends headers and first event together: an aiohttp server
    here.)"""
    async with stream_server() as base_url, anyio.create_task_group() as tasks:
        pool = one_replica_pool(base_url, tasks)
        lease = await pool.acquire(ADMITTED, Deadline.after(0.5))
        with pytest.raises(DeadlineExceeded):
            await forward(lease, "/late", b"{}", "req-1", streamed=True)
        assert time.monotonic() - lease.deadline.at < 0.3
        lease.release(TokenUsage(0, 0))
        assert [h.in_flight for h in pool.replicas.handles.values()] == [0]
        lease = await pool.acquire(ADMITTED, Deadline.after(0.5))
        upstream = await forward(lease, "/prompt", b"{}", "req-2", streamed=True)
        assert [h.in_flight for h in pool.replicas.handles.values()] == [1]
        assert b"".join([chunk async for chunk in upstream.chunks()]) == EVENT * 2
        lease.release(TokenUsage(1, 2))
        assert [(h.in_flight, h.served) for h in pool.replicas.handles.values()] == [(0, 2)]
        await pool.replicas.close()


EVENT = b'data: {"n": 1}\n\n'


@contextlib.asynccontextmanager
async def stream_server() -> AsyncIterator[str]:
    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)  # the headers go out now
        if request.path.endswith("/late"):
            await asyncio.sleep(5)
        await response.write(EVENT)
        await response.write(EVENT)
        return response

    app = web.Application()
    app.router.add_post("/v1/{name}", answer)
    async with served(app, "/v1") as base_url:
        yield base_url


ADMITTED = Admitted("t", 1.0, "interactive", 1, 1)


def one_replica_pool(base_url: str, tasks: TaskGroup) -> Pool:
    def upstream(url: str) -> HttpUpstream:
        return HttpUpstream(url, None, HttpTimeouts(1.0, 30.0, None), 4)

    replicas = ReplicaSet(upstream, lambda counts: None, tasks, lambda: fixed_capacity(4))
    scheduler = FairScheduler(0, 4, initial_service_s=0.01)  # dispatch until just before
    pool = Pool("late", replicas, scheduler, RetryBudget(), Metrics())
    pool.adopt([Replica("r1", base_url)])
    return pool


def test_the_openai_sdks_timeout_is_the_requests_deadline(
    gateway_factory: GatewayFactory, fake_upstream: str
) -> None:
    """openai-python sends its timeout as `x-stainless-read-timeout`. Shorter than the
    class's default, the gateway answers 504 before the SDK gives up; longer, it is
    honoured (the default here is 2 s, as 60 s is in production)."""
    gw = gateway_factory(
        {
            "state": {"url": "memory"},
            "backends": [fake_backend(fake_upstream)],
            "cache": {"enabled": False},
            "traffic": {"deadline_s": {"interactive": 2.0, "batch": 2.0}},
            "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
        }
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        client.with_options(timeout=1.5).chat.completions.create(
            model="slow", messages=messages, extra_body={"x_delay": 5}
        )
    assert caught.value.status_code == 504
    assert caught.value.code == "deadline_exceeded"
    assert time.monotonic() - started < 1.5
    answer = client.with_options(timeout=120).chat.completions.create(
        model="slow", messages=messages, extra_body={"x_delay": 3}
    )
    assert answer.choices[0].message.content == "echo: hi"


def test_a_request_cut_at_its_deadline_does_not_make_the_idle_backend_refuse(
    gateway_factory: GatewayFactory, fake_upstream: str
) -> None:
    """A request cut at its 2 s deadline once counted as a 1.8 s answer in the backend's
    mean service time; the next request with a shorter deadline was then refused at once
    (503 deadline_unreachable) on an idle backend."""
    gw = gateway_factory(
        {
            "state": {"url": "memory"},
            "backends": [fake_backend(fake_upstream)],
            "cache": {"enabled": False},
            "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
        }
    )
    cut, _ = post(gw, {"model": "slow", "x_delay": 5, "messages": [HI]}, "2")
    assert cut.status_code == 504
    answer, _ = post(gw, {"model": "echo", "messages": [HI]}, "1.5")
    assert answer.status_code == 200, answer.text


HI = {"role": "user", "content": "hi"}
