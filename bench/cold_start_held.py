"""Requests held through a long start: keep-alives on a held stream, and the refusal of a
deadline shorter than the learned start time (part of `bench/cold_start.py`).

One gateway, one `process` backend: the fake upstream (`bench/fake_upstream.py`)
with `--startup-delay-s` (60 s, or 12 s with --quick), so its port opens only after a start
as long as a large model's. In order:

    held stream       at zero, no start measured: one streamed chat request (asking to
                      wait as long as it may with `x-request-timeout`: no estimate yet
                      makes the default deadline cover the start);
                      every piece the client receives is timed until `[DONE]`
    short deadline    back at zero, one start measured: one request with
                      `x-request-timeout: 2`, refused at once with 503 and `Retry-After`;
                      the start it set off is timed until the replica is ready (/readyz)
    mid start         halfway through that start, one more: its `Retry-After` is what is
                      left of the start

JSON lines, `{"bench": "cold_start", "metric", "value", "unit", "scenario", ...}`:

    keepalive_max_gap_s       the longest silence the held stream's client saw, from the
                              request to `[DONE]` (`keepalives`, `start_s` beside it)
    refusal_latency_ms        request sent -> the 503, at the client
    retry_after_error_ratio   |Retry-After - actual start| / actual start; the actual start
                              is from the request to the replica seen ready
    target_met                keepalive_max_gap_s <= 5 with the whole stream; refusal
                              latency < 50 ms; retry_after_error_ratio <= 0.2

    python -m bench.cold_start_held [--quick]    # alone; bench/cold_start.py runs it too
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.processes import OPERATOR, Gateway, start_gateway
from bench.report import emitter
from warmpool.start_estimate import ready_seconds

BENCH = "cold_start"
KEY = "bench-" + "h" * 40
BACKEND, MODEL = "held", "echo"
KEEPALIVE_TARGET_S = 5.0
REFUSAL_TARGET_MS = 50.0
RETRY_AFTER_TARGET = 0.2
SHORT_DEADLINE = "2"


@dataclass
class HeldStream:
    status: int = 0
    arrivals: list[float] = field(default_factory=list)  # seconds after sending, per piece
    keepalives: int = 0
    text: str = ""
    done: bool = False
    error: str | None = None
    pending: bytes = b""  # the start of an event cut by the network

    @property
    def max_gap_s(self) -> float:
        times = [0.0, *self.arrivals]
        return max(b - a for a, b in itertools.pairwise(times)) if self.arrivals else 0.0


@dataclass
class Refusal:
    status: int
    latency_ms: float
    retry_after_s: float | None
    code: str | None
    sent_at: float  # monotonic


_emit = emitter(BENCH)


def emit(metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
    _emit(metric, value, unit, **({"engine": "fake"} | fields))


def target(name: str, met: bool, observed: float, common: dict[str, Any]) -> None:
    emit("target_met", int(met), "bool", target=name, observed=observed, **common)


def config(state_dir: Path, start_s: float) -> dict[str, Any]:
    command = ["{python}", "-m", "bench.fake_upstream", "--port", "{port}"]
    return {
        "state": {"url": "memory", "path": str(state_dir / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            {
                "name": BACKEND,
                "kind": "process",
                "command": [*command, "--startup-delay-s", str(start_s)],
                "ready_path": "/v1/models",
                "models": [MODEL],
                "scaling": {"idle_s": 1.0, "last_replica_idle_s": 2.0, "stable_window_s": 1.0},
            }
        ],
        "tenants": [
            {"name": "bench", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
        ],
    }


def held_stream(gateway: Gateway) -> HeldStream:
    """One streamed request through the start; each piece's arrival timed."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True}
    headers = {"Authorization": f"Bearer {KEY}", "x-request-timeout": "900"}
    held = HeldStream()
    started = time.perf_counter()
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0)) as client,
            client.stream(
                "POST", gateway.base_url + "/chat/completions", json=body, headers=headers
            ) as response,
        ):
            held.status = response.status_code
            for piece in response.iter_raw():
                held.arrivals.append(time.perf_counter() - started)
                held_piece(held, piece)
    except httpx.HTTPError as exc:
        held.error = f"{type(exc).__name__}: {exc}"
    return held


def held_piece(held: HeldStream, piece: bytes) -> None:
    events, _, held.pending = (held.pending + piece).rpartition(b"\n\n")
    held.keepalives += events.count(b": waiting for model")
    for line in events.decode(errors="replace").splitlines():
        data = line.removeprefix("data: ")
        if line == data or not data.strip():
            continue
        if data.strip() == "[DONE]":
            held.done = True
            continue
        event = orjson.loads(data)
        if "error" in event:
            held.error = str(event["error"])[:300]
        for choice in event.get("choices") or []:
            held.text += (choice.get("delta") or {}).get("content") or ""


