"""Workload shapes (issue 14): model fallbacks and degradation under overload, measured
under open-loop load. All real processes on loopback; arrivals are open-loop Poisson
(bench/loadgen.py, its own process, which also keeps the answers' `x-model-fallback`
and `x-degraded` headers); refusals are not retried.

Scenario `fallback` (README "Model fallbacks"): a gateway with two backends, each an
upstream of fixed capacity (bench/capacity_upstream.py: 4 requests at once, 80 ms each,
50 requests/s; backend `max_concurrency: 4`, fixed): `primary-pool` serves model `primary`,
`secondary-pool` serves `secondary`, and `fallbacks: {primary: [secondary]}`; default
`traffic:` settings (retry budget: 0.2 retries per request plus 3 per second, breaker on).
One tenant, class interactive, sends small chat requests (max_tokens 16, whole answers,
`x-request-timeout: 1`, the client gives up at 1.25 s) at `load` x 50 requests/s (0.05 and
0.5; full run also 0.2), each load with its own gateway and primary upstream, two phases:

    mode direct        the load sent to `secondary` by name: the baseline
    mode primary_down  the same arrivals sent to `primary`; `kill_at_s` into the phase its
                       upstream process is killed (SIGKILL: connections refused from then
                       on; those in service are reset). The window starts `settle_s` after
                       the kill: the outage, with the breaker open most of the time.

Figures (`scenario` fallback, by `load` and `mode`; requests sent in the window unless
`scope` phase: every request of the phase, the primary's last answers and the kill
included):

    answers_ok_share           answered 200, of requests sent
    fallback_answer_share      answers 200 carrying `x-model-fallback: secondary`, of answers 200
    failed_share               by `status` and `code`: the other answers, of requests sent
    latency_p50_ms, _p99_ms    of the answers 200; p99_ratio_vs_direct: primary_down's / direct's
    client_timeouts            requests the client gave up on, all of the phase
    upstream_attempts_per_request
                               upstream attempts / requests: the secondary's counted by its
                               upstream (/_stats); the primary's from the gateway's
                               /metrics (a dead upstream counts nothing): each failed attempt
                               is one `gateway_retries_total` (retried) or one
                               `gateway_upstream_errors_total` (given up), each successful
                               one an answer 200 without the fallback header
    retry_budget_allowed_per_request
                               what the primary pool's retry budget allows, per request:
                               (N x (1 + ratio) + min_per_s x T + burst) / N, N requests in
                               T seconds (the window, or the phase between the two scrapes
                               of /metrics), burst what the budget can hold at once (saved
                               tokens and a full reserve: 13 with the defaults, asked of
                               gateway/traffic/retry.py's RetryBudget). A fallback takes a
                               token, as a retry does (docs/traffic-control.md
                               "Model fallbacks")
    fallbacks_tried            by `reason`: gateway_model_fallbacks_total (phase)
    retry_budget_exhausted     gateway_retry_budget_exhausted_total of primary-pool (phase)

Scenario `degrade` (README "Degradation under overload"): the fake engine
(bench/fake_engine.py, as bench/capacity.py runs it: its defaults, Llama-3.1-8B on an A100
40GB, with `--scheduling-policy priority`; output is exactly max_tokens tokens) behind a
gateway with the backend as deployed in front of vLLM (`engine: vllm`,
`priority_scheduling: true`, adaptive concurrency: no limit given), backend `gpu`. Mode
on_model's gateway has a second backend so deployed, `small`: a second fake engine serving
`bench-small`, a cheaper model (about a quarter the size: a quarter of the per-token step
and prefill costs, half the fixed step cost; steady_capacity for batch's shape ~3.4x the
first's). Two tenants (any model allowed):

    interactive  class interactive: 32-token prompts, 16 output tokens, streamed;
                 `x-request-timeout: 3`, gives up at 3.75 s (whole stream)
    batch        class batch: 256-token prompts, max_tokens 256, whole answers;
                 `x-request-timeout: 20`, gives up at 25 s

`capacity_rps`, rough, not searched: 0.45 of the engine's steady-state bound for the mix
(`bound_rps`: the most it completes with all 256 sequences running, from the fake's own
formula, fake_engine.steady_capacity per shape, as bench/capacity.py's bound_rps), where
bench/capacity.py's search of its latency objective lands for its own mix. The mix at
load 1: interactive 70% of the requests, batch 30%. `load`: 0.5 (both streams at half:
the unloaded baseline) and 5 (interactive at its share, 0.7 x capacity; batch the rest,
4.3 x capacity, about twice what the engine completes at its bound). Each `mode` has its
own gateway, against the same engine (and on_model's the small one too), one phase after
another (0.5 then 5; modes off, on, on_model; the same arrival times in every mode):

    mode off       no degrade policy
    mode on        tenant batch: `degrade: {when_wait_over: 0.3, max_tokens: 64}`: a batch
                   request whose expected queue wait exceeds 0.3 of its time left has its
                   output capped at 64 tokens (the queue sheds at 0.5)
    mode on_model  tenant batch: `degrade: {when_wait_over: 0.3, model: bench-small}`: such
                   a request goes to bench-small's queue and engine instead, whole (256
                   tokens), and is shed there only if that queue cannot meet its deadline

What each shows: `on` whether capping output buys token goodput on the same engine;
`on_model` whether moving the excess to other capacity does. A finding of the `on` runs,
not a target: on a continuous-batching engine whose running count the gateway's learned
limit holds, tokens/s is about running / step time whatever max_tokens is, so the cap ends
answers sooner and adds a prefill per 64 output tokens instead of per 256 (token goodput on
/ off 0.75 and 0.60 in the first quick runs); and the capped requests still join the one
queue, which sheds most of them (625 of 631). In the first `on_model` runs token goodput
rose (1.3 to 2.3x off's), bounded by the small backend's learned limit: 6 to 10 in flight,
its engine's steps near their fixed cost, so its queue shed most of the moved requests too.

Figures (`scenario` degrade, by `mode` and `load`; answers completed in the window, or
requests sent in it):

    goodput_tokens_per_s       completion tokens (the answer's `usage`) of answers 200
                               (streams complete) completed in the window, per second; by
                               `class` too (all, interactive, batch)
    goodput_rps                those answers, per second; by class
    goodput_tokens_ratio_on_vs_off, goodput_tokens_ratio_on_model_vs_off
                               the mode's goodput_tokens_per_s / mode off's, same load
    degraded_share             class batch: of its answers 200 completed in the window,
                               those carrying `x-degraded`
    served_by_small_share      of the same, those whose `x-degraded` names `model=bench-small`
                               (the load generator keeps headers, not bodies)
    ttft_p99_ms                interactive time to first token (the body's first bytes),
                               of the streams answered 200 sent in the window
    p99_ratio_vs_unloaded      ttft_p99_ms / the same mode's at load 0.5
    client_timeouts            requests the client gave up on, all of the phase; by class
    refused_share              answered 429 or 503, of requests sent; by class
    other_answers              neither 200, 429, 503, a client timeout nor cut (all phase)
    unresolved                 still open when the phase ended, cut (the engine aborts them)
    concurrency_limit_mean, in_flight_mean, queued_mean   from /readyz every 0.5 s
    degraded_requests, shed_requests   class batch, the gateway's own counts in the window
                               (gateway_degraded_total, gateway_shed_total): degraded when
                               they joined the queue, whether answered or shed later
    engine_tokens_per_s        tokens the engine generated in the window, per second,
                               answered or not; engine_step_ms_mean, engine_aborted (its
                               /_stats at the window's edges): what bounds token goodput
    backend `small`            mode on_model: the same limit, queue and engine figures for
                               the cheaper backend (lines with `backend: small`; those
                               without are `gpu`'s), and shed_requests by `backend`
    loadgen_lag_p99_ms         how late arrivals left the load generator

Last, `target_met` (1 or 0) for the issue's claims: per fallback load, every answer from
the fallback (answers_ok_share >= 0.99) and upstream attempts within the budget (both
scopes); at load 5, modes on and on_model each: token goodput above mode off's,
interactive TTFT p99 within 2x its unloaded value, no interactive client timeouts.

    python bench/workload_shapes.py            # about six and a half minutes
    python bench/workload_shapes.py --quick    # the same scenarios, short phases, ~2 min
                                               # (degrade alone ~90 s: windows unchanged)
    python bench/workload_shapes.py --quick --scenarios fallback

Quick windows hold few requests (the light fallback load: about eight; the degrade
windows a few dozen batch answers of 256 tokens each, so token goodput moves by tens of
percent between runs), and a quick load-0.5 window still holds the gateway's start-up
(its latency limiter's first measurements): read quick p99s as maxima and quick ratios as
rough. JSON lines only on stdout, progress on stderr. Exits 0 once the figures are
printed, whatever they are; non-zero only when it could not measure (a server that did
not start, a load generator that died).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
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
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import overload  # noqa: E402
from bench.capacity import (  # noqa: E402
    ENGINE,
    MODEL,
    Engine,
    good,
    is_refusal,
    learned_means,
    mix_bound_rps,
    unexpected,
    wait_gateway_idle,
)
from bench.fake_engine import EngineParams  # noqa: E402
from bench.loadgen import (  # noqa: E402
    LoadGenerator,
    PhaseResult,
    PhaseSpec,
    Poll,
    Record,
    StreamSpec,
)
from bench.measure import percentile  # noqa: E402
from bench.processes import OPERATOR, Gateway, ServerProcess, unwind_on_sigterm  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402
from gateway.settings import TrafficSettings  # noqa: E402
from gateway.traffic.retry import RetryBudget  # noqa: E402

BENCH = "workload_shapes"
CHAT_PATH = "/v1/chat/completions"
KEYS = {name: f"sk-bench-{name}-" + "0" * 32 for name in ("client", "interactive", "batch")}
FALLBACK_HEADER, DEGRADED_HEADER = "x-model-fallback", "x-degraded"

# --- fallback
PRIMARY, SECONDARY = "primary", "secondary"
PRIMARY_POOL, SECONDARY_POOL = "primary-pool", "secondary-pool"
SECONDARY_RPS = overload.CAPACITY_RPS
FALLBACK_DEADLINE = overload.DEADLINES["interactive"]  # (x-request-timeout, client)

# --- degrade
INTERACTIVE, BATCH = "interactive", "batch"
STREAMS = (INTERACTIVE, BATCH)  # the load generator's stream order
GPU, SMALL = "gpu", "small"  # the backends: the engine serving MODEL, the cheaper one's


@dataclass(frozen=True)
class Shape:
    prompt_tokens: int
    max_tokens: int
    stream: bool
    deadline: tuple[float, float]  # (x-request-timeout, client timeout)


SHAPES = {
    INTERACTIVE: Shape(32, 16, True, (3.0, 3.75)),
    BATCH: Shape(256, 256, False, (20.0, 25.0)),
}
SHARES = {INTERACTIVE: 0.7, BATCH: 0.3}  # of capacity (requests), at load 1
# A rough capacity under the latency objective, of the engine's steady-state bound: where
# bench/capacity.py's search lands for its mix (bench/batch_interference.py uses it too).
CAPACITY_OF_BOUND = 0.45
SMALL_MODEL = "bench-small"
# The cheaper model's engine: a model about a quarter the size (a 2B beside the 8B), so a
# quarter of the per-token compute (each running sequence's share of a step, each prompt
# token) and half the fixed step cost (weights read, launches); the same KV budget.
SMALL_ENGINE = replace(
    ENGINE,
    model=SMALL_MODEL,
    step_a_ms=ENGINE.step_a_ms / 2,
    step_b_ms=ENGINE.step_b_ms / 4,
    prefill_ms_per_token=ENGINE.prefill_ms_per_token / 4,
)
# Tenant batch's policy by mode: none (off), the output cap (on), the cheaper model.
DEGRADES: dict[str, dict[str, Any]] = {
    "on": {"when_wait_over": 0.3, "max_tokens": 64},
    "on_model": {"when_wait_over": 0.3, "model": SMALL_MODEL},
}
ACTIONS = {"on": "max_tokens", "on_model": "model"}  # gateway_degraded_total's `action`
UNLOADED, OVERLOAD = 0.5, 5.0
SEEDS = {UNLOADED: 5, OVERLOAD: 50}
MODES = ("off", "on", "on_model")


@dataclass(frozen=True)
class Plan:
    fallback_loads: tuple[float, ...]  # of the secondary's capacity
    kill_at_s: float  # into the outage phase: the primary's upstream is killed
    settle_s: float  # from the kill to the window
    fallback_window_s: float
    unloaded_warm_s: float  # a gateway's first phase: longer (its latency limiter starts)
    unloaded_window_s: float
    overload_warm_s: float
    overload_window_s: float
    drain_s: float  # after the last arrival, until requests still open are cut


QUICK = Plan(
    fallback_loads=(0.05, 0.5),
    kill_at_s=1.0,
    settle_s=1.0,
    fallback_window_s=3.0,
    unloaded_warm_s=6.0,
    unloaded_window_s=5.0,
    overload_warm_s=8.0,
    overload_window_s=8.0,
    drain_s=0.3,
)
FULL = Plan(
    fallback_loads=(0.05, 0.2, 0.5),
    kill_at_s=3.0,
    settle_s=2.0,
    fallback_window_s=15.0,
    unloaded_warm_s=10.0,
    unloaded_window_s=15.0,
    overload_warm_s=15.0,
    overload_window_s=30.0,
    drain_s=2.0,
)


emit = emitter(BENCH, digits=4)


progress = progress_of(BENCH)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def tenant(name: str, priority: str, **extra: Any) -> dict[str, Any]:
    digest = hashlib.sha256(KEYS[name].encode()).hexdigest()
    return {"name": name, "priority": priority, "keys": [{"sha256": digest}], **extra}


def chat(model: str, max_tokens: int, prompt_tokens: int = 1, stream: bool = False) -> str:
    fields: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "w" * (4 * prompt_tokens)}],
        "max_tokens": max_tokens,
    }
    if stream:
        fields |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(fields).decode()


def ask(gateway: Gateway, key: str, body: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[key]}", "Content-Type": "application/json"}
    return httpx.post(gateway.url + CHAT_PATH, content=body, headers=headers, timeout=30)


# --- reading the gateway's and the upstreams' counters ------------------------------------


def counter(text: str, name: str, **labels: str) -> dict[str, float]:
    """A Prometheus counter's samples named `name` (`..._total`) whose labels match, by
    their remaining labels (`k=v,...`; "" for none)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            rest = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in labels)
            found[rest] = found.get(rest, 0.0) + sample.value
    return found


