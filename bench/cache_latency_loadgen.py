"""The load generator of bench/cache_latency.py, in its own process.

Like bench/loadgen.py (one aiohttp session with keep-alive connections for the child's
whole life, closed-loop workers, rounds sent over a pipe as JSON lines), with two
differences a cache needs:

- a round cycles through a list of pre-serialised bodies (each worker starts at its own
  offset), so that a semantic round asks many different paraphrases;
- with `expect_tier` set, only answers whose `x-cache-tier` header equals it count: their
  latency is recorded and they are `completed`; any other answer (a miss, another tier)
  is counted in `other` by its `x-cache` and its tier or miss reason, and its latency is
  dropped;
- every answer's wait on the cache lookup, counted or not, is recorded from its
  `Server-Timing: cache;dur=<ms>` header (`cache_waits_ms`; none from the fake upstream).

Each request is timed with `perf_counter` from just before it is sent until its whole
body has been read. Run `python -m bench.cache_latency_loadgen` only through
`CacheLoadGenerator`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.loadgen import PipedChild


@dataclass(frozen=True)
class CacheRoundSpec:
    url: str
    headers: dict[str, str]
    bodies: list[str]
    concurrency: int
    duration_s: float
    expect_tier: str | None  # None: every 200 answer counts (the direct target)


@dataclass(frozen=True)
class CacheRoundResult:
    completed: int  # counted answers that finished within duration_s
    errors: int  # status not 200, exceptions
    first_error: str | None
    duration_s: float
    latencies_ms: list[float]  # every counted answer, including those past the deadline
    cpu_s: float  # the load generator's CPU time in the measured window
    other: dict[str, int] = field(default_factory=dict)  # uncounted answers, by cache header
    cache_waits_ms: list[float] = field(default_factory=list)  # measured window, all answers

    @property
    def rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0


class CacheLoadGenerator(PipedChild):
    """The parent's handle on the child process."""

    def __init__(self) -> None:
        super().__init__("bench.cache_latency_loadgen")

    def run(self, spec: CacheRoundSpec) -> CacheRoundResult:
        return CacheRoundResult(**orjson.loads(self.ask(orjson.dumps(spec.__dict__))))


# --- the child process -------------------------------------------------------------------


class _Round:
    def __init__(self, session: Any, spec: CacheRoundSpec) -> None:
        self.session = session
        self.spec = spec
        self.bodies = [body.encode() for body in spec.bodies]
        self.latencies: list[float] = []
        self.completed = 0
        self.errors = 0
        self.first_error: str | None = None
        self.other: dict[str, int] = {}
        self.cache_waits: list[float] = []
        self.deadline = 0.0

    async def _one(self, body: bytes) -> bool:
        """Sends one request; True if it counts (right tier, or any 200 without a tier)."""
        async with self.session.post(self.spec.url, data=body, headers=self.spec.headers) as r:
            content = await r.read()
            if r.status != 200:
                self._error(f"HTTP {r.status}: {content[:200]!r}")
                return False
            self._waited(r.headers.get("server-timing"))
            expect = self.spec.expect_tier
            if expect is None:
                return True
            tier = r.headers.get("x-cache-tier")
            if tier == expect:
                return True
            why = tier or r.headers.get("x-cache-miss-reason") or "-"
            label = f"{r.headers.get('x-cache', '-')}:{why}"
            self.other[label] = self.other.get(label, 0) + 1
            return False

    def _waited(self, timing: str | None) -> None:
        """Records `cache;dur=<ms>` from a Server-Timing header (while measuring)."""
        if timing is None or not self.deadline:
            return
        for metric in timing.split(","):
            name, _, params = metric.strip().partition(";")
            if name == "cache" and params.startswith("dur="):
                self.cache_waits.append(float(params[4:]))

    def _error(self, message: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = message

    def _body(self, worker: int, n: int) -> bytes:
        offset = worker * len(self.bodies) // max(1, self.spec.concurrency)
        return self.bodies[(offset + n) % len(self.bodies)]

    async def warm_up(self, worker: int) -> None:
        for attempt in range(3):  # a kept-alive connection the server closed fails once
            try:
                await self._one(self._body(worker, attempt))
                return
            except Exception as exc:
                self._error(f"warm-up: {exc!r}")
        raise RuntimeError(f"warm-up failed: {self.first_error}")

    async def measure(self, worker: int) -> None:
        perf_counter, n = time.perf_counter, 1
        while True:
            sent = perf_counter()
            if sent >= self.deadline:
                return
            try:
                counted = await self._one(self._body(worker, n))
            except Exception as exc:
                self._error(repr(exc))
                continue
            finally:
                n += 1
            done = perf_counter()
            if counted:
                self.latencies.append((done - sent) * 1000.0)
                if done <= self.deadline:
                    self.completed += 1


async def _run_round(session: Any, spec: CacheRoundSpec) -> CacheRoundResult:
    state = _Round(session, spec)
    await asyncio.gather(*(state.warm_up(w) for w in range(spec.concurrency)))
    state.errors, state.first_error, state.other, state.cache_waits = 0, None, {}, []
    cpu_before = time.process_time()
    state.deadline = time.perf_counter() + spec.duration_s
    await asyncio.gather(*(state.measure(w) for w in range(spec.concurrency)))
    return CacheRoundResult(
        completed=state.completed,
        errors=state.errors,
        first_error=state.first_error,
        duration_s=spec.duration_s,
        latencies_ms=state.latencies,
        cpu_s=time.process_time() - cpu_before,
        other=state.other,
        cache_waits_ms=state.cache_waits,
    )


async def _serve() -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=120),
        skip_auto_headers=("User-Agent",),
    ) as session:
        while line := await reader.readline():
            spec = CacheRoundSpec(**orjson.loads(line))
            result = await _run_round(session, spec)
            sys.stdout.buffer.write(orjson.dumps(result.__dict__) + b"\n")
            sys.stdout.buffer.flush()


def main() -> None:
    import uvloop

    # Ctrl-C reaches the whole process group: the parent stops this child by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(_serve())


if __name__ == "__main__":
    main()
