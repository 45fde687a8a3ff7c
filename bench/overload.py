"""Overload: what the gateway's traffic control (fair queue, shedding, retry budget) buys
in front of an upstream of known, fixed capacity.

Set-up, all real processes on loopback:

- the upstream (bench/capacity_upstream.py): at most C = 4 requests at once, each served in
  exactly S = 80 ms, so its capacity is C / S = 50 requests per second; the excess waits
  in its own unbounded FIFO queue, as in front of a GPU model server; a request whose
  client goes away is dropped there (as vLLM does). Rates are low on purpose: the gateway,
  the upstream and the load generator share a small machine.
- three tenants, all of weight 1, all sending the same small chat request (max_tokens 16,
  so the fair queue's token counters move in step with request counts):
    interactive  priority interactive, 30% of capacity at every load
    batch        priority batch, 50% of capacity at every load (10% when unloaded)
    noisy        priority batch (`noisy_class`), whose fair share is the 20% left over:
                 it sends the rest of the offered load, (load - 0.8) x capacity: 6x its
                 share at load 2, 10x at 2.8, 21x at 5 (10% of capacity when unloaded)
  `load` is the total offered rate as a multiple of capacity: 0.5 ("unloaded", the
  baseline for p99_ratio_vs_unloaded), then 2 and 5 (and 2.8 in the full run). Arrivals
  are open-loop Poisson (bench/loadgen.py's open loop, its own process; the same arrival
  times in both modes): refused requests are not retried, so the offered load stays put.
  A seed's arrival times changed on 2026-12-06, with the move to the shared load
  generator: each tenant's now come from its own generator, seeded with (seed, its index),
  where before all three were drawn from one; runs from before that date saw other ones.
- deadlines, by class: interactive requests send `x-request-timeout: 1` and give up at
  1.25 s; batch-class ones send 2 and give up at 2.5 s. A client timeout therefore means
  the gateway neither answered nor refused within the deadline it was given.
- `mode`: `on` is the gateway as deployed: backend `max_concurrency: 4` (= C, so the queue
  is the gateway's, ordered by class then by the tenants' virtual token counters, shed on
  arrival when the expected wait exceeds half the time to the deadline, dropped early once
  a waiter's expected wait grows past its deadline, dropped at the deadline as a last
  resort), default `traffic:` settings. `off` is shedding and fairness taken out, emulated (the
  configuration has no switch for it): `max_concurrency: 4096`, so the gateway dispatches
  every request at once and never queues, and no `x-request-timeout` header (with class
  deadlines of an hour), so it has no deadline to shed against either (with the header it
  still refuses once its service-time estimate, which then includes the upstream's queue,
  exceeds the deadline). The queue is then the upstream's: first come first served, blind
  to tenants, classes and deadlines. `adaptive` is the gateway with the backend's default
  concurrency settings (learned from latency, `engine: none`, nothing configured), as a
  user who knows nothing of the upstream's 4 slots runs it. The clients give up at the same
  times in every mode. The gateways run side by side against the same upstream, their
  phases interleaved.

Metrics, for each `load` and `mode`, by `tenant` (with its `class`), by class (`tenant`
"all") and overall (`tenant` and `class` "all"); requests are those sent during the
measured window, after a warm-up that lets the queues fill:

    goodput_ratio            answers 200 completed in the window, per second / capacity
    latency_p50_ms, _p99_ms  of the admitted requests that were answered 200
    p99_ratio_vs_unloaded    latency_p99_ms / the same group's at load 0.5, same mode
    refused_share            answered 503 (shed: `overloaded`; circuit open:
                             `backend_unavailable`) or 429 (quota), of requests sent
    refusal_latency_p99_ms   how long those refusals took to arrive (from sending the
                             request to reading the whole answer); for tenants and
                             overall also by `reason` (the error code, with the shed
                             reason for the gateway's `overloaded:...`), with
    refusal_reason_share     the share of the refusals for each reason
    client_timeouts          requests given up by the client: every request of the phase,
                             warm-up included (target 0)
    offered_ratio            what was really sent in the window / capacity

and overall only:

    jain_fairness            Jain's index (sum x)^2 / (n sum x^2) over the three tenants
                             (equal weights), x = a tenant's goodput / its max-min fair
                             share of the goodput delivered in total (water-filling by
                             offered rate: a tenant asking less than an equal split gets
                             all it asks). 1.0: each got its fair share of what was
                             served; class priority is ignored in the fair share, so a
                             starved batch class shows here. Efficiency is goodput_ratio's.
    upstream_utilisation     busy slot-time / (C x window), measured by the upstream
    upstream_service_ms_mean its real mean service time in the window (S plus timer lag)
    upstream_served_ratio    requests it served in the window, per second / capacity
    upstream_wasted_share    of the requests it served in the phase, those whose answer
                             no client got (it had given up)
    upstream_abandoned       requests it dropped because their connection closed
    upstream_max_queued      the longest its own queue got
    other_answers            requests of the phase, warm-up included, that got neither an
                             answer 200, a refusal nor a client timeout: another status or
                             no answer (status 0); in all (`status` and `code` "all") and,
                             when there are any, by status and error `code` (mode off's
                             504s, say: a figure of that uncontrolled mode, not a failed run)
    gateway_cpu_cores        the gateway's CPU seconds per second in the window
    loadgen_lag_p99_ms       how late arrivals left the load generator

In the full run, an extra scenario moves the noisy tenant into the interactive class
(`noisy_class` interactive, its requests with the interactive deadline), mode on only, at
loads 0.5 and 5: the interactive tenant then has to be protected by the fair queue
within its class, not by class priority.

Then the retry storm: one tenant at 80% of capacity while the upstream answers 503 at once
to a fraction `failure_rate` (0.1, 0.5, 0.9, 1.0) of attempts, drawn at random:

    attempts_per_request        upstream attempts / incoming requests
    naive_attempts_per_request  what 3 attempts without a budget would cost: 1 + f + f^2
    success_share               incoming requests answered 200
    client_timeouts             as above
    other_answers               as above, in all and by status and code

with `retry_budget_ratio` 0.1 and `breaker` false (the budget alone, comparable to the
SRE book's 10% budget: ~3x down to ~1.1x), and the deployed defaults (0.2, breaker on; at
failure rate 0.5 only in the quick run, at all four in the full one). Besides the ratio
the budget keeps a hard-wired reserve of 3 retries per second (gateway/traffic/retry.py), which
adds about 3 / 40 = 0.075 attempts per request at this rate, more in short phases (it
starts full).

Last, `target_met` lines (1 or 0) for the issue's targets at load 5, modes on and adaptive: the
interactive tenant's p99 within 2x its unloaded p99, goodput at least 90% of capacity,
refusals in under 50 ms p99, no client timeouts, fairness index at least 0.95.

    python bench/overload.py            # about four minutes
    python bench/overload.py --quick    # the same scenarios, shorter phases, under a minute

JSON lines only on stdout, progress on stderr. Exits 0 once the figures are printed,
whatever they are (other_answers counts the unexpected ones); non-zero only when it could
not measure (a server that did not start, a load generator that died).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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

from bench.loadgen import LoadGenerator, PhaseResult, PhaseSpec, Record, StreamSpec  # noqa: E402
from bench.measure import cpu_seconds, percentile  # noqa: E402
from bench.processes import (  # noqa: E402
    Gateway,
    ServerProcess,
    free_port,
    start_gateway,
    unwind_on_sigterm,
)
from bench.report import emitter, progress_of  # noqa: E402

BENCH = "overload"
CONCURRENCY = 4
SERVICE_S = 0.080
CAPACITY_RPS = CONCURRENCY / SERVICE_S
MODEL = "capacity"
BODY = orjson.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
).decode()
CHAT_PATH = "/chat/completions"
UNLOADED = 0.5
STORM_LOAD = 0.8
FAILURE_RATES = (0.1, 0.5, 0.9, 1.0)
OFF_CONCURRENCY = 4096
TENANTS = ("interactive", "batch", "noisy")
KEYS = {name: f"sk-bench-{name}-" + "0" * 32 for name in TENANTS}
# (x-request-timeout, client timeout) by class
DEADLINES = {"interactive": (1.0, 1.25), "batch": (2.0, 2.5)}
# How long after its last arrival a phase waits: well past the longest client timeout, so
# that every request ends on its own (answered, refused or given up), none is cut.
CUTOFF_AFTER_S = 5.0 + max(client_s for _, client_s in DEADLINES.values())


@dataclass(frozen=True)
class Plan:
    warm_s: float  # overload phases: not measured, lets the queues fill
    measure_s: float
    unloaded_warm_s: float
    unloaded_measure_s: float
    loads: tuple[float, ...]
    storm_s: float
    default_storm_rates: tuple[float, ...]  # failure rates also run with the defaults
    noisy_interactive_loads: tuple[float, ...]  # the extra scenario: noisy in class interactive


FULL = Plan(
    warm_s=4.0,
    measure_s=12.0,
    unloaded_warm_s=1.0,
    unloaded_measure_s=8.0,
    loads=(2.0, 2.8, 5.0),
    storm_s=8.0,
    default_storm_rates=FAILURE_RATES,
    noisy_interactive_loads=(UNLOADED, 5.0),
)
QUICK = Plan(
    warm_s=1.5,
    measure_s=2.5,
    unloaded_warm_s=0.5,
    unloaded_measure_s=2.0,
    loads=(2.0, 5.0),
    storm_s=2.0,
    default_storm_rates=(0.5,),
    noisy_interactive_loads=(),
)


def jain(values: list[float]) -> float:
    if not values or not any(values):
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def max_min_shares(demands: dict[str, float], total: float) -> dict[str, float]:
    """Water-filling: each tenant gets min(its demand, an equal split of what is left)."""
    shares: dict[str, float] = {}
    left = total
    ordered = sorted(demands.items(), key=lambda item: item[1])
    for index, (name, demand) in enumerate(ordered):
        share = min(demand, left / (len(ordered) - index))
        shares[name] = share
        left -= share
    return shares


emit = emitter(BENCH, digits=4)


progress = progress_of(BENCH)


# --- processes ---------------------------------------------------------------------------


def start_upstream(work_dir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "bench.capacity_upstream",
        "--port",
        str(port),
        "--concurrency",
        str(CONCURRENCY),
        "--service-ms",
        str(SERVICE_S * 1000.0),
    ]
    server = ServerProcess(
        command, f"http://127.0.0.1:{port}/v1/models", work_dir / f"capacity-{port}.log"
    ).start()
    return server, f"http://127.0.0.1:{port}"


def gateway_config(
    upstream_url: str,
    work_dir: Path,
    name: str,
    *,
    max_concurrency: int | None,
    noisy_class: str = "batch",
    **traffic: Any,
) -> dict[str, Any]:
    """`max_concurrency` None: the backend's default (learned) concurrency."""
    classes = {"interactive": "interactive", "batch": "batch", "noisy": noisy_class}
    fixed = {"max_concurrency": max_concurrency, "concurrency": {"mode": "fixed"}}
    return {
        "state": {"url": "memory", "path": str(work_dir / f"state-{name}.json")},
        "cache": {"enabled": False},
        "backends": [
            {
                "name": "gpu",
                "kind": "http",
                "base_url": upstream_url + "/v1",
                "models": [MODEL],
                **(fixed if max_concurrency is not None else {}),
            }
        ],
        "tenants": [
            {
                "name": tenant,
                "priority": classes[tenant],
                "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}],
            }
            for tenant, key in KEYS.items()
        ],
        "traffic": traffic,
    }