def delta(before: str, after: str, name: str, **labels: str) -> dict[str, float]:
    first, last = counter(before, name, **labels), counter(after, name, **labels)
    return {key: value - first.get(key, 0.0) for key, value in last.items()}


def failed_attempts(before: str, after: str, backend: str) -> float:
    """Upstream attempts of `backend` that failed between two scrapes: each is counted once,
    as retried (`gateway_retries_total`) or given up (`gateway_upstream_errors_total`)."""
    retried = delta(before, after, "gateway_retries_total", backend=backend)
    failed = delta(before, after, "gateway_upstream_errors_total", backend=backend)
    return sum(retried.values()) + sum(failed.values())


def budget_burst(ratio_: float, min_per_s: float) -> int:
    """Retries the budget can pay for at once, however long it saved: its token cap plus a
    full reserve. Asked of the gateway's RetryBudget itself, with its clock stopped."""
    budget = RetryBudget(ratio_, min_per_s, clock=lambda: 0.0)
    for _ in range(math.ceil(1000 / ratio_) if ratio_ else 0):
        budget.on_request()
    spent = 0
    while budget.try_spend():
        spent += 1
    return spent


def budget_allowed(requests: int, seconds: float, traffic: TrafficSettings, burst: int) -> float:
    """Upstream attempts the budget allows `requests` incoming in `seconds`: one each, the
    ratio's share each, the reserve's refill, and what it held at the start."""
    ratio_, min_per_s = traffic.retry_budget_ratio, traffic.retry_min_per_s
    return requests * (1 + ratio_) + min_per_s * seconds + burst


