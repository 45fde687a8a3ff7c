"""Batch interference (issue 14): interactive latency while a 1,000-line batch job runs
through the gateway's own Batch API, against the same interactive traffic unloaded. Target:
the interactive time to first token p99 with the batch running stays within 1.5x its
unloaded p99.

Set-up, all real processes on loopback (2 cores shared by all of them):

- the engine: bench/fake_engine.py as bench/capacity.py runs it (its published defaults,
  vLLM V1 serving Llama-3.1-8B on one A100 40GB, `--scheduling-policy priority`, model
  `bench-llm`), with /metrics, and `--long-prefill-token-threshold 64` (`--prefill-chunk`;
  0: vLLM's default, a prompt in one step);
- one gateway in front of it: backend `engine: vllm`, `priority_scheduling: true`,
  `prefill_chunk_tokens` the engine's chunk (`--gateway-unaware`: unset) (the
  capacity bench's adaptive-metrics mode; the learned limit, no capacity given), cache off,
  batches on (state and files in a temp dir), `batches.concurrency` 16 (`--batch-concurrency`):
  the default all-jobs cap, so one job may use it (a job's default of 4 lines leaves the
  engine mostly idle); two tenants, `interactive` (class interactive) and `batch`.
- interactive traffic (bench/loadgen.py, its own process, open-loop Poisson): the
  capacity bench's interactive shape, 32-token prompts, 16 output tokens, streamed,
  `x-request-timeout: 3` (the client gives up at 3.75 s), at 40% of the engine's capacity.
  The capacity is estimated, not searched: bench/capacity.py's search finds the mix's
  capacity under its latency objective near 0.45 x the fake's steady-state bound
  (~25 req/s), so the rate is 0.4 x 0.45 x bound_rps ~ 10 req/s (`--rate` overrides).
  Both phases replay the same arrival times (one seed).
- the batch: a JSONL file of `--lines` lines (1,000; quick 300), each the capacity bench's
  batch shape (256-token prompt, each distinct, 64 output tokens, whole answers), uploaded
  with the official `openai` client (`files.create`, `batches.create`) as tenant `batch`.

Phases: `unloaded` (interactive only; its window starts after the gateway's own start-up,
whose latency limiter measures for about 6 s), then `with_batch`: the job is created, the
phase starts once its first lines have completed, and its window is clipped to the time the
batch still had lines to run. The gateway's /metrics (`gateway_batch_lines_total`), its
/readyz (learned limit) and the engine's /metrics (running, waiting) are polled every
0.25 s, so each window says how busy the batch kept the engine.

Metrics (JSON lines; requests are interactive ones sent in the window):

    interactive_rate_rps        the offered rate, with the bound it comes from
    engine_prefill_chunk_tokens the engine's chunk, with the backend's prefill_chunk_tokens
    interactive_ttft_p99_ms     time to the stream's first bytes, by `phase`
    interactive_ttft_p50_ms     its median (is the whole distribution shifted, or the tail?)
    interactive_latency_p99_ms  to `data: [DONE]`, by `phase`
    interactive_requests, interactive_errors (not 200 or not complete: refusals, timeouts)
    engine_running_mean, engine_waiting_mean, concurrency_limit_mean  by `phase`
    p99_ratio_vs_unloaded       with_batch TTFT p99 / unloaded (the target: <= 1.5)
    p99_ratio_interval_low, _high  its 90% bootstrap interval (bench/measure.py)
    latency_p99_ratio_vs_unloaded
    batch_lines_per_s           lines completed per second in the with_batch window
    batch_busy_share            share of the window's polls with batch lines still to run
    batch_completed_lines, batch_failed_lines, batch_wall_s (create to completed)
    target_met                  TTFT ratio <= 1.5, no interactive errors, batch busy
                                throughout the window, every batch line completed

    python bench/batch_interference.py            # 1,000 lines, about 2.5 minutes
    python bench/batch_interference.py --quick    # 300 lines, under a minute
    python bench/batch_interference.py --quick --engine vllm   # vLLM's CPU build

`--engine vllm` runs the same phases in front of vLLM's CPU build (`make engine`), with its
`--long-prefill-token-threshold` the chunk and its bound measured (bench/capacity.py);
every JSON line says which engine it saw.

Quick windows hold ~80 interactive requests: their p99s are nearly maxima. JSON lines only
on stdout, progress on stderr. Exits 0 once the figures are printed, whatever they are;
non-zero only when it could not measure (a server that did not start, a batch that failed).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.capacity import (  # noqa: E402
    CHAT_PATH,
    ENGINE,
    ENGINE_KIND,
    MODEL,
    Engine,
    bound_rps,
    capacity_view,
    engine_label,
    exact_length,
    prompt_text,
)
from bench.loadgen import (  # noqa: E402
    LoadGenerator,
    PhaseResult,
    PhaseSpec,
    Poll,
    Record,
    StreamSpec,
)
from bench.measure import percentile, ratio_interval  # noqa: E402
from bench.processes import OPERATOR, Gateway, start_gateway, unwind_on_sigterm  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402
from gateway.traffic.engine_metrics import parse as parse_metrics  # noqa: E402

BENCH = "batch_interference"
TARGET_RATIO = 1.5
CAPACITY_OF_BOUND = 0.45  # where bench/capacity.py's search lands, of bound_rps (~25 req/s)
LOAD = 0.4  # the interactive rate, of that capacity
INTERACTIVE_PROMPT, INTERACTIVE_OUTPUT = 32, 16  # tokens (4 characters a token)
BATCH_PROMPT, BATCH_OUTPUT = 256, 64
HEADER_TIMEOUT_S, CLIENT_TIMEOUT_S = 3.0, 3.75
KEYS = {name: f"sk-bench-{name}-" + "0" * 32 for name in ("interactive", "batch")}
SEED = 14
# The engine computes at most this many prompt tokens of a request a step (vLLM's
# --long-prefill-token-threshold), and the backend says so (prefill_chunk_tokens): with
# vLLM's default (no such cap) a 256-token batch prompt fills one ~41 ms step, which an
# interactive arrival can wait through whole before its own (docs/traffic-control.md "Batch
# beside interactive traffic").
PREFILL_CHUNK = 64
POLL_S = 0.25
_COMPLETED = re.compile(r'^gateway_batch_lines_total\{outcome="completed"\}\s+(\S+)', re.M)


@dataclass(frozen=True)
class Plan:
    lines: int
    start_warm_s: float  # the unloaded phase, before its window (the gateway's start-up)
    warm_s: float  # the with_batch phase, before its window
    measure_s: float
    drain_s: float  # after the last arrival, until requests still open are cut


QUICK_PLAN = Plan(lines=300, start_warm_s=6.0, warm_s=1.0, measure_s=10.0, drain_s=1.0)
FULL_PLAN = Plan(lines=1000, start_warm_s=10.0, warm_s=3.0, measure_s=45.0, drain_s=4.0)


_emit = emitter(BENCH, digits=4)


def emit(metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
    _emit(metric, value, unit, **(fields | {"engine": engine_label()}))


progress = progress_of(BENCH)


# --- pure helpers -------------------------------------------------------------------------


def interactive_rate(bound: float) -> float:
    return LOAD * CAPACITY_OF_BOUND * bound


def interactive_body() -> str:
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt_text(INTERACTIVE_PROMPT)}],
            "max_tokens": INTERACTIVE_OUTPUT,
            **exact_length(),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).decode()


def batch_file(lines: int) -> bytes:
    """The job's input: `lines` chat requests of the batch shape, each prompt distinct."""
    out = io.BytesIO()
    for index in range(lines):
        content = prompt_text(BATCH_PROMPT, tag=f"{index:08d} ")
        line = {
            "custom_id": f"line-{index}",
            "method": "POST",
            "url": CHAT_PATH,
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": BATCH_OUTPUT,
                **exact_length(),
            },
        }
        out.write(orjson.dumps(line) + b"\n")
    return out.getvalue()


