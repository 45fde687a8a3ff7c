"""Fault-injection harness: send a burst of requests, record one outcome per request,
classify it, and account for every one (tests/chaos and bench/reliability.py share it).

An answer is one of: the model's (200, `x-cache: miss|bypass`), the cache's (200,
`x-cache: hit`), or a documented error (a non-200 status with OpenAI's error JSON, or a
stream that ends with a `data: {"error": ...}` event). Anything else is *lost*: no HTTP
answer at all (reset, timeout), a body that is none of these shapes, or a stream that ends
without `[DONE]` and without an error event.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

# Transport failures a client may retry on another replica: the request never got an answer.
RETRYABLE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass(frozen=True)
class Shot:
    """One request to send: a JSON body (or raw bytes), a route, a key."""

    body: dict[str, Any] | bytes
    key: str
    route: str = "/chat/completions"
    headers: dict[str, str] = field(default_factory=dict)
    trickle_s: float = 0.0  # a slow client: the body dribbles out over this long
    leave_after_events: int | None = None  # a client that hangs up mid-stream

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


@dataclass
class Result:
    """What the client got for one request."""

    request_id: str
    kind: str  # model | cache | error | left (the client hung up on purpose) | lost
    status: int | None  # HTTP status; a stream's error event counts as its error's status
    code: str | None  # the OpenAI error code, or why it is lost
    seconds: float
    attempts: int = 1
    replica: int = 0
    cold_start_ms: float | None = None  # the answer waited for a replica to start
    started: float = 0.0  # time.perf_counter() when it was sent


@dataclass
class Burst:
    """The outcomes of one burst and how they add up."""

    name: str
    results: list[Result]
    expected_statuses: frozenset[int]
    notes: list[str] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def lost(self) -> list[Result]:
        return [r for r in self.results if r.kind == "lost"]

    @property
    def answered(self) -> int:
        return self.sent - len(self.lost)

    @property
    def by_outcome(self) -> Counter[str]:
        return Counter(_label(r) for r in self.results)

    @property
    def unexpected_5xx(self) -> list[Result]:
        return [
            r
            for r in self.results
            if r.status is not None and r.status >= 500 and r.status not in self.expected_statuses
        ]

    @property
    def unexpected(self) -> list[Result]:
        """Answers with a status the case does not expect (any class)."""
        return [
            r
            for r in self.results
            if r.kind != "lost" and r.status is not None and r.status not in self.expected_statuses
        ]

    def p99_ms(self) -> float:
        return percentile([r.seconds for r in self.results], 0.99) * 1000

    def p50_ms(self) -> float:
        return percentile([r.seconds for r in self.results], 0.50) * 1000

    def check(self) -> None:
        """Every request answered, with a status the case documents."""
        assert not self.lost, f"{self.name}: {len(self.lost)} lost: {self.lost[:5]}"
        assert not self.unexpected, f"{self.name}: unexpected answers: {self.unexpected[:5]}"

    def figures(self) -> dict[str, Any]:
        return {
            "bench": "reliability",
            "case": self.name,
            "sent": self.sent,
            "answered": self.answered,
            "lost": len(self.lost),
            "errors_5xx_unexpected": len(self.unexpected_5xx),
            "p99_ms": round(self.p99_ms(), 1),
            "outcomes": dict(sorted(self.by_outcome.items())),
        }


def _label(result: Result) -> str:
    if result.kind in ("model", "cache", "left"):
        return result.kind
    if result.kind == "lost":
        return f"lost:{result.code}"
    return f"{result.status}:{result.code}"


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def chat(prompt: str, model: str = "echo", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}


async def fire(
    name: str,
    base_urls: Sequence[str],
    shots: Iterable[Shot],
    expected_statuses: Iterable[int] = (200,),
    concurrency: int = 16,
    timeout_s: float = 20.0,
    retry_other_replica: bool = False,
    during: Callable[[], Any] | None = None,
    spacing_s: float = 0.0,
) -> Burst:
    """Sends every shot (round-robin over `base_urls`, at most `concurrency` at once) and
    records one Result each. With `retry_other_replica`, a transport failure is retried
    once on the next replica, as a client with several endpoints would. `during`, if
    given, is awaited alongside the burst (to inject the fault while traffic runs).
    `spacing_s` spreads the starts: shot i starts i * spacing_s after the first."""
    prefix = f"chaos-{name}-{uuid.uuid4().hex[:8]}"
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def one(index: int, shot: Shot) -> Result:
            await asyncio.sleep(index * spacing_s)
            async with gate:
                return await _send(
                    client, base_urls, index, shot, f"{prefix}-{index}", retry_other_replica
                )

        jobs = [one(i, s) for i, s in enumerate(shots)]
        if during is None:
            results = await asyncio.gather(*jobs)
        else:
            results, _ = await asyncio.gather(asyncio.gather(*jobs), during())
    return Burst(name, list(results), frozenset(expected_statuses))


async def _send(
    client: httpx.AsyncClient,
    base_urls: Sequence[str],
    index: int,
    shot: Shot,
    request_id: str,
    retry: bool,
) -> Result:
    started = time.perf_counter()
    replica = index % len(base_urls)
    attempts = 0
    cold: list[float] = []
    while True:
        attempts += 1
        try:
            kind, status, code = await _exchange(client, base_urls[replica], shot, request_id, cold)
        except RETRYABLE as exc:
            if retry and attempts == 1 and len(base_urls) > 1:
                replica = (replica + 1) % len(base_urls)
                continue
            kind, status, code = "lost", None, type(exc).__name__
        except httpx.HTTPError as exc:
            kind, status, code = "lost", None, type(exc).__name__
        seconds = time.perf_counter() - started
        cold_ms = cold[0] if cold else None
        return Result(request_id, kind, status, code, seconds, attempts, replica, cold_ms, started)


async def _exchange(
    client: httpx.AsyncClient, base_url: str, shot: Shot, request_id: str, cold: list[float]
) -> tuple[str, int | None, str | None]:
    payload = shot.body if isinstance(shot.body, bytes) else orjson.dumps(shot.body)
    content: bytes | AsyncIterator[bytes] = payload
    if shot.trickle_s > 0:
        content = _trickle(payload, shot.trickle_s)
    headers = {
        "Authorization": f"Bearer {shot.key}",
        "Content-Type": "application/json",
        "x-request-id": request_id,
        **shot.headers,
    }
    request = client.build_request("POST", base_url + shot.route, content=content, headers=headers)
    response = await client.send(request, stream=True)
    if "x-cold-start-ms" in response.headers:
        cold.append(float(response.headers["x-cold-start-ms"]))
    try:
        if response.status_code == 200 and shot.streamed:
            if shot.leave_after_events is not None:
                return await _leave(response, shot.leave_after_events)
            return _classify_stream(response, [line async for line in response.aiter_lines()])
        return classify(response.status_code, response.headers, await response.aread())
    finally:
        await response.aclose()


async def _trickle(payload: bytes, seconds: float, pieces: int = 10) -> AsyncIterator[bytes]:
    step = max(1, -(-len(payload) // pieces))
    for start in range(0, len(payload), step):
        await asyncio.sleep(seconds / pieces)
        yield payload[start : start + step]


async def _leave(response: httpx.Response, events: int) -> tuple[str, int, str]:
    seen = 0
    async for line in response.aiter_lines():
        seen += line.startswith("data:")
        if seen >= events:
            return "left", 200, "client_left"
    return "lost", 200, "stream_shorter_than_expected"


def classify(status: int, headers: httpx.Headers, body: bytes) -> tuple[str, int, str | None]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "lost", status, "body_not_json"
    if status == 200:
        if isinstance(parsed, dict) and ("choices" in parsed or "data" in parsed):
            return _answer_kind(headers), 200, None
        return "lost", status, "not_an_answer"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("type"):
        return "error", status, str(error.get("code") or error["type"])
    return "lost", status, "not_openai_error_json"


def _classify_stream(
    response: httpx.Response, lines: list[str]
) -> tuple[str, int | None, str | None]:
    payloads = [line[5:].strip() for line in lines if line.startswith("data:")]
    if not payloads:
        return "lost", 200, "empty_stream"
    last = payloads[-1]
    try:
        events = [orjson.loads(p) for p in payloads if p != "[DONE]"]
    except orjson.JSONDecodeError:
        return "lost", 200, "event_not_json"
    if last == "[DONE]":
        if any(isinstance(e, dict) and "error" in e for e in events):
            return "lost", 200, "error_then_done"
        return _answer_kind(response.headers), 200, None
    error = events[-1].get("error") if events and isinstance(events[-1], dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = str(error.get("code") or error.get("type"))
        return "error", STREAM_ERROR_STATUS.get(code, 502), code
    return "lost", 200, "stream_cut_without_error"


# A stream's closing error event carries the code; count it as the status it stands for.
STREAM_ERROR_STATUS = {
    "bad_gateway": 502,
    "upstream_timeout": 504,
    # Held for a start (gateway/held.py): its start failed, or the queue dropped it.
    "backend_unavailable": 503,
    "overloaded": 503,
}


def _answer_kind(headers: httpx.Headers) -> str:
    return "cache" if headers.get("x-cache") == "hit" else "model"


def shots_cycle(makers: Sequence[Callable[[int], Shot]], count: int) -> list[Shot]:
    """`count` shots taking turns between `makers` (each given the shot's index)."""
    cycle = itertools.cycle(makers)
    return [next(cycle)(i) for i in range(count)]


def logged_request_ids(log_paths: Iterable[Path]) -> Counter[str]:
    """How many access-log lines each request id has, over all the gateways' logs."""
    seen: Counter[str] = Counter()
    for path in log_paths:
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            if line.startswith(b"{") and b'"request_id"' in line:
                try:
                    seen[str(orjson.loads(line)["request_id"])] += 1
                except (orjson.JSONDecodeError, KeyError):
                    continue
    return seen


def wait_logged_once(
    burst: Burst, log_paths: Sequence[Path], ids: Iterable[str] | None = None, wait_s: float = 5.0
) -> None:
    """Each request (of `ids`, by default all those answered) has exactly one access-log
    line on one replica: the gateway accounted for it once, neither dropped nor doubled."""
    wanted = set(ids) if ids is not None else {r.request_id for r in burst.results}
    deadline = time.monotonic() + wait_s
    while True:
        seen = logged_request_ids(log_paths)
        missing = sorted(i for i in wanted if seen[i] == 0)
        doubled = sorted(i for i in wanted if seen[i] > 1)
        if not missing and not doubled:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{burst.name}: unlogged {missing[:5]}, logged twice {doubled[:5]}"
            )
        time.sleep(0.05)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