# --- records --------------------------------------------------------------------------------


@dataclass
class Phase:
    result: PhaseResult
    window: tuple[float, float]

    def sent(self, streams: Iterable[int] | None = None) -> list[int]:
        """Indexes of the records sent in the window (of `streams`: all when None)."""
        low, high = self.window
        wanted = None if streams is None else set(streams)
        return [
            i
            for i, r in enumerate(self.result.records)
            if low <= r[1] < high and (wanted is None or r[0] in wanted)
        ]

    def done(self, streams: Iterable[int]) -> list[int]:
        """Indexes of the answers 200 (streams complete) completed in the window."""
        low, high = self.window
        wanted = set(streams)
        return [
            i
            for i, r in enumerate(self.result.records)
            if r[0] in wanted and good(r) and low <= r[1] + r[3] / 1e3 < high
        ]

    def record(self, index: int) -> Record:
        return self.result.records[index]

    def header(self, index: int, position: int = 0) -> str | None:
        kept = self.result.headers
        return kept[index][position] if index < len(kept) else None

    @property
    def seconds(self) -> float:
        return self.window[1] - self.window[0]


def records(phase: Phase, indexes: list[int]) -> list[Record]:
    return [phase.record(i) for i in indexes]


# --- scenario: fallback ----------------------------------------------------------------------