def completed_lines(metrics_text: str) -> float | None:
    """`gateway_batch_lines_total{outcome="completed"}` from the gateway's /metrics."""
    match = _COMPLETED.search(metrics_text)
    return float(match.group(1)) if match else None


def progress_series(samples: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """(time, batch lines completed so far) from /metrics polls; a line absent reads 0."""
    return [(at, completed_lines(text) or 0.0) for at, text in samples]


def busy_until(series: list[tuple[float, float]], total: int, baseline: float) -> float:
    """When the job's last line completed (the first poll showing all `total` lines past
    `baseline`, the count before the job); infinity if not within the polls."""
    for at, count in series:
        if count - baseline >= total:
            return at
    return math.inf


def in_window(records: list[Record], window: tuple[float, float]) -> list[Record]:
    low, high = window
    return [r for r in records if low <= r[1] < high]


def good(record: Record) -> bool:
    return record[4] == 200 and record[5] is None


def p99(values: list[float]) -> float:
    return percentile(values, 99) if values else math.nan


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else math.nan


# --- processes ----------------------------------------------------------------------------


def gateway_config(
    engine_url: str, work_dir: Path, batch_concurrency: int, prefill_chunk: int | None
) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "gpu",
        "kind": "http",
        "base_url": engine_url + "/v1",
        "models": [MODEL],
        "engine": "vllm",
        "priority_scheduling": True,
    }
    if prefill_chunk:
        backend["prefill_chunk_tokens"] = prefill_chunk
    return {
        "state": {"url": "memory", "path": str(work_dir / "state.json")},
        "cache": {"enabled": False},
        "batches": {
            "concurrency": batch_concurrency,
            "max_concurrency": max(16, batch_concurrency),
        },
        "backends": [backend],
        "tenants": [
            {
                "name": name,
                "priority": name,
                "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}],
            }
            for name, key in KEYS.items()
        ],
    }