def refuse(gateway: Gateway, client: httpx.Client) -> Refusal:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "now"}]}
    headers = {"Authorization": f"Bearer {KEY}", "x-request-timeout": SHORT_DEADLINE}
    sent_at = time.monotonic()
    started = time.perf_counter()
    response = client.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
    latency_ms = (time.perf_counter() - started) * 1000
    retry_after = response.headers.get("retry-after")
    code = (response.json().get("error") or {}).get("code") if response.status_code != 200 else None
    return Refusal(
        response.status_code,
        latency_ms,
        float(retry_after) if retry_after is not None else None,
        code,
        sent_at,
    )


def replicas(gateway: Gateway) -> list[str]:
    ready = httpx.get(gateway.url + "/readyz", timeout=5, headers=OPERATOR).json()
    return list(ready.get("replicas", {}).get(BACKEND) or [])


def wait_for(gateway: Gateway, ready: bool, timeout_s: float) -> float:
    """Polls /readyz until the backend has a ready replica (or none); when, monotonic."""
    deadline = time.monotonic() + timeout_s
    while bool(replicas(gateway)) != ready:
        if time.monotonic() > deadline:
            raise RuntimeError(f"backend not {'ready' if ready else 'at zero'} in {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic()


def start_seconds(state_dir: Path) -> float | None:
    """The first start's time to ready, from the gateway's stored timeline."""
    path = state_dir / "cold_starts.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        seconds = ready_seconds(orjson.loads(line))
        if seconds is not None:
            return seconds
    return None


def report_held(held: HeldStream, start_s: float | None, common: dict[str, Any]) -> bool:
    scenario = {"scenario": "held_stream", **common}
    whole = held.status == 200 and held.done and held.error is None and bool(held.text)
    emit(
        "keepalive_max_gap_s",
        round(held.max_gap_s, 3),
        "s",
        keepalives=held.keepalives,
        start_s=None if start_s is None else round(start_s, 3),
        stream_complete=whole,
        error=held.error,
        **scenario,
    )
    met = whole and held.max_gap_s <= KEEPALIVE_TARGET_S
    target("keepalive_max_gap_s <= 5 then the whole stream", met, round(held.max_gap_s, 3), common)
    return not whole


def report_refusal(refusal: Refusal, ready_at: float, when: str, common: dict[str, Any]) -> bool:
    scenario = {"scenario": "short_deadline", "at": when, **common}
    actual = ready_at - refusal.sent_at
    refused = refusal.status == 503 and refusal.retry_after_s is not None
    emit(
        "refusal_latency_ms",
        round(refusal.latency_ms, 2),
        "ms",
        status=refusal.status,
        code=refusal.code,
        **scenario,
    )
    if refusal.retry_after_s is None:
        return True
    ratio = abs(refusal.retry_after_s - actual) / actual
    emit(
        "retry_after_error_ratio",
        round(ratio, 3),
        "ratio",
        retry_after_s=refusal.retry_after_s,
        actual_start_s=round(actual, 3),
        **scenario,
    )
    if when == "start":
        latency_ok = refused and refusal.latency_ms < REFUSAL_TARGET_MS
        target("refusal_latency_ms < 50", latency_ok, round(refusal.latency_ms, 2), common)
        ratio_ok = refused and ratio <= RETRY_AFTER_TARGET
        target("retry_after_error_ratio <= 0.2", ratio_ok, round(ratio, 3), common)
    return not refused


def run_held(work_dir: Path, quick: bool, common: dict[str, Any], progress: Any = print) -> bool:
    """Runs the scenarios; True if one failed outright (no answer, no refusal)."""
    start_s = 12.0 if quick else 60.0
    state_dir = work_dir / "gateway-held"
    state_dir.mkdir()
    params = {**common, "startup_delay_s": start_s}
    gateway = start_gateway(config(state_dir, start_s), state_dir, timeout_s=120)
    try:
        progress(f"held_stream: a streamed request through a {start_s:g} s start")
        held = held_stream(gateway)
        failed = report_held(held, start_seconds(state_dir), params)
        wait_for(gateway, ready=False, timeout_s=60)
        progress("short_deadline: refused at once, then the start it set off timed")
        with httpx.Client(timeout=30) as client:
            first = refuse(gateway, client)
            time.sleep(start_s / 2)
            middle = refuse(gateway, client)
        ready_at = wait_for(gateway, ready=True, timeout_s=start_s * 4 + 30)
        failed |= report_refusal(first, ready_at, "start", params)
        failed |= report_refusal(middle, ready_at, "mid_start", params)
        return failed
    finally:
        gateway.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 12 s start instead of 60 s")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-held-") as folder:
        common = {"mode": "quick" if args.quick else "full"}
        failed = run_held(Path(folder), args.quick, common, lambda m: print(m, file=sys.stderr))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