def fallback_config(
    primary_url: str, secondary_url: str, work_dir: Path, name: str
) -> dict[str, Any]:
    def backend(pool: str, url: str, model: str) -> dict[str, Any]:
        return {
            "name": pool,
            "kind": "http",
            "base_url": url + "/v1",
            "models": [model],
            "max_concurrency": overload.CONCURRENCY,
            "concurrency": {"mode": "fixed"},
        }

    return {
        "state": {"url": "memory", "path": str(work_dir / f"state-{name}.json")},
        "cache": {"enabled": False},
        "backends": [
            backend(PRIMARY_POOL, primary_url, PRIMARY),
            backend(SECONDARY_POOL, secondary_url, SECONDARY),
        ],
        "fallbacks": {PRIMARY: [SECONDARY]},
        "tenants": [tenant("client", "interactive")],
    }


@dataclass
class Outage:
    """One load's processes: its gateway and the primary upstream it will lose."""

    load: float
    gateway: Gateway
    primary: ServerProcess


@dataclass
class Counted:
    """The phase's counters: gateway /metrics and the secondary's /_stats, before and after,
    around the whole phase and at the window's edges."""

    metrics: tuple[str, str]
    stats: tuple[dict[str, Any], dict[str, Any]]
    seconds: float  # between the two scrapes around the phase
    window_metrics: tuple[str, str] | None
    window_stats: tuple[dict[str, Any], dict[str, Any]] | None


