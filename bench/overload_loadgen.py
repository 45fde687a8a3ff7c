"""An open-loop HTTP load generator, in its own process, for bench/overload.py.

Open loop: each stream (a tenant's traffic) sends at Poisson arrival times drawn in advance
from its rate, whether or not earlier requests have been answered, so an overloaded server
faces the whole offered load (a closed loop would slow down with it and hide the overload).
Refused requests are not retried and Retry-After is not honoured: arrivals stay independent.

Each request carries its stream's `x-request-timeout` header and has its own client timeout
(aiohttp's total timeout, slightly above the header): a request the server has neither
answered nor refused by then is given up and counted as a client timeout.

Protocol (one JSON object a line): the parent writes a `PhaseSpec` as JSON to the child's
stdin; the child answers with a `PhaseResult` as JSON on its stdout. EOF on stdin ends the
child. Run `python -m bench.overload_loadgen` only through `OpenLoopGenerator`.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.loadgen import PipedChild


@dataclass(frozen=True)
class StreamSpec:
    tenant: str
    key: str
    rate: float  # requests per second, mean of a Poisson process
    header_timeout_s: float | None  # sent as x-request-timeout (None: not sent)
    client_timeout_s: float  # the client gives up after this


@dataclass(frozen=True)
class PhaseSpec:
    url: str
    body: str
    duration_s: float  # arrivals are drawn in [0, duration_s)
    seed: int
    streams: list[StreamSpec]

    def to_json(self) -> bytes:
        return orjson.dumps(
            {**self.__dict__, "streams": [stream.__dict__ for stream in self.streams]}
        )

    @staticmethod
    def from_json(raw: bytes) -> PhaseSpec:
        data = orjson.loads(raw)
        data["streams"] = [StreamSpec(**stream) for stream in data["streams"]]
        return PhaseSpec(**data)


# One request: (stream index, send time s from the phase start, latency ms, status, error
# code, timed out).
# Status 0: no answer (client timeout or a connection error, whose text is the code).
Record = tuple[int, float, float, int, str | None, bool]


@dataclass
class PhaseResult:
    records: list[Record] = field(default_factory=list)
    lag_p99_ms: float = 0.0  # how late requests left against their planned send time
    cpu_s: float = 0.0  # the load generator's CPU time during the phase
    wall_s: float = 0.0  # from the first planned arrival until the last answer

    @staticmethod
    def from_json(raw: bytes) -> PhaseResult:
        data = orjson.loads(raw)
        data["records"] = [tuple(record) for record in data["records"]]
        return PhaseResult(**data)


class OpenLoopGenerator(PipedChild):
    """The parent's handle on the load-generator child process."""

    def __init__(self) -> None:
        super().__init__("bench.overload_loadgen", stop_timeout_s=15)

    def run(self, spec: PhaseSpec) -> PhaseResult:
        return PhaseResult.from_json(self.ask(spec.to_json()))


# --- the child process -------------------------------------------------------------------


def arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    if rate <= 0:
        return times
    t = rng.expovariate(rate)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def _one(
    session: Any,
    spec: PhaseSpec,
    index: int,
    start: float,
    headers: dict[str, str],
    client_timeout: Any,
    body: bytes,
    records: list[Record],
) -> None:
    sent = time.perf_counter()
    status, code, timed_out = 0, None, False
    try:
        async with session.post(
            spec.url, data=body, headers=headers, timeout=client_timeout
        ) as answer:
            content = await answer.read()
            status = answer.status
            if status != 200:
                code = _error_code(content)
    except TimeoutError:
        timed_out, code = True, "client_timeout"
    except Exception as exc:
        code = f"{type(exc).__name__}: {exc}"[:200]
    latency_ms = (time.perf_counter() - sent) * 1000.0
    records.append((index, sent - start, latency_ms, status, code, timed_out))


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


async def _run_phase(session: Any, spec: PhaseSpec) -> PhaseResult:
    import aiohttp

    rng = random.Random(spec.seed)
    body = spec.body.encode()
    plan: list[tuple[float, int]] = []
    for index, stream in enumerate(spec.streams):
        plan.extend((t, index) for t in arrivals(stream.rate, spec.duration_s, rng))
    plan.sort()
    headers: list[dict[str, str]] = []
    for stream in spec.streams:
        headers.append(
            {"Authorization": f"Bearer {stream.key}", "Content-Type": "application/json"}
        )
        if stream.header_timeout_s is not None:
            headers[-1]["x-request-timeout"] = f"{stream.header_timeout_s:g}"

    timeouts = [aiohttp.ClientTimeout(total=stream.client_timeout_s) for stream in spec.streams]
    records: list[Record] = []
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    cpu_before = time.process_time()
    start = time.perf_counter()
    for planned, index in plan:
        delay = start + planned - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append((time.perf_counter() - start - planned) * 1000.0)
        task = asyncio.create_task(
            _one(session, spec, index, start, headers[index], timeouts[index], body, records)
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
    lags.sort()
    return PhaseResult(
        records=records,
        lag_p99_ms=lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
        cpu_s=time.process_time() - cpu_before,
        wall_s=time.perf_counter() - start,
    )


async def _serve() -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=connector, skip_auto_headers=("User-Agent",)
    ) as session:
        while line := await reader.readline():
            result = await _run_phase(session, PhaseSpec.from_json(line))
            sys.stdout.buffer.write(orjson.dumps(result.__dict__) + b"\n")
            sys.stdout.buffer.flush()


def main() -> None:
    import uvloop

    # Ctrl-C reaches the whole process group: the parent stops this child by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(_serve())


if __name__ == "__main__":
    main()
