"""An open-loop load generator for bench/capacity.py, in its own process.

Like bench/overload_loadgen.py (Poisson arrivals drawn in advance, refusals not retried,
each request with its stream's `x-request-timeout` and its own client timeout), with what
the capacity benchmark needs besides:

- each stream has its own body and may stream (SSE): a streamed request is timed until its
  body's first bytes (the engine sends its first chunk with the first token, and the
  gateway relays a stream only once the upstream's first bytes are in: time to first
  token on both paths) and until its end, which must be `data: [DONE]`;
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

Each stream's arrivals come from its own generator seeded with (seed, stream index), so
the same seed and rate give the same arrival times whatever the other streams are.

Protocol (one JSON object a line): the parent writes a `PhaseSpec` as JSON to the child's
stdin; the child answers with a `PhaseResult` as JSON on its stdout. EOF on stdin ends the
child. Run `python -m bench.capacity_loadgen` only through `CapacityLoadGenerator`.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.loadgen import PipedChild
from bench.overload_loadgen import _error_code, arrivals


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
        data = orjson.loads(raw)
        data["streams"] = [StreamSpec(**s) for s in data["streams"]]
        data["actions"] = [Action(**a) for a in data["actions"]]
        data["polls"] = [Poll(**p) for p in data["polls"]]
        return PhaseSpec(**data)


# One request: (stream index, send time s from the phase start, first bytes ms, latency ms,
# status, error code, timed out, completion tokens). Status 0: no answer (client timeout,
# cut, or a connection error, whose text is the code). First bytes: of the body (a
# stream's first token); for a whole answer, its latency.
Record = tuple[int, float, float, float, int, str | None, bool, int]


@dataclass
class PhaseResult:
    records: list[Record] = field(default_factory=list)
    lag_p99_ms: float = 0.0  # how late requests left against their planned send time
    lag_max_ms: float = 0.0
    cpu_s: float = 0.0  # the load generator's CPU time during the phase
    wall_s: float = 0.0
    actions: list[tuple[float, int]] = field(default_factory=list)  # (done at s, status)
    polls: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # With `PhaseSpec.headers`: per record (same order), those headers' values.
    headers: list[list[str | None]] = field(default_factory=list)

    @staticmethod
    def from_json(raw: bytes) -> PhaseResult:
        data = orjson.loads(raw)
        data["records"] = [tuple(r) for r in data["records"]]
        data["actions"] = [tuple(a) for a in data["actions"]]
        data["polls"] = {k: [tuple(p) for p in v] for k, v in data["polls"].items()}
        return PhaseResult(**data)


class CapacityLoadGenerator(PipedChild):
    """The parent's handle on the load-generator child process."""

    def __init__(self) -> None:
        super().__init__("bench.capacity_loadgen", stop_timeout_s=15)

    def run(self, spec: PhaseSpec) -> PhaseResult:
        return PhaseResult.from_json(self.ask(spec.to_json()))


# --- the child process -------------------------------------------------------------------

_DONE = b"data: [DONE]"
_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


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
                code = "incomplete_stream"
            else:
                found = _TOKENS.findall(content[-400:])
                tokens = int(found[-1]) if found else 0
        except TimeoutError:
            timed_out, code = True, "client_timeout"
        except asyncio.CancelledError:
            code = "cut"
            raise
        except Exception as exc:
            code = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            latency_ms = (time.perf_counter() - sent) * 1000.0
            if not stream.stream or status != 200:
                first_ms = latency_ms
            record = (index, sent - self.start, first_ms, latency_ms, status, code)
            self.records.append((*record, timed_out, tokens))
            if self.spec.headers:
                self.kept.append(kept)

    async def act(self, action: Action) -> tuple[float, int]:
        await asyncio.sleep(max(0.0, self.start + action.at_s - time.perf_counter()))
        headers = {"Content-Type": "application/json"}
        try:
            async with self.session.post(action.url, data=action.body, headers=headers) as answer:
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
                async with self.session.get(poll.url, headers=poll.headers) as answer:
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


def _plan(spec: PhaseSpec) -> list[tuple[float, int, int]]:
    """(send time, stream index, the stream's arrival number), in time order."""
    plan: list[tuple[float, int, int]] = []
    for index, stream in enumerate(spec.streams):
        rng = random.Random(spec.seed * 1000 + index)
        times = arrivals(stream.rate, spec.duration_s, rng)
        plan.extend((t, index, nth) for nth, t in enumerate(times))
    plan.sort()
    return plan


async def _run_phase(session: Any, spec: PhaseSpec) -> PhaseResult:
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


async def _serve() -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=256 * 2**20)  # a phase may carry every body
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=10),  # actions and polls; requests set their own
        skip_auto_headers=("User-Agent",),
    ) as session:
        while line := await reader.readline():
            result = await _run_phase(session, PhaseSpec.from_json(line))
            sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
            sys.stdout.buffer.flush()


def main() -> None:
    import uvloop

    # Ctrl-C reaches the whole process group: the parent stops this child by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(_serve())


if __name__ == "__main__":
    main()