class FallbackBench:
    def __init__(self, plan: Plan, loadgen: LoadGenerator, secondary: overload.Upstream):
        self.plan = plan
        self.loadgen = loadgen
        self.secondary = secondary
        self.traffic = TrafficSettings()  # the gateways run the defaults
        self.burst = budget_burst(self.traffic.retry_budget_ratio, self.traffic.retry_min_per_s)
        self.summary: dict[float, dict[str, float]] = {}

    def run(self, outages: list[Outage]) -> None:
        for outage in outages:
            direct = self.phase(outage, SECONDARY, kill=None)
            self.report_direct(outage.load, direct)
            down = self.phase(outage, PRIMARY, kill=outage.primary.kill)
            self.report_down(outage, down, direct)

    def phase(
        self, outage: Outage, model: str, kill: Callable[[], None] | None
    ) -> tuple[Phase, Counted]:
        plan = self.plan
        low = plan.kill_at_s + plan.settle_s
        high = low + plan.fallback_window_s
        rate = outage.load * SECONDARY_RPS
        header_s, client_s = FALLBACK_DEADLINE
        stream = StreamSpec(
            "client", KEYS["client"], rate, chat(model, 16), False, header_s, client_s
        )
        gateway = outage.gateway
        edges = {"every_s": high - low, "from_s": low, "to_s": high + 1e-3}
        spec = PhaseSpec(
            gateway.url + CHAT_PATH,
            high,
            high + plan.drain_s + client_s,
            int(outage.load * 1000),  # both modes see the same arrivals
            [stream],
            polls=[
                Poll("metrics", gateway.url + "/metrics", **edges, headers=OPERATOR),
                Poll("stats", self.secondary.url + "/_stats", **edges),
            ],
            headers=[FALLBACK_HEADER],
        )
        metrics_before, stats_before = self.scrape(gateway)
        began = time.monotonic()
        timer = threading.Timer(plan.kill_at_s, kill) if kill is not None else None
        if timer is not None:
            timer.start()
        result = self.loadgen.open(spec)
        if timer is not None:
            timer.join()
        time.sleep(0.2)  # attempts still closing
        metrics_after, stats_after = self.scrape(gateway)
        seconds = time.monotonic() - began
        polled = [text for _, text in result.polls.get("metrics", [])]
        stats = [orjson.loads(text) for _, text in result.polls.get("stats", [])]
        counted = Counted(
            (metrics_before, metrics_after),
            (stats_before, stats_after),
            seconds,
            (polled[0], polled[1]) if len(polled) == 2 else None,
            (stats[0], stats[1]) if len(stats) == 2 else None,
        )
        return Phase(result, (low, high)), counted

    def scrape(self, gateway: Gateway) -> tuple[str, dict[str, Any]]:
        return httpx.get(
            gateway.url + "/metrics", timeout=10, headers=OPERATOR
        ).text, self.secondary.stats()

    def report_direct(self, load: float, measured: tuple[Phase, Counted]) -> None:
        phase, counted = measured
        params = {"scenario": "fallback", "load": load, "mode": "direct"}
        sent = phase.sent()
        ok = [i for i in sent if good(phase.record(i))]
        latencies = [phase.record(i)[3] for i in ok]
        emit("answers_ok_share", ratio(len(ok), len(sent)), "ratio", **params)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        emit("latency_p50_ms", p50, "ms", **params)
        emit("latency_p99_ms", p99, "ms", **params)
        timeouts = sum(1 for r in phase.result.records if r[6])
        emit("client_timeouts", timeouts, "requests", **params)
        if counted.window_stats is not None:
            first, last = counted.window_stats
            attempts = last["attempts"] - first["attempts"]
            emit("upstream_attempts_per_request", ratio(attempts, len(sent)), "ratio", **params)
        self.summary[load] = {"p99": p99}
        progress(
            f"fallback load {load:g} direct: {len(sent)} sent, ok {ratio(len(ok), len(sent)):.3f}, "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, timeouts {timeouts}"
        )

    def report_down(
        self, outage: Outage, measured: tuple[Phase, Counted], direct: tuple[Phase, Counted]
    ) -> None:
        phase, counted = measured
        load = outage.load
        params: dict[str, Any] = {"scenario": "fallback", "load": load, "mode": "primary_down"}
        sent = phase.sent()
        ok = [i for i in sent if good(phase.record(i))]
        fell_back = [i for i in ok if phase.header(i) == SECONDARY]
        ok_share = ratio(len(ok), len(sent))
        emit("answers_ok_share", ok_share, "ratio", **params)
        emit("fallback_answer_share", ratio(len(fell_back), len(ok)), "ratio", **params)
        failed = Counter((r[4], str(r[5])) for r in records(phase, sent) if not good(r))
        for (status, code), count in sorted(failed.items()):
            share = count / len(sent)
            emit("failed_share", share, "ratio", status=status, code=code, **params)
        latencies = [phase.record(i)[3] for i in ok]
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        emit("latency_p50_ms", p50, "ms", **params)
        emit("latency_p99_ms", p99, "ms", **params)
        direct_p99 = self.summary.get(load, {}).get("p99", float("nan"))
        emit("p99_ratio_vs_direct", ratio(p99, direct_p99), "ratio", **params)
        timeouts = sum(1 for r in phase.result.records if r[6])
        emit("client_timeouts", timeouts, "requests", **params)
        within = self.report_attempts(phase, counted, params)
        before, after = counted.metrics
        tried = delta(
            before, after, "gateway_model_fallbacks_total", model=PRIMARY, fallback=SECONDARY
        )
        for labels, times in sorted(tried.items()):
            reason = labels.removeprefix("reason=")
            emit("fallbacks_tried", times, "requests", reason=reason, scope="phase", **params)
        exhausted = delta(
            before, after, "gateway_retry_budget_exhausted_total", backend=PRIMARY_POOL
        )
        emit("retry_budget_exhausted", sum(exhausted.values()), "retries", scope="phase", **params)
        targets = [("all_answers_from_fallback", ok_share >= 0.99 and fell_back == ok)]
        targets += [(f"attempts_within_budget_{scope}", met) for scope, met in within.items()]
        for target, met in targets:
            emit("target_met", int(met), "bool", target=target, scenario="fallback", load=load)
        progress(
            f"fallback load {load:g} primary down: {len(sent)} sent, ok {ok_share:.3f}, "
            f"from fallback {len(fell_back)}/{len(ok)}, p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
            f"timeouts {timeouts}, failed {dict(failed)}, fallbacks tried {tried}, "
            f"budget exhausted {sum(exhausted.values()):g}"
        )

    def report_attempts(
        self, phase: Phase, counted: Counted, params: dict[str, Any]
    ) -> dict[str, bool]:
        """Upstream attempts per request against the budget's allowance, for the window
        and the whole phase; whether each stayed within it."""
        everything = list(range(len(phase.result.records)))
        scopes: list[tuple[str, list[int], tuple[str, str] | None, Any, float]] = [
            ("window", phase.sent(), counted.window_metrics, counted.window_stats, phase.seconds),
            ("phase", everything, counted.metrics, counted.stats, counted.seconds),
        ]
        within: dict[str, bool] = {}
        for scope, indexes, metrics, stats, seconds in scopes:
            if metrics is None or stats is None or not indexes:
                continue
            primary_ok = sum(
                1 for i in indexes if good(phase.record(i)) and phase.header(i) is None
            )
            primary = failed_attempts(*metrics, PRIMARY_POOL) + primary_ok
            secondary = stats[1]["attempts"] - stats[0]["attempts"]
            attempts = primary + secondary
            allowed = budget_allowed(len(indexes), seconds, self.traffic, self.burst)
            where = {
                **params,
                "scope": scope,
                "requests": len(indexes),
                "seconds": round(seconds, 2),
                "retry_budget_ratio": self.traffic.retry_budget_ratio,
                "retry_min_per_s": self.traffic.retry_min_per_s,
                "budget_burst": self.burst,
            }
            per_request = attempts / len(indexes)
            emit("upstream_attempts_per_request", per_request, "ratio", **where)
            emit("primary_attempts_per_request", primary / len(indexes), "ratio", **where)
            emit("secondary_attempts_per_request", secondary / len(indexes), "ratio", **where)
            emit("retry_budget_allowed_per_request", allowed / len(indexes), "ratio", **where)
            within[scope] = attempts <= allowed
            progress(
                f"  {scope}: {attempts:g} attempts ({primary:g} primary, {secondary} secondary)"
                f" for {len(indexes)} requests in {seconds:.1f} s: {per_request:.3f}/request, "
                f"budget allows {allowed / len(indexes):.3f}"
            )
        return within


# --- scenario: degrade ----------------------------------------------------------------------


def bound_rps(params: EngineParams) -> float:
    """The engine's steady-state bound for the mix (requests/s at load-1 shares): the
    most it completes, all its sequences running (fake_engine.steady_capacity per shape)."""
    shapes = [(share, SHAPES[name]) for name, share in SHARES.items()]
    return mix_bound_rps(
        params, [(s, shape.prompt_tokens, shape.max_tokens) for s, shape in shapes]
    )


