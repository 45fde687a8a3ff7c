"""Soak: steady mixed traffic against two gateway replicas for a bounded time, watching for
lost requests, latency drift and leaks.

Set-up (bench/chaos_deployment.py, all real processes on loopback): two replicas
sharing a private Redis, MiniLM semantic cache on, a fast fake upstream (`echo`), and an
on-demand backend (the fake upstream started by each replica, stopped after 2 s idle).

Traffic, open loop at `--rate` requests per second, each request one of (by turns):
cache hits (a small pool of repeated prompts), misses (fresh prompts), streams (fresh,
SSE), requests of a tenant over its 40 requests/minute quota (429s), and now and then a
request to the on-demand backend after it went idle (a cold start).

Reports, as JSON lines `{"bench": "soak", "metric", "value", "unit", ...}`:
- `requests` by `outcome` (model, cache, 429:..., lost:...), `lost`, `errors_5xx_unexpected`;
- per window of `--window` seconds: `p50_ms`, `p99_ms`, `sent`;
- per replica, sampled every 2 s: `rss_mib` and `open_fds` at the start and the end of
  the measured part, and their least-squares `*_slope` after the warm-up (per minute);
- `p99_drift`: p99 of the last window over the first measured one (the baseline).

Exits 1 if a request was lost, a 5xx was not one the mix expects, or RSS / descriptors grew
after the warm-up: RSS by more than 16 MiB + 10 % (the cache is bounded to 200 entries per
namespace, reached during the warm-up), descriptors by more than 16 or one per 200 requests
(connection pools may still grow to a new high-water mark of concurrency; a leak grows
with the requests).

Run: python bench/soak.py [--duration 600] [--rate 20] [--quick]  (`make soak`)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.chaos import (  # noqa: E402
    Burst,
    Shot,
    chat,
    fire,
    open_fds,
    percentile,
    rss_mib,
)
from bench.chaos_deployment import KEYS, Deployment, deployment  # noqa: E402
from bench.report import emitter  # noqa: E402

BENCH = "soak"
SAMPLE_EVERY_S = 2.0
# What the mix may answer besides 200: quota refusals. (Not 503: each cold start takes
# about a second, far inside the 60 s deadline, so none may be shed.)
EXPECTED = {200, 429}


@dataclass
class Samples:
    """RSS and open descriptors of each replica over time."""

    times: list[float] = field(default_factory=list)
    rss: list[list[float]] = field(default_factory=list)
    fds: list[list[int]] = field(default_factory=list)


def mix(count: int, rate: float) -> list[Shot]:
    """`count` requests at `rate` per second: hits, misses, streams, quota refusals, and a
    cold start about every 8 s (the on-demand backend idles out after 2 s)."""
    run = uuid.uuid4().hex[:6]
    cold_every = max(1, round(8 * rate))
    makers: list[Callable[[int], Shot]] = [
        lambda i: Shot(chat(f"soak {run} popular question {i % 8}"), KEYS["a"]),
        lambda i: Shot(chat(f"soak {run} fresh question {i}"), KEYS["b"]),
        lambda i: Shot(chat(f"soak {run} stream {i}", stream=True), KEYS["a"]),
        lambda i: Shot(chat(f"soak {run} popular question {i % 8}", stream=True), KEYS["b"]),
        lambda i: Shot(chat(f"soak {run} quota {i}"), KEYS["q"]),
    ]
    shots = []
    for i in range(count):
        if i % cold_every == cold_every - 1:
            shots.append(Shot(chat(f"soak {run} cold {i}", "cold-echo"), KEYS["b"]))
        else:
            shots.append(makers[i % len(makers)](i))
    return shots


async def sample(d: Deployment, samples: Samples, seconds: float) -> None:
    pids = [g.server.process.pid for g in d.replicas if g.server.process is not None]
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < seconds:
        samples.times.append(now - started)
        samples.rss.append([rss_mib(p) for p in pids])
        samples.fds.append([open_fds(p) for p in pids])
        await asyncio.sleep(SAMPLE_EVERY_S)


def soak(d: Deployment, seconds: float, rate: float) -> tuple[Burst, Samples]:
    shots = mix(max(1, int(seconds * rate)), rate)
    samples = Samples()

    async def go() -> Burst:
        return await fire(
            "soak",
            d.base_urls,
            shots,
            EXPECTED,
            concurrency=64,
            timeout_s=90,
            during=lambda: sample(d, samples, seconds + 1),
            spacing_s=1 / rate,
        )

    return asyncio.run(go()), samples


def slope_per_min(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return (
        0.0
        if var == 0
        else 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    )


emit = emitter(BENCH, digits=3)


def report(
    burst: Burst, samples: Samples, warmup_s: float, window_s: float, rate: float
) -> list[str]:
    """Prints the figures; returns what failed (empty: the soak passed)."""
    failures: list[str] = []
    for outcome, count in sorted(burst.by_outcome.items()):
        emit("requests", count, "count", outcome=outcome)
    emit("lost", len(burst.lost), "count")
    emit("errors_5xx_unexpected", len(burst.unexpected_5xx), "count")
    if burst.lost or burst.unexpected_5xx:
        failures.append(f"{len(burst.lost)} lost, {len(burst.unexpected_5xx)} unexpected 5xx")
    p99s = windows(burst, window_s)
    measured = [p for t, p in p99s if t >= warmup_s] or [p for _, p in p99s]
    if measured and measured[0] > 0:
        emit("p99_drift", measured[-1] / measured[0], "ratio", baseline="first window")
    failures += leaks(samples, warmup_s, rate)
    return failures


def windows(burst: Burst, window_s: float) -> list[tuple[float, float]]:
    first = min(r.started for r in burst.results)
    buckets: dict[int, list[float]] = {}
    for r in burst.results:
        buckets.setdefault(int((r.started - first) // window_s), []).append(r.seconds)
    p99s = []
    for index, latencies in sorted(buckets.items()):
        t = index * window_s
        p99 = percentile(latencies, 0.99) * 1000
        emit("p50_ms", percentile(latencies, 0.5) * 1000, "ms", t_s=t, window_s=window_s)
        emit("p99_ms", p99, "ms", t_s=t, window_s=window_s)
        emit("sent", len(latencies), "count", t_s=t, window_s=window_s)
        p99s.append((t, p99))
    return p99s


def leaks(samples: Samples, warmup_s: float, rate: float) -> list[str]:
    failures = []
    after = [i for i, t in enumerate(samples.times) if t >= warmup_s]
    if len(after) < 2:
        return ["too few samples after the warm-up to judge leaks"]
    xs = [samples.times[i] for i in after]
    for replica in range(len(samples.rss[0])):
        rss = [samples.rss[i][replica] for i in after]
        fds = [float(samples.fds[i][replica]) for i in after]
        rss_slope, fds_slope = slope_per_min(xs, rss), slope_per_min(xs, fds)
        span_min = (xs[-1] - xs[0]) / 60
        for name, values, slope, unit in (
            ("rss_mib", rss, rss_slope, "MiB"),
            ("open_fds", fds, fds_slope, "count"),
        ):
            emit(name, values[0], unit, replica=replica, at="after_warmup")
            emit(name, values[-1], unit, replica=replica, at="end")
            emit(name + "_slope", slope, unit + "/min", replica=replica)
        if rss_slope * span_min > 16 + 0.1 * rss[0]:
            failures.append(f"replica {replica}: RSS grew {rss_slope:.1f} MiB/min")
        if fds_slope * span_min > max(16, rate * span_min * 60 / 200):
            failures.append(f"replica {replica}: descriptors grew {fds_slope:.1f}/min")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--window", type=float, default=None, help="latency window, s")
    parser.add_argument("--quick", action="store_true", help="about 45 s in all")
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.duration
    window = args.window or (5.0 if duration <= 120 else 30.0)
    warmup = min(60.0, duration * 0.25)
    with tempfile.TemporaryDirectory(prefix="soak-") as folder, deployment(Path(folder)) as d:
        print(f"[{BENCH}] {duration:.0f} s at {args.rate}/s", file=sys.stderr, flush=True)
        burst, samples = soak(d, duration, args.rate)
        emit("duration", duration, "s", rate_per_s=args.rate, warmup_s=warmup)
        failures = report(burst, samples, warmup, window, args.rate)
    for failure in failures:
        print(f"[{BENCH}] FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