def start_all(configs: dict[str, dict[str, Any]], work_dir: Path) -> dict[str, Gateway]:
    """Starts the gateways side by side (each start waits for its /healthz)."""
    started: dict[str, Gateway] = {}
    errors: list[BaseException] = []

    def one(name: str, config: dict[str, Any]) -> None:
        try:
            started[name] = start_gateway(config, work_dir)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=item) for item in configs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for gateway in started.values():
            gateway.stop()
        raise errors[0]
    return started


class Upstream:
    def __init__(self, url: str) -> None:
        self.url = url

    def reset(self, fail_rate: float = 0.0) -> None:
        answer = httpx.post(
            self.url + "/_control", json={"fail_rate": fail_rate, "reset": True}, timeout=10
        )
        answer.raise_for_status()
        time.sleep(SERVICE_S * 1.5)  # requests in service before the reset finish uncounted

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/_stats", timeout=10).json())


def check_answers(gateways: dict[str, Gateway]) -> None:
    """One request per tenant and gateway, so a misconfiguration fails loudly, not fast."""
    for name, gateway in gateways.items():
        for tenant, key in KEYS.items():
            answer = httpx.post(
                gateway.base_url + CHAT_PATH,
                content=BODY,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                timeout=10,
            )
            if answer.status_code != 200 or "usage" not in answer.json():
                raise RuntimeError(f"{name}/{tenant}: {answer.status_code} {answer.text}")


