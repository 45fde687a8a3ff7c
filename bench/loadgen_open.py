"""The open loop of bench/loadgen.py: a phase's spec, its result, and the child's side.

Open loop: each stream (a tenant's traffic) sends at Poisson arrival times drawn in advance
from its rate, whether or not earlier requests have been answered, so an overloaded server
faces the whole offered load (a closed loop would slow down with it and hide the overload).
Refused requests are not retried and Retry-After is not honoured: arrivals stay independent.
Each stream's arrivals come from its own generator seeded with (seed, stream index), so the
same seed and rate give the same arrival times whatever the other streams are.

Each request carries its stream's `x-request-timeout` header and has its own client timeout
(aiohttp's total timeout, slightly above the header): a request the server has neither
answered nor refused by then is given up and counted as a client timeout. Besides:

- each stream has its own body (or bodies, by arrival) and may stream (SSE): a streamed
  request is timed until its body's first bytes (the engine sends its first chunk with the
  first token, and the gateway relays a stream only once the upstream's first bytes are
  in: time to first token on both paths) and until its end, which must be `data: [DONE]`;
- the completion tokens of every answer 200 (from its `usage`);
- timed actions: POSTs made at given times in the phase (the engine's `/_control`), on
  the same clock as the requests;
- polls: GETs every `every_s` in [from_s, to_s) (the gateway's `/readyz`, the engine's
  `/metrics`), returned as text with their times;
- a cut-off: requests still open `cutoff_s` after the phase began are cancelled (closing
  their connections, so the engine aborts them) and recorded with code `cut`;
- optionally, response headers by name (`PhaseSpec.headers`: the gateway's
  `x-model-fallback`, `x-degraded`), their values kept per request in `PhaseResult.headers`,
  in the records' order (None: absent, or no answer).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

_DONE = b"data: [DONE]"
_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_SIDE_TIMEOUT_S = 10.0  # actions and polls; requests have their stream's own


@dataclass(frozen=True)
class StreamSpec:
    tenant: str
    key: str | None  # bearer key (None: no Authorization header, the bare engine)
    rate: float  # requests per second, mean of a Poisson process
    body: str
    stream: bool
    header_timeout_s: float | None  # sent as x-request-timeout (None: not sent)
    client_timeout_s: float  # the client gives up after this
    # Bodies by arrival: the stream's n-th request sends variants[n % len] (empty: `body`).
    variants: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Action:
    at_s: float
    url: str
    body: str  # JSON, POSTed


@dataclass(frozen=True)
class Poll:
    name: str
    url: str
    every_s: float
    from_s: float
    to_s: float
    headers: dict[str, str] = field(default_factory=dict)  # the gateway's pages: OPERATOR


@dataclass(frozen=True)
class PhaseSpec:
    url: str
    duration_s: float  # arrivals are drawn in [0, duration_s)
    cutoff_s: float  # requests still open then are cancelled (code "cut")
    seed: int
    streams: list[StreamSpec]
    actions: list[Action] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)  # response headers kept per request
    # Several gateway replicas: a stream's n-th request goes to urls[n % len] (empty: `url`),
    # so that each replica sees every tenant's share.
    urls: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @staticmethod
    def from_json(raw: bytes) -> PhaseSpec:
        return PhaseSpec.from_dict(orjson.loads(raw))

    @staticmethod
    def from_dict(data: dict[str, Any]) -> PhaseSpec:
        data = dict(data)
        data["streams"] = [StreamSpec(**s) for s in data["streams"]]
        data["actions"] = [Action(**a) for a in data["actions"]]
        data["polls"] = [Poll(**p) for p in data["polls"]]
        return PhaseSpec(**data)


class Record(NamedTuple):
    """One request. Status 0: no answer (client timeout, cut, or a connection error, whose
    text is the code). First bytes: of the body (a stream's first token); for a whole
    answer, its latency."""

    stream: int  # the stream's index in PhaseSpec.streams
    sent_s: float  # from the phase's start
    first_ms: float
    latency_ms: float
    status: int
    code: str | None  # the error code of an answer not 200, or why there was none
    timed_out: bool  # given up by the client
    tokens: int  # completion tokens of an answer 200


@dataclass
class PhaseResult:
    records: list[Record] = field(default_factory=list)
    lag_p99_ms: float = 0.0  # how late requests left against their planned send time
    lag_max_ms: float = 0.0
    cpu_s: float = 0.0  # the load generator's CPU time during the phase
    wall_s: float = 0.0  # from the first planned arrival until the last answer
    actions: list[tuple[float, int]] = field(default_factory=list)  # (done at s, status)
    polls: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # With `PhaseSpec.headers`: per record (same order), those headers' values.
    headers: list[list[str | None]] = field(default_factory=list)

    def to_json(self) -> bytes:
        # orjson writes no tuple subclass: the records go as plain lists.
        return orjson.dumps(self, default=_plain)

    @staticmethod
    def from_json(raw: bytes) -> PhaseResult:
        data = orjson.loads(raw)
        data["records"] = [Record(*r) for r in data["records"]]
        data["actions"] = [tuple(a) for a in data["actions"]]
        data["polls"] = {k: [tuple(p) for p in v] for k, v in data["polls"].items()}
        return PhaseResult(**data)


def _plain(value: object) -> tuple[Any, ...]:
    if isinstance(value, tuple):
        return tuple(value)
    raise TypeError(f"not serialisable: {type(value).__name__}")


def arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    if rate <= 0:
        return times
    t = rng.expovariate(rate)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _plan(spec: PhaseSpec) -> list[tuple[float, int, int]]:
    """(send time, stream index, the stream's arrival number), in time order."""
    plan: list[tuple[float, int, int]] = []
    for index, stream in enumerate(spec.streams):
        rng = random.Random(spec.seed * 1000 + index)
        times = arrivals(stream.rate, spec.duration_s, rng)
        plan.extend((t, index, nth) for nth, t in enumerate(times))
    plan.sort()
    return plan


def _error_code(content: bytes) -> str | None:
    """The OpenAI error's code; for the gateway's `overloaded`, with the reason its
    message names in parentheses (`overloaded:deadline_unreachable`)."""
    try:
        error = orjson.loads(content).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") or error.get("type")
    message = str(error.get("message") or "")
    if code == "overloaded" and "(" in message:
        code += ":" + message.split("(", 1)[1].split(")", 1)[0]
    return str(code) if code is not None else None


def _last_event_code(content: bytes) -> str | None:
    """The error code of a stream's last event, when it is an error (the gateway ends a
    stream it cuts with one: `deadline_exceeded`, `upstream_timeout`, ...)."""
    start = content.rfind(b"data: ", max(0, len(content) - 2048))
    return None if start < 0 else _error_code(content[start + 6 :].strip())


# --- the child process -------------------------------------------------------------------


class _Phase:
    def __init__(self, session: Any, spec: PhaseSpec) -> None:
        import aiohttp

        self.session = session
        self.spec = spec
        self.records: list[Record] = []
        self.kept: list[list[str | None]] = []  # spec.headers' values, per record
        self.bodies = [[v.encode() for v in s.variants] or [s.body.encode()] for s in spec.streams]
        self.urls = spec.urls or [spec.url]
        self.headers = [_headers(s) for s in spec.streams]
        self.timeouts = [aiohttp.ClientTimeout(total=s.client_timeout_s) for s in spec.streams]
        self.side_timeout = aiohttp.ClientTimeout(total=_SIDE_TIMEOUT_S)
        self.start = 0.0

    async def one(self, index: int, nth: int) -> None:
        stream = self.spec.streams[index]
        bodies = self.bodies[index]
        sent = time.perf_counter()
        first_ms, status, code, timed_out, tokens = float("nan"), 0, None, False, 0
        kept: list[str | None] = [None] * len(self.spec.headers)
        try:
            async with self.session.post(
                self.urls[nth % len(self.urls)],
                data=bodies[nth % len(bodies)],
                headers=self.headers[index],
                timeout=self.timeouts[index],
            ) as answer:
                kept = [answer.headers.get(name) for name in self.spec.headers]
                first = await answer.content.readany()
                first_ms = (time.perf_counter() - sent) * 1000.0
                content = first + await answer.read()
                status = answer.status
            if status != 200:
                code = _error_code(content)
            elif stream.stream and _DONE not in content[-64:]:
                code = "stream:" + (_last_event_code(content) or "incomplete")
            else:
                found = _TOKENS.findall(content[-400:])
                tokens = int(found[-1]) if found else 0
        except TimeoutError:
            # A stream already flowing when the client's total timeout ran out: its first
            # token met the deadline (the gateway's promise), its end did not.
            flowing = stream.stream and not math.isnan(first_ms)
            timed_out, code = True, "client_timeout_streaming" if flowing else "client_timeout"
        except asyncio.CancelledError:
            code = "cut"
            raise
        except Exception as exc:
            code = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            latency_ms = (time.perf_counter() - sent) * 1000.0
            if not stream.stream or status != 200:
                first_ms = latency_ms
            at = sent - self.start
            record = Record(index, at, first_ms, latency_ms, status, code, timed_out, tokens)
            self.records.append(record)
            if self.spec.headers:
                self.kept.append(kept)

    async def act(self, action: Action) -> tuple[float, int]:
        await asyncio.sleep(max(0.0, self.start + action.at_s - time.perf_counter()))
        headers = {"Content-Type": "application/json"}
        try:
            async with self.session.post(
                action.url, data=action.body, headers=headers, timeout=self.side_timeout
            ) as answer:
                await answer.read()
                status = answer.status
        except Exception:
            status = 0
        return time.perf_counter() - self.start, status

    async def poll(self, poll: Poll) -> list[tuple[float, str]]:
        samples: list[tuple[float, str]] = []
        at = poll.from_s
        while at < poll.to_s:
            await asyncio.sleep(max(0.0, self.start + at - time.perf_counter()))
            taken = time.perf_counter() - self.start
            try:
                async with self.session.get(
                    poll.url, headers=poll.headers, timeout=self.side_timeout
                ) as answer:
                    samples.append((taken, (await answer.read()).decode(errors="replace")))
            except Exception as exc:
                samples.append((taken, f"error: {exc!r}"))
            at += poll.every_s
        return samples


def _headers(stream: StreamSpec) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if stream.key is not None:
        headers["Authorization"] = f"Bearer {stream.key}"
    if stream.header_timeout_s is not None:
        headers["x-request-timeout"] = f"{stream.header_timeout_s:g}"
    return headers


async def run_phase(session: Any, spec: PhaseSpec) -> PhaseResult:
    phase = _Phase(session, spec)
    plan = _plan(spec)
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    cpu_before = time.process_time()
    phase.start = start = time.perf_counter()
    side = [asyncio.ensure_future(phase.act(a)) for a in spec.actions]
    polls = [asyncio.ensure_future(phase.poll(p)) for p in spec.polls]
    for planned, index, nth in plan:
        delay = start + planned - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append((time.perf_counter() - start - planned) * 1000.0)
        task = asyncio.create_task(phase.one(index, nth))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    left_s = start + spec.cutoff_s - time.perf_counter()
    if tasks:
        _, pending = await asyncio.wait(list(tasks), timeout=max(0.0, left_s))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    done_actions = await asyncio.gather(*side)
    polled = await asyncio.gather(*polls)
    lags.sort()
    return PhaseResult(
        records=phase.records,
        lag_p99_ms=lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
        lag_max_ms=lags[-1] if lags else 0.0,
        cpu_s=time.process_time() - cpu_before,
        wall_s=time.perf_counter() - start,
        actions=list(done_actions),
        polls={p.name: samples for p, samples in zip(spec.polls, polled, strict=True)},
        headers=phase.kept,
    )
