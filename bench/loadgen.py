"""The benchmarks' HTTP load generator, in its own process: closed and open loop.

A benchmark starts it once (`LoadGenerator`) and sends it work over a pipe; the child
keeps one aiohttp `ClientSession` (keep-alive connections) for its whole life, so
connections to each target are reused from one round or phase to the next.

- `closed(RoundSpec) -> RoundResult` (bench/loadgen_closed.py): `concurrency` workers
  POST back to back for `duration_s`, cycling through the round's bodies; whole answers
  or SSE streams (which must end with `data: [DONE]`), times to first bytes, and, for a
  cache, only the answers of an expected `x-cache-tier` counted (the others by label) and
  the `Server-Timing` cache waits.
- `open(PhaseSpec) -> PhaseResult` (bench/loadgen_open.py): Poisson arrivals drawn in
  advance per stream, each request with its stream's body, `x-request-timeout` and client
  timeout, streamed or not; one `Record` per request, plus timed actions, polls, a
  cut-off and kept response headers.

Protocol (one JSON object a line): the parent writes `{"closed": RoundSpec}` or
`{"open": PhaseSpec}` to the child's stdin, the child answers with the `RoundResult` or
`PhaseResult` as JSON on its stdout. EOF on stdin ends the child.

Run `python -m bench.loadgen` only through `LoadGenerator`.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Self

import orjson

from bench.loadgen_closed import RoundResult, RoundSpec, run_round
from bench.loadgen_open import (
    Action,
    PhaseResult,
    PhaseSpec,
    Poll,
    Record,
    StreamSpec,
    run_phase,
)

__all__ = [
    "Action",
    "LoadGenerator",
    "PhaseResult",
    "PhaseSpec",
    "Poll",
    "Record",
    "RoundResult",
    "RoundSpec",
    "StreamSpec",
]

ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT_S = 15.0  # for the child to finish a phase's requests once its stdin closes


class LoadGenerator:
    """The parent's handle on the load-generator child process (`python -m bench.loadgen`):
    each JSON line written to its stdin gets one JSON line back; EOF on stdin ends it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        return self

    def closed(self, spec: RoundSpec) -> RoundResult:
        """One closed-loop round."""
        return RoundResult.from_json(self._ask(orjson.dumps({"closed": spec})))

    def open(self, spec: PhaseSpec) -> PhaseResult:
        """One open-loop phase."""
        return PhaseResult.from_json(self._ask(orjson.dumps({"open": spec})))

    def _ask(self, request: bytes) -> bytes:
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
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the child process -------------------------------------------------------------------


async def _answer(session: Any, request: dict[str, Any]) -> bytes:
    if "closed" in request:
        return orjson.dumps(await run_round(session, RoundSpec(**request["closed"])))
    if "open" in request:
        return (await run_phase(session, PhaseSpec.from_dict(request["open"]))).to_json()
    raise ValueError(f"neither a closed round nor an open phase: {sorted(request)}")


async def _serve() -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=256 * 2**20)  # a phase may carry every body
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # Idle connections closed after 4 s, before any server here closes them (vLLM's and the
    # gateway's uvicorn: 5 s and 75 s): one reused as its server closed it would fail a
    # request with ServerDisconnectedError, counted against whichever mode it hit
    # (tests/engine/test_vllm.py's client met exactly that in CI, 2026-12-07).
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4)
    async with aiohttp.ClientSession(
        connector=connector,
        # Closed rounds' requests; open phases' requests, actions and polls set their own.
        timeout=aiohttp.ClientTimeout(total=120),
        skip_auto_headers=("User-Agent",),
    ) as session:
        while line := await reader.readline():
            sys.stdout.buffer.write(await _answer(session, orjson.loads(line)) + b"\n")
            sys.stdout.buffer.flush()


def main() -> None:
    import uvloop

    # Ctrl-C reaches the whole process group: the parent stops this child by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(_serve())


if __name__ == "__main__":
    main()