def offered(load: float) -> dict[str, float]:
    """Each stream's rate as a fraction of capacity: both scaled up to load 1, above it
    batch sends the excess."""
    if load <= 1.0:
        return {name: share * load for name, share in SHARES.items()}
    return {INTERACTIVE: SHARES[INTERACTIVE], BATCH: load - SHARES[INTERACTIVE]}


def engine_backend(name: str, url: str, model: str) -> dict[str, Any]:
    """A backend as deployed in front of vLLM: adaptive concurrency from its metrics."""
    return {
        "name": name,
        "kind": "http",
        "base_url": url + "/v1",
        "models": [model],
        "engine": "vllm",
        "priority_scheduling": True,
    }


def degrade_config(engines: dict[str, str], work_dir: Path, mode: str) -> dict[str, Any]:
    """Mode on_model's gateway also has the cheaper model's backend (its policy must name
    a served model; tenants may use any model); the others have the one engine alone."""
    backends = [engine_backend(GPU, engines[GPU], MODEL)]
    if mode == "on_model":
        backends.append(engine_backend(SMALL, engines[SMALL], SMALL_MODEL))
    policy = {"degrade": DEGRADES[mode]} if mode in DEGRADES else {}
    return {
        "state": {"url": "memory", "path": str(work_dir / f"state-degrade-{mode}.json")},
        "cache": {"enabled": False},
        "backends": backends,
        "tenants": [tenant(INTERACTIVE, "interactive"), tenant(BATCH, "batch", **policy)],
    }


def degrade_streams(rates: dict[str, float]) -> list[StreamSpec]:
    result = []
    for name in STREAMS:
        shape = SHAPES[name]
        body = chat(MODEL, shape.max_tokens, shape.prompt_tokens, shape.stream)
        header_s, client_s = shape.deadline
        result.append(
            StreamSpec(name, KEYS[name], rates[name], body, shape.stream, header_s, client_s)
        )
    return result


def learned(phase: Phase, backend: str = GPU) -> dict[str, float]:
    """The backend's limit, requests in flight and queued: means of /readyz in the window."""
    return learned_means(phase.result.polls.get("readyz", []), *phase.window, backend)


ENGINE_UNITS = {
    "engine_tokens_per_s": "tokens/s",
    "engine_step_ms_mean": "ms",
    "engine_aborted": "requests",
}


def engine_figures(phase: Phase, poll: str = "engine") -> dict[str, float]:
    """What an engine did in the window, from its /_stats at the window's edges (`poll`):
    tokens generated per second (answers no client got included), its mean step time,
    requests it aborted (their clients went away)."""
    polled = phase.result.polls.get(poll, [])
    if len(polled) != 2:
        return {}
    first, last = (orjson.loads(text) for _, text in polled)
    steps = last["busy_steps"] - first["busy_steps"]
    return {
        "engine_tokens_per_s": (last["generation_tokens"] - first["generation_tokens"])
        / (last["clock_s"] - first["clock_s"]),
        "engine_step_ms_mean": ratio(last["busy_s"] - first["busy_s"], steps) * 1000.0,
        "engine_aborted": last["aborted"] - first["aborted"],
    }


def gateway_counts(phase: Phase, action: str = "max_tokens") -> dict[str, float]:
    """The gateway's own counts of batch requests in the window (/metrics at its edges):
    degraded by `action` (when they joined the queue, shed later or not) and shed."""
    polled = phase.result.polls.get("metrics", [])
    if len(polled) != 2:
        return {}
    (_, before), (_, after) = polled
    degraded = delta(before, after, "gateway_degraded_total", tenant=BATCH, action=action)
    shed = delta(before, after, "gateway_shed_total", **{"class": BATCH})
    return {"degraded_requests": sum(degraded.values()), "shed_requests": sum(shed.values())}


def shed_by_backend(phase: Phase) -> dict[str, float]:
    """Batch requests shed in the window, by the backend whose queue refused them."""
    polled = phase.result.polls.get("metrics", [])
    if len(polled) != 2:
        return {}
    (_, before), (_, after) = polled
    found: dict[str, float] = {}
    for labels, count in delta(before, after, "gateway_shed_total", **{"class": BATCH}).items():
        fields_ = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
        backend = fields_.get("backend", "")
        found[backend] = found.get(backend, 0.0) + count
    return found


def served_by(phase: Phase, indexes: list[int], model: str) -> int:
    """Answers whose `x-degraded` header says they were sent to `model`."""
    return sum(1 for i in indexes if f"model={model}" in (phase.header(i) or "").split(", "))


