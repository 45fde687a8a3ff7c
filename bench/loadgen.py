"""A closed-loop HTTP load generator that runs in its own process.

The benchmark starts it once (`LoadGenerator`) and sends it rounds over a pipe; the child
keeps one aiohttp `ClientSession` (keep-alive connections) for its whole life, so
connections to each target are reused from round to round.

A round: `concurrency` workers each send one unmeasured request (to open or check their
connection), wait for the others, then POST the same pre-serialised body back to back
until `duration_s` has passed. Each request is timed with `perf_counter` from just before
it is sent until the whole body (all of the SSE stream, when streaming) has been read, and
until its body's first bytes arrived (for a stream, its time to first token).

Protocol (one JSON object a line): the parent writes
`{"url", "headers", "body", "concurrency", "duration_s", "stream"}` to the child's stdin,
the child answers with a `RoundResult` as JSON on its stdout. EOF on stdin ends the child.

Run `python -m bench.loadgen` only through `LoadGenerator`.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import orjson

ROOT = Path(__file__).resolve().parents[1]

_DONE = b"data: [DONE]"


@dataclass(frozen=True)
class RoundSpec:
    url: str
    headers: dict[str, str]
    body: str
    concurrency: int
    duration_s: float
    stream: bool


@dataclass(frozen=True)
class RoundResult:
    """What one round measured (times in seconds unless the name says otherwise)."""

    completed: int  # requests that finished successfully within duration_s
    errors: int  # failed requests (status not 200, bad stream end, exceptions)
    first_error: str | None
    duration_s: float  # the measured window
    latencies_ms: list[float]  # every successful measured request, including the last ones
    cpu_s: float  # the load generator's own CPU time during the measured window
    first_byte_ms: list[float]  # the same requests: until the body's first bytes

    @property
    def rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0


class PipedChild:
    """`python -m MODULE` as a child process that answers each JSON line on its stdin with
    one JSON line on its stdout; EOF on stdin ends it. The load generators' parent side."""

    def __init__(self, module: str, stop_timeout_s: float = 10.0) -> None:
        self._module = module
        self._stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self._process = subprocess.Popen(
            [sys.executable, "-m", self._module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        return self

    def ask(self, request: bytes) -> bytes:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise RuntimeError("load generator not started")
        process.stdin.write(request + b"\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited ({process.wait()})")
        return line

    def stop(self) -> None:
        process = self._process
        if process is None:
            return
        self._process = None
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=self._stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoadGenerator(PipedChild):
    """The parent's handle on a load-generator child process."""

    def __init__(self) -> None:
        super().__init__("bench.loadgen")

    def run(self, spec: RoundSpec) -> RoundResult:
        return RoundResult(**orjson.loads(self.ask(orjson.dumps(spec.__dict__))))


# --- the child process -------------------------------------------------------------------


class _Round:
    def __init__(self, session: Any, spec: RoundSpec) -> None:
        self.session = session
        self.spec = spec
        self.body = spec.body.encode()
        self.latencies: list[float] = []
        self.first_bytes: list[float] = []
        self.completed = 0
        self.errors = 0
        self.first_error: str | None = None
        self.start = 0.0
        self.deadline = 0.0

    async def _one(self) -> float | None:
        """When the body's first bytes came (perf_counter); None if the request failed."""
        async with self.session.post(
            self.spec.url, data=self.body, headers=self.spec.headers
        ) as response:
            first = await response.content.readany()
            first_at = time.perf_counter()
            content = first + await response.read()
            if response.status != 200:
                self._error(f"HTTP {response.status}: {content[:200]!r}")
                return None
            if self.spec.stream and _DONE not in content[-32:]:
                self._error(f"stream did not end with [DONE]: {content[-200:]!r}")
                return None
        return first_at

    def _error(self, message: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = message

    async def warm_up(self) -> None:
        for _ in range(3):  # a kept-alive connection the server closed fails once
            try:
                if await self._one() is not None:
                    return
            except Exception as exc:
                self._error(f"warm-up: {exc!r}")
        raise RuntimeError(f"warm-up failed: {self.first_error}")

    async def measure(self) -> None:
        latencies, deadline, one = self.latencies, self.deadline, self._one
        first_bytes = self.first_bytes
        perf_counter = time.perf_counter
        while True:
            sent = perf_counter()
            if sent >= deadline:
                return
            try:
                first_at = await one()
            except Exception as exc:
                self._error(repr(exc))
                continue
            done = perf_counter()
            if first_at is not None:
                latencies.append((done - sent) * 1000.0)
                first_bytes.append((first_at - sent) * 1000.0)
                if done <= deadline:
                    self.completed += 1


async def _run_round(session: Any, spec: RoundSpec) -> RoundResult:
    state = _Round(session, spec)
    # All warm-ups at once, so that `concurrency` connections are open before the clock starts.
    await asyncio.gather(*(state.warm_up() for _ in range(spec.concurrency)))
    state.errors, state.first_error = 0, None  # warm-up retries are not counted
    cpu_before = time.process_time()
    state.start = time.perf_counter()
    state.deadline = state.start + spec.duration_s
    await asyncio.gather(*(state.measure() for _ in range(spec.concurrency)))
    cpu = time.process_time() - cpu_before
    return RoundResult(
        completed=state.completed,
        errors=state.errors,
        first_error=state.first_error,
        duration_s=spec.duration_s,
        latencies_ms=state.latencies,
        cpu_s=cpu,
        first_byte_ms=state.first_bytes,
    )


async def _serve() -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=60),
        skip_auto_headers=("User-Agent",),
    ) as session:
        while line := await reader.readline():
            spec = RoundSpec(**orjson.loads(line))
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
