"""The closed loop of bench/loadgen.py: a round's spec, its result, and the child's side.

A round: `concurrency` workers each send one unmeasured request (to open or check their
connection; up to 3 tries, since a kept-alive connection the server closed fails once),
wait for the others, then POST back to back until `duration_s` has passed. Each worker
cycles through the round's pre-serialised bodies from its own offset, so that a semantic
cache round asks many different paraphrases (one body: every request sends it).

Each request is timed with `perf_counter` from just before it is sent until its whole body
(all of the SSE stream, when streaming) has been read, and until its body's first bytes
arrived (for a stream, its time to first token). An answer fails (`errors`) when its
status is not 200, when a stream does not end with `data: [DONE]`, or when the request
raises. With `expect_tier` set, only answers whose `x-cache-tier` equals it count: their
times are recorded and they are `completed`; any other answer 200 (a miss, another tier)
is counted in `other` by its `x-cache` and its tier or miss reason, its times dropped.
While measuring, every answer's wait on the cache lookup, counted or not, is recorded
from its `Server-Timing: cache;dur=<ms>` header (`cache_waits_ms`; none from a bare
upstream).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

_DONE = b"data: [DONE]"


@dataclass(frozen=True)
class RoundSpec:
    url: str
    headers: dict[str, str]
    bodies: list[str]  # pre-serialised; each worker cycles through them
    concurrency: int
    duration_s: float
    stream: bool = False  # the answers are SSE streams, which must end with [DONE]
    expect_tier: str | None = None  # None: every answer 200 counts (a bare upstream)


@dataclass(frozen=True)
class RoundResult:
    """What one round measured (times in seconds unless the name says otherwise)."""

    completed: int  # counted answers that finished within duration_s
    errors: int  # failed requests (status not 200, bad stream end, exceptions)
    first_error: str | None
    duration_s: float  # the measured window
    latencies_ms: list[float]  # every counted answer, including those past the deadline
    cpu_s: float  # the load generator's own CPU time during the measured window
    first_byte_ms: list[float] = field(default_factory=list)  # the same: until first bytes
    other: dict[str, int] = field(default_factory=dict)  # uncounted answers, by cache header
    cache_waits_ms: list[float] = field(default_factory=list)  # measured window, all answers

    @property
    def rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @staticmethod
    def from_json(raw: bytes) -> RoundResult:
        return RoundResult(**orjson.loads(raw))


# --- the child process -------------------------------------------------------------------


class _Round:
    def __init__(self, session: Any, spec: RoundSpec) -> None:
        self.session = session
        self.spec = spec
        self.bodies = [body.encode() for body in spec.bodies]
        self.latencies: list[float] = []
        self.first_bytes: list[float] = []
        self.completed = 0
        self.errors = 0
        self.first_error: str | None = None
        self.other: dict[str, int] = {}
        self.cache_waits: list[float] = []
        self.deadline = 0.0  # 0 until the measured window starts

    async def _one(self, body: bytes) -> float | None:
        """When a counted answer's first bytes came (perf_counter); None if the request
        failed or its answer does not count."""
        spec = self.spec
        async with self.session.post(spec.url, data=body, headers=spec.headers) as response:
            first = await response.content.readany()
            first_at = time.perf_counter()
            content = first + await response.read()
            if response.status != 200:
                self._error(f"HTTP {response.status}: {content[:200]!r}")
                return None
            if spec.stream and _DONE not in content[-32:]:
                self._error(f"stream did not end with [DONE]: {content[-200:]!r}")
                return None
            headers = response.headers
            self._waited(headers.get("server-timing"))
            if spec.expect_tier is not None and not self._counts(headers):
                return None
        return first_at

    def _counts(self, headers: Any) -> bool:
        """Whether an answer is of the expected tier; counts it in `other` if not."""
        tier = headers.get("x-cache-tier")
        if tier == self.spec.expect_tier:
            return True
        why = tier or headers.get("x-cache-miss-reason") or "-"
        label = f"{headers.get('x-cache', '-')}:{why}"
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
        """One request that does not fail (an uncounted answer will do), in 3 tries."""
        for attempt in range(3):
            errors = self.errors
            try:
                await self._one(self._body(worker, attempt))
            except Exception as exc:
                self._error(f"warm-up: {exc!r}")
                continue
            if self.errors == errors:
                return
        raise RuntimeError(f"warm-up failed: {self.first_error}")

    async def measure(self, worker: int) -> None:
        latencies, first_bytes, one = self.latencies, self.first_bytes, self._one
        deadline, perf_counter, n = self.deadline, time.perf_counter, 1
        while True:
            sent = perf_counter()
            if sent >= deadline:
                return
            body = self._body(worker, n)
            n += 1
            try:
                first_at = await one(body)
            except Exception as exc:
                self._error(repr(exc))
                continue
            done = perf_counter()
            if first_at is not None:
                latencies.append((done - sent) * 1000.0)
                first_bytes.append((first_at - sent) * 1000.0)
                if done <= deadline:
                    self.completed += 1


async def run_round(session: Any, spec: RoundSpec) -> RoundResult:
    state = _Round(session, spec)
    # All warm-ups at once, so that `concurrency` connections are open before the clock starts.
    await asyncio.gather(*(state.warm_up(w) for w in range(spec.concurrency)))
    state.errors, state.first_error, state.other = 0, None, {}  # warm-up is not counted
    cpu_before = time.process_time()
    state.deadline = time.perf_counter() + spec.duration_s
    await asyncio.gather(*(state.measure(w) for w in range(spec.concurrency)))
    return RoundResult(
        completed=state.completed,
        errors=state.errors,
        first_error=state.first_error,
        duration_s=spec.duration_s,
        latencies_ms=state.latencies,
        cpu_s=time.process_time() - cpu_before,
        first_byte_ms=state.first_bytes,
        other=state.other,
        cache_waits_ms=state.cache_waits,
    )