class DegradeBench:
    def __init__(self, plan: Plan, loadgen: LoadGenerator, engines: dict[str, Engine]) -> None:
        self.plan = plan
        self.loadgen = loadgen
        self.engines = engines
        self.bound = bound_rps(EngineParams())
        self.capacity = CAPACITY_OF_BOUND * self.bound
        self.unloaded_p99: dict[str, float] = {}  # by mode
        self.summary: dict[tuple[str, float], dict[str, float]] = {}

    def run(self, gateways: dict[str, Gateway]) -> None:
        bound = round(self.bound, 3)
        emit("capacity_rps", self.capacity, "req/s", scenario="degrade", bound_rps=bound)
        for mode in MODES:
            for load in (UNLOADED, OVERLOAD):
                phase = self.phase(gateways[mode], load, mode)
                self.summary[(mode, load)] = self.report(mode, load, phase)
        for mode in DEGRADES:
            for load in (UNLOADED, OVERLOAD):
                on, off = self.summary[(mode, load)], self.summary[("off", load)]
                gain = ratio(on["tokens"], off["tokens"])
                params = {"scenario": "degrade", "load": load, "mode": mode}
                emit(f"goodput_tokens_ratio_{mode}_vs_off", gain, "ratio", **params)
                progress(f"degrade load {load:g}: token goodput {mode} / off {gain:.3f}")
        for mode in DEGRADES:
            self.targets(mode)

    def engines_of(self, mode: str) -> dict[str, Engine]:
        """The engines mode `mode`'s gateway sends to, by their /_stats poll's name."""
        engines = {"engine": self.engines[GPU]}
        if mode == "on_model":
            engines["small_engine"] = self.engines[SMALL]
        return engines

    def phase(self, gateway: Gateway, load: float, mode: str) -> Phase:
        plan = self.plan
        if load == UNLOADED:
            warm, window = plan.unloaded_warm_s, plan.unloaded_window_s
        else:
            warm, window = plan.overload_warm_s, plan.overload_window_s
        low, high = warm, warm + window
        rates = {name: share * self.capacity for name, share in offered(load).items()}
        engines = self.engines_of(mode)
        spec = PhaseSpec(
            gateway.url + CHAT_PATH,
            high,
            high + plan.drain_s,
            SEEDS[load],
            degrade_streams(rates),
            polls=[
                Poll("readyz", gateway.url + "/readyz", 0.5, low, high, headers=OPERATOR),
                *(
                    Poll(name, engine.url + "/_stats", high - low, low, high + 1e-3)
                    for name, engine in engines.items()
                ),
                Poll(
                    "metrics",
                    gateway.url + "/metrics",
                    high - low,
                    low,
                    high + 1e-3,
                    headers=OPERATOR,
                ),
            ],
            headers=[DEGRADED_HEADER],
        )
        result = self.loadgen.open(spec)
        for engine in engines.values():
            engine.wait_idle()
        wait_gateway_idle(gateway)
        return Phase(result, (low, high))

    def report(self, mode: str, load: float, phase: Phase) -> dict[str, float]:
        params: dict[str, Any] = {"scenario": "degrade", "mode": mode, "load": load}
        index = {name: STREAMS.index(name) for name in STREAMS}
        groups = {"all": list(index.values()), INTERACTIVE: [0], BATCH: [1]}
        tokens: dict[str, float] = {}
        for klass, streams in groups.items():
            done = records(phase, phase.done(streams))
            tokens[klass] = sum(r[7] for r in done) / phase.seconds
            where = {**params, "class": klass}
            emit("goodput_tokens_per_s", tokens[klass], "tokens/s", **where)
            emit("goodput_rps", len(done) / phase.seconds, "req/s", **where)
            sent = records(phase, phase.sent(streams))
            refused = ratio(sum(1 for r in sent if is_refusal(r)), len(sent))
            emit("refused_share", refused, "ratio", **where)
            timeouts = sum(1 for r in phase.result.records if r[0] in streams and r[6])
            emit("client_timeouts", timeouts, "requests", **where)
        batch_done = phase.done([index[BATCH]])
        degraded = sum(1 for i in batch_done if phase.header(i) is not None)
        degraded_share = ratio(degraded, len(batch_done))
        emit("degraded_share", degraded_share, "ratio", **params, **{"class": BATCH})
        small = served_by(phase, batch_done, SMALL_MODEL)
        small_share = ratio(small, len(batch_done))
        emit("served_by_small_share", small_share, "ratio", **params, **{"class": BATCH})
        ttft = [r[2] for r in records(phase, phase.sent([index[INTERACTIVE]])) if good(r)]
        p99 = percentile(ttft, 99)
        if load == UNLOADED:
            self.unloaded_p99[mode] = p99
        p99_ratio = ratio(p99, self.unloaded_p99.get(mode, float("nan")))
        emit("ttft_p99_ms", p99, "ms", **params, **{"class": INTERACTIVE})
        emit("p99_ratio_vs_unloaded", p99_ratio, "ratio", **params, **{"class": INTERACTIVE})
        odd = [r for r in phase.result.records if unexpected(r)]
        emit("other_answers", len(odd), "requests", **params)
        cut = sum(1 for r in phase.result.records if r[5] == "cut")
        emit("unresolved", cut, "requests", **params)
        limits = learned(phase)
        for metric, value in limits.items():
            emit(metric, value, "requests", **params)
        engine = engine_figures(phase)
        for metric, value in engine.items():
            emit(metric, value, ENGINE_UNITS[metric], **params)
        counted = gateway_counts(phase, ACTIONS.get(mode, "max_tokens"))
        for metric, value in counted.items():
            emit(metric, value, "requests", **params, **{"class": BATCH})
        small_figures = self.report_small(phase, params) if mode == "on_model" else ""
        emit("loadgen_lag_p99_ms", phase.result.lag_p99_ms, "ms", **params)
        interactive_timeouts = sum(1 for r in phase.result.records if r[0] == 0 and r[6])
        progress(
            f"degrade {mode} load {load:g}: tokens/s {tokens['all']:.0f} (interactive "
            f"{tokens[INTERACTIVE]:.0f}, batch {tokens[BATCH]:.0f}), degraded "
            f"{degraded}/{len(batch_done)} (to {SMALL_MODEL} {small}), TTFT p99 {p99:.0f} ms "
            f"(x{p99_ratio:.2f}), interactive timeouts {interactive_timeouts}, other {len(odd)}"
            + (f" first {odd[0]}" if odd else "")
            + f", cut {cut}, limit {limits['concurrency_limit_mean']:.1f} (in flight "
            f"{limits['in_flight_mean']:.1f}, queued {limits['queued_mean']:.1f}), engine "
            + ", ".join(f"{k.removeprefix('engine_')} {v:.1f}" for k, v in engine.items())
            + small_figures
            + f", lag p99 {phase.result.lag_p99_ms:.1f} ms"
        )
        return {"tokens": tokens["all"], "p99_ratio": p99_ratio, "timeouts": interactive_timeouts}

    def report_small(self, phase: Phase, params: dict[str, Any]) -> str:
        """The cheaper model's side (backend `small`): its limit and queue, what its engine
        did, and the batch requests shed by each backend's queue. A progress fragment."""
        where = {**params, "backend": SMALL}
        limits = learned(phase, SMALL)
        for metric, value in limits.items():
            emit(metric, value, "requests", **where)
        engine = engine_figures(phase, "small_engine")
        for metric, value in engine.items():
            emit(metric, value, ENGINE_UNITS[metric], **where)
        shed = shed_by_backend(phase)
        for backend, count in sorted(shed.items()):
            emit("shed_requests", count, "requests", **params, backend=backend, **{"class": BATCH})
        return (
            f"; {SMALL}: limit {limits['concurrency_limit_mean']:.1f} (in flight "
            f"{limits['in_flight_mean']:.1f}, queued {limits['queued_mean']:.1f}), engine "
            + ", ".join(f"{k.removeprefix('engine_')} {v:.1f}" for k, v in engine.items())
            + f", shed by backend {shed}"
        )

    def targets(self, mode: str) -> None:
        on, off = self.summary[(mode, OVERLOAD)], self.summary[("off", OVERLOAD)]
        checks = [
            ("goodput_tokens_above_off", on["tokens"] > off["tokens"]),
            ("interactive_ttft_p99_within_2x_unloaded", on["p99_ratio"] <= 2),
            ("zero_interactive_client_timeouts", on["timeouts"] == 0),
        ]
        for target, met in checks:
            where = {"scenario": "degrade", "load": OVERLOAD, "mode": mode}
            emit("target_met", int(met), "bool", target=target, **where)
            progress(f"target {target} (degrade {mode}, load 5): {'met' if met else 'MISSED'}")