def batch_client(gateway: Gateway) -> Any:
    import openai

    return openai.OpenAI(api_key=KEYS["batch"], base_url=gateway.base_url, max_retries=0)


def create_batch(client: Any, lines: int) -> str:
    upload = client.files.create(file=("batch.jsonl", batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint=CHAT_PATH, completion_window="24h"
    )
    return str(batch.id)


def gateway_completed(gateway: Gateway) -> float:
    return (
        completed_lines(httpx.get(gateway.url + "/metrics", timeout=10, headers=OPERATOR).text)
        or 0.0
    )


def wait_started(gateway: Gateway, baseline: float, timeout_s: float = 30.0) -> None:
    """Until the job's first lines have completed (it is running, not validating)."""
    deadline = time.monotonic() + timeout_s
    while gateway_completed(gateway) <= baseline:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the batch completed no line in {timeout_s:g} s")
        time.sleep(0.1)


def wait_finished(client: Any, batch_id: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        if time.monotonic() > deadline:
            progress(f"batch {batch_id} still {batch.status} after {timeout_s:g} s: cancelling")
            client.batches.cancel(batch_id)
            timeout_s, deadline = 30.0, time.monotonic() + 30.0
        time.sleep(0.25)


# --- phases -------------------------------------------------------------------------------


@dataclass
class Window:
    """One phase's measured window, read from its records and polls."""

    phase: str
    result: PhaseResult
    window: tuple[float, float]

    def records(self) -> list[Record]:
        return in_window(self.result.records, self.window)

    def ttft_p99_ms(self) -> float:
        return p99(self.ttfts_ms())

    def ttfts_ms(self) -> list[float]:
        return [r[2] for r in self.records() if good(r)]

    def ttft_p50_ms(self) -> float:
        return percentile([r[2] for r in self.records() if good(r)] or [math.nan], 50)

    def latency_p99_ms(self) -> float:
        return p99([r[3] for r in self.records() if good(r)])

    def errors(self) -> int:
        return sum(1 for r in self.records() if not good(r))

    def polled(self, name: str) -> list[tuple[float, str]]:
        low, high = self.window
        return [(at, text) for at, text in self.result.polls[name] if low <= at < high]

    def engine_means(self) -> tuple[float, float]:
        samples = [parse_metrics("vllm", text) for _, text in self.polled("engine")]
        running = [s.running for s in samples if s.running is not None]
        waiting = [s.waiting for s in samples if s.waiting is not None]
        return mean(running), mean(waiting)

    def limit_mean(self) -> float:
        views = [capacity_view(text) for _, text in self.polled("readyz")]
        return mean([float(v["limit"]) for v in views if v and v.get("limit") is not None])


def run_phase(
    loadgen: LoadGenerator,
    gateway: Gateway,
    engine: Engine,
    rate: float,
    span: tuple[float, float],
    drain_s: float,
) -> PhaseResult:
    duration = span[1]
    stream = StreamSpec(
        "interactive",
        KEYS["interactive"],
        rate,
        interactive_body(),
        True,
        HEADER_TIMEOUT_S,
        CLIENT_TIMEOUT_S,
    )
    polls = [
        Poll("metrics", gateway.url + "/metrics", POLL_S, 0.0, duration, headers=OPERATOR),
        Poll("readyz", gateway.url + "/readyz", POLL_S, 0.0, duration, headers=OPERATOR),
        Poll("engine", engine.url + "/metrics", POLL_S, 0.0, duration),
    ]
    spec = PhaseSpec(
        gateway.url + CHAT_PATH, duration, duration + drain_s, SEED, [stream], polls=polls
    )
    return loadgen.open(spec)


def report_window(window: Window) -> None:
    phase = window.phase
    running, waiting = window.engine_means()
    emit("interactive_ttft_p99_ms", window.ttft_p99_ms(), "ms", phase=phase)
    emit("interactive_ttft_p50_ms", window.ttft_p50_ms(), "ms", phase=phase)
    emit("interactive_latency_p99_ms", window.latency_p99_ms(), "ms", phase=phase)
    emit("interactive_requests", len(window.records()), "requests", phase=phase)
    emit("interactive_errors", window.errors(), "requests", phase=phase)
    emit("engine_running_mean", running, "requests", phase=phase)
    emit("engine_waiting_mean", waiting, "requests", phase=phase)
    emit("concurrency_limit_mean", window.limit_mean(), "requests", phase=phase)
    emit("loadgen_lag_p99_ms", window.result.lag_p99_ms, "ms", phase=phase)
    progress(
        f"{phase}: TTFT p99 {window.ttft_p99_ms():.0f} ms, latency p99 "
        f"{window.latency_p99_ms():.0f} ms, {len(window.records())} requests, "
        f"{window.errors()} errors; engine running {running:.1f}, waiting {waiting:.1f}; "
        f"learned limit {window.limit_mean():.1f}"
    )


@dataclass
class BatchView:
    lines_per_s: float
    busy_share: float
    lines_in_window: float


def busy_share(window: Window, total: int, baseline: float) -> float:
    """Share of the (planned) window's polls at which the job still had lines to run."""
    series = progress_series(window.polled("metrics"))
    if not series:
        return 0.0
    return sum(1 for _, count in series if count - baseline < total) / len(series)


def batch_view(window: Window, busy: float) -> BatchView:
    """The job's progress over the window (clipped already to its busy time)."""
    series = progress_series(window.polled("metrics"))
    if len(series) < 2:
        return BatchView(math.nan, busy, 0.0)
    done = series[-1][1] - series[0][1]
    span = series[-1][0] - series[0][0]
    return BatchView(done / span if span > 0 else math.nan, busy, done)


# --- the run ------------------------------------------------------------------------------


@dataclass
class Setup:
    plan: Plan
    loadgen: LoadGenerator
    engine: Engine
    gateway: Gateway
    rate: float
    prefill_chunk: int  # the engine's --long-prefill-token-threshold (0: off)
    gateway_chunk: int | None  # the backend's prefill_chunk_tokens
    bound: float  # the engine's steady-state bound for the mix, req/s


def unloaded(setup: Setup) -> Window:
    plan = setup.plan
    span = (plan.start_warm_s, plan.start_warm_s + plan.measure_s)
    progress(f"unloaded: {setup.rate:.2f} req/s interactive for {span[1]:g} s")
    result = run_phase(setup.loadgen, setup.gateway, setup.engine, setup.rate, span, plan.drain_s)
    return Window("unloaded", result, span)


def with_batch(setup: Setup) -> tuple[Window, BatchView, Any, float]:
    plan, gateway = setup.plan, setup.gateway
    client = batch_client(gateway)
    baseline = gateway_completed(gateway)
    began = time.monotonic()
    batch_id = create_batch(client, plan.lines)
    wait_started(gateway, baseline)
    progress(
        f"batch {batch_id}: {plan.lines} lines, running after {time.monotonic() - began:.1f} s"
    )
    span = (plan.warm_s, plan.warm_s + plan.measure_s)
    result = run_phase(setup.loadgen, gateway, setup.engine, setup.rate, span, plan.drain_s)
    finished_at = busy_until(progress_series(result.polls["metrics"]), plan.lines, baseline)
    busy = busy_share(Window("with_batch", result, span), plan.lines, baseline)
    if finished_at < span[1]:
        progress(
            f"the batch finished {span[1] - finished_at:.1f} s before the window's end: clipped"
        )
        span = (span[0], max(span[0] + POLL_S, finished_at))
    window = Window("with_batch", result, span)
    view = batch_view(window, busy)
    batch = wait_finished(client, batch_id, timeout_s=600.0)
    return window, view, batch, time.monotonic() - began


def report(
    setup: Setup, quiet: Window, loaded: Window, view: BatchView, batch: Any, wall: float
) -> None:
    ratio = loaded.ttft_p99_ms() / quiet.ttft_p99_ms()
    counts = batch.request_counts
    completed = counts.completed if counts else 0
    failed = counts.failed if counts else 0
    emit("p99_ratio_vs_unloaded", ratio, "ratio", target=TARGET_RATIO)
    low, high = ratio_interval(loaded.ttfts_ms(), quiet.ttfts_ms())
    emit("p99_ratio_interval_low", low, "ratio", confidence=0.9)
    emit("p99_ratio_interval_high", high, "ratio", confidence=0.9)
    emit("latency_p99_ratio_vs_unloaded", loaded.latency_p99_ms() / quiet.latency_p99_ms(), "ratio")
    emit(
        "batch_lines_per_s",
        view.lines_per_s,
        "lines/s",
        window_s=round(loaded.window[1] - loaded.window[0], 2),
    )
    emit("batch_lines_in_window", view.lines_in_window, "lines")
    emit("batch_busy_share", view.busy_share, "ratio")
    emit("batch_completed_lines", completed, "lines", lines=setup.plan.lines, status=batch.status)
    emit("batch_failed_lines", failed, "lines")
    emit("batch_wall_s", wall, "s")
    met = (
        ratio <= TARGET_RATIO
        and quiet.errors() + loaded.errors() == 0
        and view.busy_share == 1.0
        and completed == setup.plan.lines
    )
    emit("target_met", int(met), "bool", ttft_p99_ratio=round(ratio, 3), target=TARGET_RATIO)
    progress(
        f"TTFT p99 ratio {ratio:.2f} (target <= {TARGET_RATIO}); batch {view.lines_per_s:.1f} "
        f"lines/s in the window, {completed}/{setup.plan.lines} completed in {wall:.1f} s: "
        + ("target met" if met else "target NOT met")
    )


def measure(setup: Setup) -> None:
    emit(
        "interactive_rate_rps",
        setup.rate,
        "req/s",
        bound_rps=round(setup.bound, 2),
        load=LOAD,
    )
    emit(
        "engine_prefill_chunk_tokens",
        setup.prefill_chunk,
        "tokens",
        gateway_prefill_chunk_tokens=setup.gateway_chunk,
    )
    quiet = unloaded(setup)
    report_window(quiet)
    loaded, view, batch, wall = with_batch(setup)
    report_window(loaded)
    if batch.status != "completed":
        raise RuntimeError(f"batch ended {batch.status}: {batch.errors}")
    report(setup, quiet, loaded, view, batch, wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 lines, short windows")
    parser.add_argument(
        "--engine",
        choices=("fake", "vllm"),
        default="fake",
        help="the fake engine, or vLLM's CPU build from `make engine` (bench/capacity.py)",
    )
    parser.add_argument("--lines", type=int, help="batch lines (default 1,000; quick 300)")
    parser.add_argument("--rate", type=float, help="interactive req/s (default ~10)")
    parser.add_argument("--batch-concurrency", type=int, default=16, help="batches.concurrency")
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=PREFILL_CHUNK,
        help="the engine's --long-prefill-token-threshold and the backend's "
        f"prefill_chunk_tokens (default {PREFILL_CHUNK}; 0: vLLM's default, off)",
    )
    parser.add_argument(
        "--gateway-unaware",
        action="store_true",
        help="leave the backend's prefill_chunk_tokens unset (one step a dispatch)",
    )
    args = parser.parse_args(argv)
    ENGINE_KIND["kind"] = args.engine
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    if args.lines:
        plan = Plan(args.lines, plan.start_warm_s, plan.warm_s, plan.measure_s, plan.drain_s)
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        work_dir = Path(tmp)
        engine: Engine | None = None
        gateway: Gateway | None = None
        loadgen = LoadGenerator()
        try:
            engine = Engine(
                work_dir, replace(ENGINE, long_prefill_token_threshold=args.prefill_chunk)
            )
            loadgen.start()
            chunk = None if args.gateway_unaware else args.prefill_chunk or None
            config = gateway_config(engine.url, work_dir, args.batch_concurrency, chunk)
            gateway = start_gateway(config, work_dir)
            progress(f"engine {engine.url}, gateway {gateway.url}")
            # vLLM's bound is measured, the fake's computed (bench/capacity.py).
            bound = engine.bound_rps(ENGINE) if engine.vllm else bound_rps(ENGINE)
            rate = args.rate or interactive_rate(bound)
            setup = Setup(plan, loadgen, engine, gateway, rate, args.prefill_chunk, chunk, bound)
            measure(setup)
        finally:
            loadgen.stop()
            if gateway is not None:
                gateway.stop()
            if engine is not None:
                engine.server.stop()
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