# --- the overload scenario -----------------------------------------------------------------


def offered(load: float) -> dict[str, float]:
    """Each tenant's rate as a fraction of capacity."""
    if load == UNLOADED:
        return {"interactive": 0.3, "batch": 0.1, "noisy": 0.1}
    return {"interactive": 0.3, "batch": 0.5, "noisy": load - 0.8}


def streams(rates: dict[str, float], classes: dict[str, str], header: bool) -> list[StreamSpec]:
    result = []
    for tenant, rate in rates.items():
        header_s, client_s = DEADLINES[classes[tenant]]
        rps = rate * CAPACITY_RPS
        sent_s = header_s if header else None
        result.append(StreamSpec(tenant, KEYS[tenant], rps, BODY, False, sent_s, client_s))
    return result


def phase_spec(url: str, seconds: float, seed: int, streams: list[StreamSpec]) -> PhaseSpec:
    return PhaseSpec(url, seconds, seconds + CUTOFF_AFTER_S, seed, streams)


class WindowProbe:
    """Snapshots of the upstream's counters and the gateway's CPU time at the start and the
    end of the measured window, taken from a thread while the load generator runs."""

    def __init__(self, upstream: Upstream, gateway_pid: int, window: tuple[float, float]):
        self.upstream = upstream
        self.pid = gateway_pid
        self.window = window
        self.snapshots: list[tuple[dict[str, Any], float, float]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WindowProbe:
        self.thread.start()
        return self

    def _run(self) -> None:
        began = time.monotonic()
        for at in self.window:
            time.sleep(max(0.0, began + at - time.monotonic()))
            self.snapshots.append((self.upstream.stats(), cpu_seconds(self.pid), time.monotonic()))

    def results(self) -> dict[str, float]:
        self.thread.join()
        if len(self.snapshots) < 2:
            return {}
        (first, cpu0, t0), (last, cpu1, t1) = self.snapshots
        seconds = last["clock_s"] - first["clock_s"]
        busy = last["busy_s_total"] - first["busy_s_total"]
        served = last["served_total"] - first["served_total"]
        return {
            "upstream_utilisation": busy / (CONCURRENCY * seconds),
            "upstream_service_ms_mean": busy / served * 1000.0 if served else float("nan"),
            "upstream_served_ratio": served / seconds / CAPACITY_RPS,
            "gateway_cpu_cores": (cpu1 - cpu0) / (t1 - t0),
        }


@dataclass
class Phase:
    records: list[Record]
    tenants: list[str]
    window: tuple[float, float]
    result: PhaseResult
    upstream: dict[str, Any]
    window_stats: dict[str, float]

    def of(self, tenants: Iterable[str], *, windowed: bool = True) -> list[Record]:
        wanted = {self.tenants.index(t) for t in tenants}
        low, high = self.window
        return [
            r
            for r in self.records
            if r.stream in wanted and (not windowed or low <= r.sent_s < high)
        ]

    def goodput_rps(self, tenants: Iterable[str]) -> float:
        """Answers 200 that completed inside the window, per second."""
        low, high = self.window
        done = [
            r
            for r in self.of(tenants, windowed=False)
            if r.status == 200 and low <= r.sent_s + r.latency_ms / 1e3 < high
        ]
        return len(done) / (high - low)


def by_reason(records: list[Record]) -> dict[str, list[float]]:
    """Refusal latencies by reason (error code, with the shed reason for `overloaded`)."""
    reasons: dict[str, list[float]] = {}
    for r in records:
        if is_refusal(r):
            reasons.setdefault(str(r.code), []).append(r.latency_ms)
    return reasons


def is_refusal(record: Record) -> bool:
    return record.status in (429, 503)


def unexpected(record: Record) -> bool:
    return record.status not in (200, 429, 503) and not record.timed_out


def report_other_answers(records: list[Record], **params: Any) -> list[Record]:
    """Emits `other_answers` (in all, then by status and code); returns those records."""
    odd = [r for r in records if unexpected(r)]
    emit("other_answers", len(odd), "requests", status="all", code="all", **params)
    counts = Counter((r.status, str(r.code)) for r in odd)
    for (status, code), count in sorted(counts.items()):
        emit("other_answers", count, "requests", status=status, code=code, **params)
    return odd


class Scenario:
    def __init__(
        self,
        plan: Plan,
        loadgen: LoadGenerator,
        upstream: Upstream,
        gateways: dict[str, Gateway],
        noisy_class: str,
    ) -> None:
        self.plan = plan
        self.loadgen = loadgen
        self.upstream = upstream
        self.gateways = gateways  # by mode
        self.noisy_class = noisy_class
        self.classes = {"interactive": "interactive", "batch": "batch", "noisy": noisy_class}
        self.unloaded_p99: dict[tuple[str, str], float] = {}  # (mode, tenant or class)
        self.summary: dict[tuple[float, str], dict[str, float]] = {}

    def run(self, loads: Iterable[float]) -> None:
        for load in loads:
            for mode, gateway in self.gateways.items():
                self.report(load, mode, self.phase(load, mode, gateway))

    def phase(self, load: float, mode: str, gateway: Gateway) -> Phase:
        plan = self.plan
        if load == UNLOADED:
            warm, measure = plan.unloaded_warm_s, plan.unloaded_measure_s
        else:
            warm, measure = plan.warm_s, plan.measure_s
        self.upstream.reset()
        spec = phase_spec(
            gateway.base_url + CHAT_PATH,
            warm + measure,
            int(load * 100),  # both modes see the same arrivals
            streams(offered(load), self.classes, header=mode != "off"),
        )
        assert gateway.server.process is not None
        probe = WindowProbe(self.upstream, gateway.server.process.pid, (warm, warm + measure))
        probe.start()
        result = self.loadgen.open(spec)
        return Phase(
            result.records,
            [s.tenant for s in spec.streams],
            (warm, warm + measure),
            result,
            self.upstream.stats(),
            probe.results(),
        )

    def report(self, load: float, mode: str, phase: Phase) -> None:
        common = {"load": load, "mode": mode, "noisy_class": self.noisy_class}
        groups: list[tuple[str, str, list[str]]] = [
            (tenant, self.classes[tenant], [tenant]) for tenant in TENANTS
        ]
        for klass in ("interactive", "batch"):
            members = [t for t in TENANTS if self.classes[t] == klass]
            if members:
                groups.append(("all", klass, members))
        groups.append(("all", "all", list(TENANTS)))
        summary: dict[str, float] = {}
        for tenant, klass, members in groups:
            params = {"tenant": tenant, "class": klass, **common}
            summary.update(self.report_group(load, mode, phase, members, params))
        goodputs = {t: phase.goodput_rps([t]) for t in TENANTS}
        low, high = phase.window
        demands = {t: len(phase.of([t])) / (high - low) for t in TENANTS}
        shares = max_min_shares(demands, sum(goodputs.values()))
        fairness = jain([goodputs[t] / shares[t] for t in TENANTS if shares[t] > 0])
        overall = {"tenant": "all", "class": "all", **common}
        emit("jain_fairness", fairness, "ratio", **overall)
        served = phase.upstream["served"]
        answered = sum(1 for r in phase.records if r.status == 200)
        wasted = max(0, served - answered) / served if served else float("nan")
        emit("upstream_wasted_share", wasted, "ratio", **overall)
        emit("upstream_max_queued", phase.upstream["max_queued"], "requests", **overall)
        abandoned = phase.upstream["abandoned_queued"] + phase.upstream["abandoned_running"]
        emit("upstream_abandoned", abandoned, "requests", **overall)
        emit("loadgen_lag_p99_ms", phase.result.lag_p99_ms, "ms", **overall)
        for metric, value in phase.window_stats.items():
            unit = "ms" if metric.endswith("_ms") else "cores" if "cores" in metric else "ratio"
            emit(metric, value, unit, **overall)
        reasons = by_reason(phase.of(TENANTS))
        summary["jain"] = fairness
        self.summary[(load, mode)] = summary
        odd = report_other_answers(phase.records, **overall)
        if odd:
            progress(f"  {len(odd)} other answers (not 200, 429, 503), first: {odd[0]}")
        progress(
            f"load {load:g} mode {mode}: goodput {summary['goodput:all']:.3f}, "
            f"interactive p99 {summary['p99:interactive']:.1f} ms, "
            f"refused {summary['refused:all']:.3f} "
            f"(p99 {summary['refusal_p99:all']:.1f} ms), "
            f"timeouts {summary['timeouts:all']:.0f}, jain {fairness:.3f}, "
            f"upstream max queue {phase.upstream['max_queued']}, "
            f"wasted {wasted:.2f}, abandoned {abandoned}, "
            f"lag p99 {phase.result.lag_p99_ms:.1f} ms, "
            + ", ".join(f"{k} {v:.3f}" for k, v in phase.window_stats.items())
            + ", refusals: "
            + ", ".join(
                f"{k} {len(v)} (p99 {percentile(v, 99):.0f} ms)" for k, v in sorted(reasons.items())
            )
        )

    def report_group(
        self, load: float, mode: str, phase: Phase, members: list[str], params: dict[str, Any]
    ) -> dict[str, float]:
        tenant, klass = params["tenant"], params["class"]
        name = tenant if tenant != "all" else "all" if klass == "all" else f"class:{klass}"
        sent = phase.of(members)
        ok = [r.latency_ms for r in sent if r.status == 200]
        refused = [r.latency_ms for r in sent if is_refusal(r)]
        timeouts = sum(1 for r in phase.of(members, windowed=False) if r.timed_out)
        low, high = phase.window
        goodput = phase.goodput_rps(members) / CAPACITY_RPS
        p50, p99 = percentile(ok, 50), percentile(ok, 99)
        if load == UNLOADED:
            self.unloaded_p99[(mode, name)] = p99
        baseline = self.unloaded_p99.get((mode, name), float("nan"))
        refused_share = len(refused) / len(sent) if sent else float("nan")
        refusal_p99 = percentile(refused, 99)
        if tenant != "all" or klass == "all":
            reasons = by_reason(sent)
            for reason, latencies in sorted(reasons.items()):
                share = len(latencies) / len(refused)
                emit("refusal_reason_share", share, "ratio", reason=reason, **params)
                p99_reason = percentile(latencies, 99)
                emit("refusal_latency_p99_ms", p99_reason, "ms", reason=reason, **params)
        emit("goodput_ratio", goodput, "ratio", **params)
        emit("latency_p50_ms", p50, "ms", **params)
        emit("latency_p99_ms", p99, "ms", **params)
        emit(
            "p99_ratio_vs_unloaded", p99 / baseline if baseline else float("nan"), "ratio", **params
        )
        emit("refused_share", refused_share, "ratio", **params)
        emit("refusal_latency_p99_ms", refusal_p99, "ms", **params)
        emit("client_timeouts", timeouts, "requests", **params)
        emit("offered_ratio", len(sent) / (high - low) / CAPACITY_RPS, "ratio", **params)
        return {
            f"goodput:{name}": goodput,
            f"p99:{name}": p99,
            f"p99_ratio:{name}": p99 / baseline if baseline else float("nan"),
            f"refused:{name}": refused_share,
            f"refusal_p99:{name}": refusal_p99,
            f"timeouts:{name}": timeouts,
        }

    def targets(self) -> None:
        for mode in ("on", "adaptive"):
            self.targets_of(mode)

    def targets_of(self, mode: str) -> None:
        summary = self.summary.get((5.0, mode))
        if summary is None:
            return
        checks: list[tuple[str, Callable[[], bool]]] = [
            ("interactive_p99_within_2x_unloaded", lambda: summary["p99_ratio:interactive"] <= 2),
            ("goodput_at_least_0.9", lambda: summary["goodput:all"] >= 0.9),
            ("refusal_p99_under_50ms", lambda: summary["refusal_p99:all"] < 50),
            ("zero_client_timeouts", lambda: summary["timeouts:all"] == 0),
            ("jain_at_least_0.95", lambda: summary["jain"] >= 0.95),
        ]
        for target, check in checks:
            met = check()
            emit(
                "target_met",
                int(met),
                "bool",
                target=target,
                load=5.0,
                mode=mode,
                noisy_class=self.noisy_class,
            )
            state = "met" if met else "MISSED"
            progress(f"target {target} ({mode}, noisy {self.noisy_class}): {state}")


# --- the retry storm -----------------------------------------------------------------------


def retry_storm(
    loadgen: LoadGenerator,
    upstream: Upstream,
    gateway: Gateway,
    rates: Iterable[float],
    seconds: float,
    ratio: float,
    breaker: bool,
    seed: int,
) -> None:
    header_s, client_s = DEADLINES["interactive"]
    for failure_rate in rates:
        upstream.reset(failure_rate)
        key, rate = KEYS["interactive"], STORM_LOAD * CAPACITY_RPS
        stream = StreamSpec("interactive", key, rate, BODY, False, header_s, client_s)
        seed += 1
        result = loadgen.open(phase_spec(gateway.base_url + CHAT_PATH, seconds, seed, [stream]))
        stats = upstream.stats()
        incoming = len(result.records)
        params = {
            "failure_rate": failure_rate,
            "retry_budget_ratio": ratio,
            "breaker": breaker,
            "load": STORM_LOAD,
        }
        attempts = stats["attempts"] / incoming if incoming else float("nan")
        naive = 1 + failure_rate + failure_rate**2
        success = sum(1 for r in result.records if r.status == 200) / incoming if incoming else 0.0
        timeouts = sum(1 for r in result.records if r.timed_out)
        emit("attempts_per_request", attempts, "ratio", **params)
        emit("naive_attempts_per_request", naive, "ratio", **params)
        emit("success_share", success, "ratio", **params)
        emit("client_timeouts", timeouts, "requests", **params)
        odd = report_other_answers(result.records, **params)
        progress(
            f"retry storm f={failure_rate} ratio={ratio} breaker={breaker}: "
            f"{stats['attempts']} attempts / {incoming} requests = {attempts:.3f} "
            f"(naive {naive:.2f}), success {success:.3f}, timeouts {timeouts}"
            + (f", {len(odd)} other answers, first {odd[0]}" if odd else "")
        )
    upstream.reset(0.0)


# --- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases, under a minute")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    unwind_on_sigterm()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        work_dir = Path(tmp)
        server: ServerProcess | None = None
        gateways: dict[str, Gateway] = {}
        loadgen = LoadGenerator()
        try:
            server, upstream_url = start_upstream(work_dir)
            upstream = Upstream(upstream_url)
            configs = {
                "on": gateway_config(upstream_url, work_dir, "on", max_concurrency=CONCURRENCY),
                "adaptive": gateway_config(
                    upstream_url, work_dir, "adaptive", max_concurrency=None
                ),
                "off": gateway_config(
                    upstream_url,
                    work_dir,
                    "off",
                    max_concurrency=OFF_CONCURRENCY,
                    deadline_s={"interactive": 3600.0, "batch": 3600.0},
                ),
                "storm": gateway_config(
                    upstream_url,
                    work_dir,
                    "storm",
                    max_concurrency=CONCURRENCY,
                    breaker=False,
                    retry_budget_ratio=0.1,
                ),
            }
            if plan.noisy_interactive_loads:
                configs["on-noisy-interactive"] = gateway_config(
                    upstream_url,
                    work_dir,
                    "on-ni",
                    max_concurrency=CONCURRENCY,
                    noisy_class="interactive",
                )
            gateways = start_all(configs, work_dir)
            check_answers(gateways)
            progress(f"upstream {upstream_url} ({CAPACITY_RPS:g} req/s), gateways up")
            emit(
                "capacity_rps",
                CAPACITY_RPS,
                "req/s",
                concurrency=CONCURRENCY,
                service_ms=SERVICE_S * 1000,
            )
            loadgen.start()
            scenarios = [
                Scenario(
                    plan,
                    loadgen,
                    upstream,
                    {mode: gateways[mode] for mode in ("on", "adaptive", "off")},
                    "batch",
                )
            ]
            scenarios[0].run((UNLOADED, *plan.loads))
            if plan.noisy_interactive_loads:
                on = gateways["on-noisy-interactive"]
                scenarios.append(Scenario(plan, loadgen, upstream, {"on": on}, "interactive"))
                scenarios[1].run(plan.noisy_interactive_loads)
            storm = gateways["storm"]
            retry_storm(loadgen, upstream, storm, FAILURE_RATES, plan.storm_s, 0.1, False, 200)
            retry_storm(
                loadgen,
                upstream,
                gateways["on"],
                plan.default_storm_rates,
                plan.storm_s,
                0.2,
                True,
                300,
            )
            for scenario in scenarios:
                scenario.targets()
        finally:
            loadgen.stop()
            for gateway in gateways.values():
                gateway.stop()
            if server is not None:
                server.stop()
    progress(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