# --- main -----------------------------------------------------------------------------------


def check_answers(outages: list[Outage], degrade: dict[str, Gateway]) -> None:
    """One request per model and tenant, so that a misconfiguration fails loudly, not fast."""
    for outage in outages:
        for model in (PRIMARY, SECONDARY):
            answer = ask(outage.gateway, "client", chat(model, 4))
            if answer.status_code != 200 or FALLBACK_HEADER in answer.headers:
                raise RuntimeError(f"fallback/{model}: {answer.status_code} {answer.text[:300]}")
    for mode, gateway in degrade.items():
        asks = [(name, MODEL) for name in STREAMS]
        if mode == "on_model":
            asks.append((BATCH, SMALL_MODEL))  # the cheaper model's backend answers too
        for name, model in asks:
            answer = ask(gateway, name, chat(model, 4, stream=SHAPES[name].stream))
            if answer.status_code != 200 or b'"usage"' not in answer.content:
                raise RuntimeError(
                    f"degrade {mode}/{name}/{model}: {answer.status_code} {answer.text}"
                )


def measure(plan: Plan, scenarios: set[str], work_dir: Path, servers: list[ServerProcess]) -> None:
    gateways: dict[str, Gateway] = {}
    loadgen = LoadGenerator()
    try:
        configs: dict[str, dict[str, Any]] = {}
        primaries: dict[float, ServerProcess] = {}
        secondary: overload.Upstream | None = None
        engines: dict[str, Engine] = {}
        if "fallback" in scenarios:
            server, secondary_url = overload.start_upstream(work_dir)
            servers.append(server)
            secondary = overload.Upstream(secondary_url)
            for load in plan.fallback_loads:
                primary, primary_url = overload.start_upstream(work_dir)
                servers.append(primary)
                primaries[load] = primary
                name = f"fallback-{load:g}"
                configs[name] = fallback_config(primary_url, secondary_url, work_dir, name)
        if "degrade" in scenarios:
            engines = {GPU: Engine(work_dir), SMALL: Engine(work_dir, SMALL_ENGINE)}
            servers += [engine.server for engine in engines.values()]
            urls = {name: engine.url for name, engine in engines.items()}
            for mode in MODES:
                configs[f"degrade-{mode}"] = degrade_config(urls, work_dir, mode)
        gateways.update(overload.start_all(configs, work_dir))
        outages = [
            Outage(load, gateways[f"fallback-{load:g}"], primary)
            for load, primary in primaries.items()
        ]
        degrade = {mode: gateways[f"degrade-{mode}"] for mode in MODES if engines}
        check_answers(outages, degrade)
        loadgen.start()
        progress(f"{len(gateways)} gateways up")
        if secondary is not None:
            FallbackBench(plan, loadgen, secondary).run(outages)
        if engines:
            for engine in engines.values():
                engine.wait_idle()
            DegradeBench(plan, loadgen, engines).run(degrade)
    finally:
        loadgen.stop()
        for gateway in gateways.values():
            gateway.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases, about 2 minutes")
    parser.add_argument(
        "--scenarios", default="fallback,degrade", help="comma-separated: fallback, degrade"
    )
    args = parser.parse_args(argv)
    scenarios = set(args.scenarios.split(",")) & {"fallback", "degrade"}
    if not scenarios:
        parser.error(f"--scenarios: none of {args.scenarios!r} is fallback or degrade")
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-workload-shapes-") as tmp:
        servers: list[ServerProcess] = []
        try:
            measure(QUICK if args.quick else FULL, scenarios, Path(tmp), servers)
        finally:
            for server in servers:
                server.stop()
    progress("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
