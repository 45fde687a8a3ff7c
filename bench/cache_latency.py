"""Semantic cache latency: hits through the gateway vs a direct call, and lookup throughput.

Through the gateway (`level: gateway`): starts the fake upstream (bench/fake_upstream.py,
model `echo`) and a gateway with the cache on (the `memory` state store, so a
`LocalCacheStore` snapshotted to `<cache.path>/entries.bin`, and the default lookup budget
of 50 ms: past it, or when the embedder could not embed the prompt within it, a lookup
fails open, and `cache_wait_p99_ms` shows whether any request waited longer).
With `--embedder onnx,torch` the gateway phase runs once per embedder backend (`embedder`
in each line: gateway/settings.py `cache.embedder`), one after the other, on the same
prompts. Before it starts,
its snapshot file is pre-filled with filler entries in the benchmark's namespace
(bench/cache_latency_data.py: synthetic prompts with random unit vectors, never a
candidate), so that the namespace holds `entries` (10k, 100k) entries. Then a few hundred
real prompts are stored through real requests (misses), and rewordings of them are asked
once: those the decision serves from the semantic tier, with the stored prompt's answer,
are the semantic queries. The load generator (bench/loadgen.py, its own
process, keep-alive, `concurrency` closed-loop workers) then alternates rounds direct /
gateway / direct / gateway ... for each kind and concurrency (1, 64):

    exact      the stored prompts again, word for word (counted if x-cache-tier: exact)
    semantic   the accepted rewordings (counted only if x-cache-tier: semantic)
    direct     the same chat request straight to the fake upstream: the baseline

The 100k gateway gets the real entries the 10k one stored (copied into its snapshot), and
is measured only once its CPU has gone idle after start (`settle_s`): above 20k entries
the sweeper rebuilds the namespace's flat index as HNSW, which takes minutes here. While
the rounds run, the snapshot file is watched (`snapshot_writes`, `snapshot_busy_fraction`):
the gateway rewrites the whole file a few seconds after entries change, but after hits
alone only every few minutes (cache/store_local.py), and whatever it writes is part of what the
hit latencies include.

In process (`level: component`, bench/cache_latency_component.py, full mode only): the
same embedder, store, verifier and `SemanticCache.lookup` without HTTP, loaded from the
same real entries plus fillers, looked up by the same rewordings at concurrency 1 and 64.
Loaded from a snapshot, the 100k namespace is a flat index (`index: flat`): that is what
the gateway searches for the minutes after a start, until its sweeper's HNSW build ends;
building it in process too would add another two minutes.

JSON lines only on stdout (progress goes to stderr), `{"bench": "cache_latency", "metric",
"value", "unit", ...parameters}`; parameters kind (exact, semantic), concurrency,
entries, level (gateway, component), index (flat, hnsw):

    hit_latency_p50_ms, hit_latency_p99_ms    client-side, whole request (gateway) or
                                              one SemanticCache.lookup (component)
    direct_latency_p50_ms, _p99_ms            the same request to the fake upstream
    lookups_per_s                             hits served per second
    embed_share, search_share                 of the lookup time (semantic), from the
                                              gateway_cache_lookup_seconds stages
    verifier_share, other_share               component: the pair verifier; the rest (key
                                              probes, guards, bookkeeping)
    embed_ms_mean, search_ms_mean, lookup_ms_mean   the same stages, per lookup
    hit_fraction                              semantic: counted / all answers
    gateway_cpu_ms_per_req                    the gateway's CPU time (all its threads,
                                              snapshot writes included) per counted hit
    settle_s                                  gateway start: ready until its CPU went idle
    snapshot_writes, snapshot_busy_fraction   during the gateway's measured rounds
    cache_wait_p99_ms, cache_wait_max_ms      how long requests waited on the cache lookup
                                              (hit or not, from each answer's Server-Timing)
    fail_open_fraction                        semantic: answers whose lookup failed open
                                              (any reason) / all answers
    shared_fraction                           semantic: answers whose lookup was an
                                              identical request's, in flight at the time
                                              (the `shared` stage) / all answers
    semantic_queries                          the distinct semantic queries (rewordings the
                                              decision served) the rounds cycle through
    embedder_busy_fraction, embed_ms_per_text semantic: the embedder's pass time over the
                                              rounds' wall time, and per text embedded
                                              (gateway_cache_embedder_*_total)
    target_met                                1/0: semantic hit p50 < 15 ms, exact hit p50
                                              < 2 ms (gateway, concurrency 1)
    embed_alone_p50_ms, embed_alone_p90_ms    the forward pass alone for one semantic query
    embed_batch8_p50_ms, embed_batch8_p90_ms  (batch8: for eight),
                                              in this process after the gateways stopped
                                              (`path`: library = sentence-transformers'
                                              own, the baseline; fast = cache/bert.py;
                                              onnx = ONNX Runtime; `precision`; `default`:
                                              what `embedder: auto` runs here)
    load_avg_1m                               the machine's load at the start and the end

    python bench/cache_latency.py            # 10k and 100k, gateway and component, ~7 min
    python bench/cache_latency.py --quick    # 10k through the gateway only, under a minute
    python bench/cache_latency.py --component-hnsw   # full, plus in-process 100k as HNSW
    python bench/cache_latency.py --quick --embedder torch,onnx   # both, side by side
    python bench/cache_latency.py --quick --model-ms 200   # misses take a model's time
    python bench/cache_latency.py --quick --model-ms 200 --prompts 200   # 67 queries, not 22

With 22 semantic queries (`--quick`), the 64 clients ask about three of each at any time,
and identical lookups in flight share one (cache/semantic.py): `shared_fraction` says how
many did. `--prompts 200` spreads the clients over about three times as many queries.

With the fake model answering at once, a closed-loop client whose lookup failed open is
back within a millisecond: at concurrency 64 the failed-open requests then flood the
gateway and take the CPU from the embedder. `--model-ms` gives misses a model's latency
(direct latencies then include it too).

Exits 1 if any request failed (the numbers are printed all the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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

from bench import cache_latency_data as data  # noqa: E402
from bench.fake_upstream import fake_backend  # noqa: E402
from bench.loadgen import LoadGenerator, RoundResult, RoundSpec  # noqa: E402
from bench.measure import cpu_seconds, percentile  # noqa: E402
from bench.processes import (  # noqa: E402
    OPERATOR,
    Gateway,
    ServerProcess,
    start_fake_upstream,
    unwind_on_sigterm,
)
from bench.processes import start_gateway as start_gateway_process  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402
from cache.codec import StoredEntry  # noqa: E402

BENCH = "cache_latency"
KEY = "bench-" + "c" * 40
CHAT_PATH = "/chat/completions"
CONCURRENCIES = (1, 64)
KINDS = ("exact", "semantic")
FAILS = ("budget", "embedder_busy", "store", "error")  # x-cache-miss-reason: failed open
SCREEN_TRIES = 5
TARGETS_MS = {"semantic": 15.0, "exact": 2.0}  # p50 at concurrency 1, through the gateway
# The gateway's default (gateway/settings.py): under load, lookups the embedder cannot
# serve in time fail open (`embedder_busy`, or `budget` past it); the answers of lookups
# that failed open for load are not stored, so the rewordings stay rewordings.
LOOKUP_BUDGET_MS = 50
FLAT_MAX = 20_000  # cache/index.py IndexConfig.flat_max: HNSW above it


@dataclass(frozen=True)
class Plan:
    real_prompts: int  # stored through the gateway
    rewordings: int  # tried per stored prompt, to find semantic queries
    warm_up_s: float  # one round per target before the measured ones
    round_s: float
    slow_round_s: float  # semantic rounds at concurrency 64 (~1 s a request)
    pairs: int  # measured rounds per target
    gateway_entries: tuple[int, ...]
    component_entries: tuple[int, ...]
    component_round_s: float
    component_hnsw: bool  # also measure the in-process 100k namespace after its HNSW build
    embed_rounds: int  # passes per semantic query and variant in the embed phase


FULL = Plan(
    real_prompts=200,
    rewordings=3,
    warm_up_s=1.0,
    round_s=2.0,
    slow_round_s=4.0,
    pairs=3,
    gateway_entries=(10_000, 100_000),
    component_entries=(10_000, 100_000),
    component_round_s=3.0,
    component_hnsw=False,  # the in-process HNSW build of 100k vectors takes ~2 min here
    embed_rounds=5,
)
QUICK = Plan(
    real_prompts=64,
    rewordings=1,
    warm_up_s=0.3,
    round_s=0.75,
    slow_round_s=2.0,
    pairs=2,
    gateway_entries=(10_000,),
    component_entries=(),
    component_round_s=1.5,
    component_hnsw=False,
    embed_rounds=2,
)


emit = emitter(BENCH)


progress = progress_of(BENCH)


def body_text(prompt: str) -> str:
    return orjson.dumps(data.chat_body(prompt)).decode()


def index_kind(entries: int) -> str:
    return "hnsw" if entries > FLAT_MAX else "flat"


# --- the gateway -------------------------------------------------------------------------


def gateway_config(
    upstream_url: str, work_dir: Path, cache_dir: Path, entries: int, embedder: str
) -> Any:
    return {
        "state": {"url": "memory", "path": str(work_dir / "state.json")},
        "backends": [fake_backend(upstream_url)],
        "cache": {
            "enabled": True,
            "path": str(cache_dir),
            "lookup_budget_ms": LOOKUP_BUDGET_MS,
            "embedder": embedder,
            # Room above `entries` for the rewordings the decision refused (stored as misses).
            "max_entries_per_namespace": int(entries * 1.2),
        },
        "tenants": [
            {"name": data.TENANT, "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
        ],
    }


class Client:
    """Single requests to the gateway (storing, screening, checks)."""

    def __init__(self, gateway: Gateway) -> None:
        self.url = gateway.base_url + CHAT_PATH
        self.metrics_url = gateway.url + "/metrics"
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            timeout=60,
            limits=httpx.Limits(max_connections=32),
        )

    def ask(self, prompt: str) -> httpx.Response:
        response = self._http.post(self.url, content=body_text(prompt))
        if response.status_code != 200:
            raise RuntimeError(f"{prompt!r}: HTTP {response.status_code} {response.text[:200]}")
        return response

    def scrape(self) -> str:
        """The gateway's /metrics page (read once for `stage_totals` and `embedder_totals`)."""
        return self._http.get(self.metrics_url, headers=OPERATOR).text

    def fail_opens(self) -> float:
        text = self.scrape()
        head = "gateway_cache_fail_open_total{"
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(head)
        )

    def close(self) -> None:
        self._http.close()


def stage_totals(metrics: str) -> dict[str, tuple[float, float]]:
    """gateway_cache_lookup_seconds (sum, count) by stage, from a /metrics page."""
    found: dict[str, dict[str, float]] = {"_sum": {}, "_count": {}}
    for line in metrics.splitlines():
        for suffix, values in found.items():
            head = f'gateway_cache_lookup_seconds{suffix}{{stage="'
            if line.startswith(head):
                stage = line[len(head) :].split('"', 1)[0]
                values[stage] = float(line.rsplit(" ", 1)[1])
    sums, counts = found["_sum"], found["_count"]
    return {stage: (sums.get(stage, 0.0), counts[stage]) for stage in counts}


def embedder_totals(metrics: str) -> tuple[float, float]:
    """gateway_cache_embedder_busy_seconds_total and _texts_total, from a /metrics page."""
    found = {"busy_seconds": 0.0, "texts": 0.0}
    for line in metrics.splitlines():
        for name in found:
            if line.startswith(f"gateway_cache_embedder_{name}_total "):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found["busy_seconds"], found["texts"]


def store_prompts(client: Client, prompts: list[str], deadline_s: float = 120.0) -> None:
    """Asks each prompt (a miss, stored after the answer), then waits until all hit."""
    # Eight at a time: a lookup that fails open (the embedder saturated) is not stored.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(client.ask, prompts))
    misses = sum(a.headers.get("x-cache") == "miss" for a in answers)
    progress(f"  stored {len(prompts)} prompts ({misses} were misses)")
    pending, deadline = list(prompts), time.monotonic() + deadline_s
    while pending:
        with ThreadPoolExecutor(8) as pool:
            tiers = list(pool.map(lambda p: client.ask(p).headers.get("x-cache-tier"), pending))
        pending = [p for p, tier in zip(pending, tiers, strict=True) if tier != "exact"]
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} prompts were not stored, e.g. {pending[0]!r}")
        if pending:
            time.sleep(0.2)


def screen_rewordings(client: Client, pairs: list[tuple[str, str]]) -> list[str]:
    """The rewordings served from the semantic tier with their stored prompt's answer."""

    def served(pair: tuple[str, str]) -> bool:
        stored, asked = pair
        for _ in range(SCREEN_TRIES):
            answer = client.ask(asked)
            if answer.headers.get("x-cache-miss-reason") not in FAILS:
                break
            time.sleep(0.05)  # failed open (the embedder busy): asked again, not judged
        content = answer.json()["choices"][0]["message"]["content"]
        semantic = answer.headers.get("x-cache-tier") == "semantic"
        return semantic and bool(content == f"echo: {stored}")

    # Two at a time, and a rewording whose lookup failed open is asked again: the screen
    # says what the decision accepts, not how busy the embedder was.
    with ThreadPoolExecutor(2) as pool:
        accepted = list(pool.map(served, pairs))
    return [asked for (_, asked), ok in zip(pairs, accepted, strict=True) if ok]


def check_namespace(client: Client) -> None:
    """An exact hit on a pre-filled entry: the benchmark's namespace is the gateway's."""
    answer = client.ask(data.filler_prompt(0))
    if answer.headers.get("x-cache-tier") != "exact":
        raise RuntimeError(
            "a pre-filled entry was not found: the namespace computed by "
            "bench/cache_latency_data.py no longer matches cache/semantic.py "
            f"(x-cache: {answer.headers.get('x-cache')})"
        )


def wait_idle(pid: int, timeout_s: float, idle_cores: float = 0.2, quiet_s: float = 2.0) -> float:
    """Seconds until the process's CPU use stayed below `idle_cores` for `quiet_s`."""
    started = last_t = time.monotonic()
    last_cpu, quiet = cpu_seconds(pid), 0.0
    while (now := time.monotonic()) - started < timeout_s:
        time.sleep(0.5)
        now, cpu = time.monotonic(), cpu_seconds(pid)
        busy = (cpu - last_cpu) / (now - last_t)
        quiet = quiet + (now - last_t) if busy < idle_cores else 0.0
        last_cpu, last_t = cpu, now
        if quiet >= quiet_s:
            return now - started - quiet
    progress(f"  gateway still busy after {timeout_s:.0f} s; measuring anyway")
    return now - started


class SnapshotWatch:
    """Watches the gateway's snapshot file: how often it was rewritten, and for what
    fraction of the time a rewrite was in progress (its temporary file existed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writes = self.busy = self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _mtime(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        last = self._mtime()
        while not self._stop.wait(0.1):
            self.polls += 1
            self.busy += any(self.path.parent.glob(f".{self.path.name}.*.tmp"))
            mtime = self._mtime()
            self.writes += mtime != last
            last = mtime

    def __enter__(self) -> SnapshotWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def busy_fraction(self) -> float:
        return self.busy / self.polls if self.polls else 0.0


@dataclass
class Series:
    latencies_ms: list[float] = field(default_factory=list)
    completed: int = 0
    seconds: float = 0.0
    errors: int = 0
    first_error: str | None = None
    other: dict[str, int] = field(default_factory=dict)
    gateway_cpu_s: float = 0.0
    cache_waits_ms: list[float] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)
    stage_n: dict[str, float] = field(default_factory=dict)
    embed_busy_s: float = 0.0  # the embedder's pass time during the gateway's rounds
    embed_texts: float = 0.0
    wall_s: float = 0.0  # the gateway's rounds, as the bench timed them

    def add(self, result: RoundResult) -> None:
        self.latencies_ms.extend(result.latencies_ms)
        self.completed += result.completed
        self.seconds += result.duration_s
        self.errors += result.errors
        self.first_error = self.first_error or result.first_error
        self.cache_waits_ms.extend(result.cache_waits_ms)
        for label, n in result.other.items():
            self.other[label] = self.other.get(label, 0) + n

    @property
    def rps(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0


class GatewayBench:
    def __init__(
        self,
        plan: Plan,
        loadgen: LoadGenerator,
        gateway: Gateway,
        client: Client,
        upstream_url: str,
        entries: int,
        embedder: str,
    ) -> None:
        self.plan = plan
        self.embedder = embedder
        self.loadgen = loadgen
        self.client = client
        self.entries = entries
        if gateway.server.process is None:
            raise RuntimeError("gateway not started")
        self.pid = gateway.server.process.pid
        json_headers = {"Content-Type": "application/json"}
        self.direct_url = upstream_url + CHAT_PATH
        self.gateway_url = gateway.base_url + CHAT_PATH
        self.direct_headers = json_headers
        self.gateway_headers = {**json_headers, "Authorization": f"Bearer {KEY}"}
        self.failed = False
        self.p50: dict[tuple[str, int], float] = {}

    def _round(
        self, target: str, kind: str, bodies: list[str], concurrency: int, s: float
    ) -> RoundResult:
        if target == "direct":
            spec = RoundSpec(self.direct_url, self.direct_headers, bodies, concurrency, s)
        else:
            url, headers = self.gateway_url, self.gateway_headers
            spec = RoundSpec(url, headers, bodies, concurrency, s, expect_tier=kind)
        return self.loadgen.closed(spec)

    def run(self, stored: list[str], reworded: list[str]) -> None:
        for concurrency in CONCURRENCIES:
            direct = Series()
            for kind in KINDS:
                prompts = stored if kind == "exact" else reworded
                bodies = [body_text(p) for p in prompts]
                self.combination(kind, concurrency, bodies, direct)
            self.report_direct(concurrency, direct)

    def combination(self, kind: str, concurrency: int, bodies: list[str], direct: Series) -> None:
        plan = self.plan
        seconds = plan.slow_round_s if (kind, concurrency) == ("semantic", 64) else plan.round_s
        progress(f"  {kind} concurrency={concurrency}: warm-up")
        for target in ("direct", "gateway"):
            self._round(target, kind, bodies, concurrency, plan.warm_up_s)
        gateway = Series()
        for index in range(plan.pairs):
            direct.add(self._round("direct", kind, bodies, concurrency, plan.round_s))
            before, cpu = self.client.scrape(), cpu_seconds(self.pid)
            started = time.monotonic()
            result = self._round("gateway", kind, bodies, concurrency, seconds)
            gateway.wall_s += time.monotonic() - started
            gateway.gateway_cpu_s += cpu_seconds(self.pid) - cpu
            after = self.client.scrape()
            (busy, texts), (busy_after, texts_after) = map(embedder_totals, (before, after))
            gateway.embed_busy_s += busy_after - busy
            gateway.embed_texts += texts_after - texts
            stages = stage_totals(before)
            for stage, (total, n) in stage_totals(after).items():
                was_total, was_n = stages.get(stage, (0.0, 0.0))
                gateway.stage_s[stage] = gateway.stage_s.get(stage, 0.0) + total - was_total
                gateway.stage_n[stage] = gateway.stage_n.get(stage, 0.0) + n - was_n
            gateway.add(result)
            progress(
                f"    round {index + 1}/{plan.pairs}: {result.rps:8.1f} hits/s, "
                f"p50 {percentile(result.latencies_ms, 50):.2f} ms"
                + (f", other answers {result.other}" if result.other else "")
                + (f", {result.errors} errors" if result.errors else "")
            )
        self.report(kind, concurrency, gateway)

    def report(self, kind: str, concurrency: int, series: Series) -> None:
        params = {
            "kind": kind,
            "concurrency": concurrency,
            "entries": self.entries,
            "level": "gateway",
            "index": index_kind(self.entries),
            "embedder": self.embedder,
        }
        p50 = percentile(series.latencies_ms, 50)
        self.p50[(kind, concurrency)] = p50
        emit("hit_latency_p50_ms", round(p50, 3), "ms", **params)
        emit("hit_latency_p99_ms", round(percentile(series.latencies_ms, 99), 3), "ms", **params)
        emit("lookups_per_s", round(series.rps, 1), "lookups/s", **params)
        if series.cache_waits_ms:
            waits = series.cache_waits_ms
            emit("cache_wait_p99_ms", round(percentile(waits, 99), 3), "ms", **params)
            emit("cache_wait_max_ms", round(max(waits), 3), "ms", **params)
        if series.completed:
            cpu_ms = series.gateway_cpu_s / series.completed * 1000.0
            emit("gateway_cpu_ms_per_req", round(cpu_ms, 3), "ms", **params)
        answers = len(series.latencies_ms) + sum(series.other.values())
        if kind == "semantic":
            fraction = len(series.latencies_ms) / answers if answers else 0.0
            emit("hit_fraction", round(fraction, 4), "ratio", **params)
            failed = sum(n for label, n in series.other.items() if label.split(":")[1] in FAILS)
            emit(
                "fail_open_fraction",
                round(failed / answers if answers else 0.0, 4),
                "ratio",
                **params,
            )
            report_stages(series.stage_s, series.stage_n, params)
            shared = series.stage_n.get("shared", 0.0)
            emit(
                "shared_fraction", round(shared / answers if answers else 0.0, 4), "ratio", **params
            )
            report_embedder(series, params)
        if series.other:
            progress(f"  {kind} c={concurrency}: answers not counted: {series.other}")
        if series.errors:
            self.failed = True
            progress(f"  {kind} c={concurrency}: {series.errors} failed, {series.first_error}")

    def report_direct(self, concurrency: int, series: Series) -> None:
        params = {"concurrency": concurrency, "entries": self.entries}
        emit("direct_latency_p50_ms", round(percentile(series.latencies_ms, 50), 3), "ms", **params)
        emit("direct_latency_p99_ms", round(percentile(series.latencies_ms, 99), 3), "ms", **params)
        if series.errors:
            self.failed = True
            progress(f"  direct c={concurrency}: {series.errors} failed, {series.first_error}")

    def report_targets(self) -> None:
        for kind, limit in TARGETS_MS.items():
            measured = self.p50.get((kind, 1))
            if measured is None:
                continue
            emit(
                "target_met",
                int(measured < limit),
                "bool",
                target=f"{kind} hit p50 < {limit:g} ms",
                measured_ms=round(measured, 3),
                kind=kind,
                concurrency=1,
                entries=self.entries,
                level="gateway",
                embedder=self.embedder,
            )


def report_embedder(series: Series, params: dict[str, Any]) -> None:
    """How busy the embedder was during the rounds, and what a text cost it: many
    lookups failing open while it was mostly idle means bursts or a late event loop, not
    the model, kept them out (docs/cache-latency.md, "What limits concurrency 64")."""
    if series.wall_s > 0:
        fraction = series.embed_busy_s / series.wall_s
        emit("embedder_busy_fraction", round(fraction, 4), "ratio", **params)
    if series.embed_texts:
        per_text = series.embed_busy_s / series.embed_texts * 1000.0
        emit("embed_ms_per_text", round(per_text, 3), "ms", **params)


def report_stages(
    stage_s: dict[str, float], stage_n: dict[str, float], params: dict[str, Any]
) -> None:
    total = stage_s.get("total", 0.0)
    if total <= 0:
        return
    for stage in ("embed", "search"):
        emit(f"{stage}_share", round(stage_s.get(stage, 0.0) / total, 4), "ratio", **params)
    for stage, metric in (("embed", "embed"), ("search", "search"), ("total", "lookup")):
        n = stage_n.get(stage, 0.0)
        if n:
            mean = stage_s[stage] / n * 1000.0
            emit(f"{metric}_ms_mean", round(mean, 3), "ms", **params)


@dataclass
class Prepared:
    stored: list[str]  # prompts stored through the gateway
    reworded: list[str]  # rewordings served from the semantic tier


def gateway_phase(
    plan: Plan,
    work_dir: Path,
    upstream_url: str,
    loadgen: LoadGenerator,
    entries: int,
    real: list[StoredEntry] | None,
    prepared: Prepared | None,
    models_ready: threading.Event,
    embedder: str,
) -> tuple[Prepared, Path, bool]:
    """One gateway with `entries` in the namespace; returns what was stored and where.

    The first one (`real` None) stores the real prompts through requests and finds the
    semantic rewordings; later ones start with the entries it stored (`real`)."""
    cache_dir = work_dir / f"cache-{embedder}-{entries}"
    snapshot = cache_dir / "entries.bin"
    pairs = data.real_prompts(plan.real_prompts)
    started = time.monotonic()
    failed = False
    if real is None:  # the first gateway: real prompts go through it
        data.write_namespace(snapshot, entries - len(pairs), [], filler_tokens=12)
    else:
        data.write_namespace(snapshot, entries, real, filler_tokens=12)
    progress(
        f"gateway ({embedder}), {entries} entries: snapshot written in "
        f"{time.monotonic() - started:.1f} s"
    )
    gateway = start_gateway_process(
        gateway_config(upstream_url, work_dir, cache_dir, entries, embedder),
        work_dir,
        timeout_s=600,
    )
    client = Client(gateway)
    try:
        assert gateway.server.process is not None
        pid = gateway.server.process.pid
        progress(f"  gateway ready in {time.monotonic() - started:.1f} s")
        check_namespace(client)
        if prepared is None:
            stored = [prompt for prompt, _ in pairs]
            store_prompts(client, stored)
            candidates = [
                (prompt, rewordings[(i + r) % len(rewordings)])
                for i, (prompt, rewordings) in enumerate(pairs)
                for r in range(plan.rewordings)
            ]
            reworded = screen_rewordings(client, candidates)
            progress(
                f"  {len(reworded)}/{len(candidates)} rewordings are semantic hits "
                f"({client.fail_opens():g} lookups failed open so far)"
            )
            if not reworded:
                raise RuntimeError("no rewording was served from the semantic tier")
            emit("semantic_queries", len(reworded), "prompts", stored=len(stored), level="gateway")
            prepared = Prepared(stored, reworded)
        settle = wait_idle(pid, timeout_s=900)
        emit("settle_s", round(settle, 1), "s", entries=entries, level="gateway", embedder=embedder)
        progress(f"  gateway settled after {settle:.1f} s")
        models_ready.wait()
        bench = GatewayBench(plan, loadgen, gateway, client, upstream_url, entries, embedder)
        with SnapshotWatch(snapshot) as watch:
            bench.run(prepared.stored, prepared.reworded)
        params = {"entries": entries, "level": "gateway", "embedder": embedder}
        emit("snapshot_writes", watch.writes, "count", **params)
        emit("snapshot_busy_fraction", round(watch.busy_fraction, 3), "ratio", **params)
        bench.report_targets()
        failed = bench.failed
    finally:
        client.close()
        stopping = time.monotonic()
        code = gateway.stop()  # SIGTERM; SIGKILL after 15 s
        if code not in (0, None):
            waited = time.monotonic() - stopping
            progress(f"  gateway exited {code} after {waited:.1f} s (its last snapshot write?)")
    return prepared, snapshot, failed


# --- in process ----------------------------------------------------------------------------


def component_phase(
    plan: Plan, work_dir: Path, models: Any, real: list[StoredEntry], reworded: list[str]
) -> None:
    import torch

    from bench import cache_latency_component as component

    threads = torch.get_num_threads()
    runs = [
        component.Run(c, plan.component_round_s * (2 if c > 1 else 1), plan.warm_up_s + 0.5)
        for c in CONCURRENCIES
    ]
    for entries in plan.component_entries:
        snapshot = work_dir / f"component-{entries}" / "entries.bin"
        started = time.monotonic()
        data.write_namespace(snapshot, entries, real, filler_tokens=1)
        progress(f"component, {entries} entries: snapshot in {time.monotonic() - started:.1f} s")
        max_entries = int(entries * 1.2)
        # Loaded from a snapshot, a namespace is flat until the first sweep converts it.
        variants = [("flat", False)]
        if entries > FLAT_MAX and plan.component_hnsw:
            variants.append(("hnsw", True))
        for index, hnsw in variants:
            results = component.measure(models, snapshot, max_entries, reworded, runs, hnsw=hnsw)
            for result in results:
                params = {
                    "kind": "semantic",
                    "concurrency": result.concurrency,
                    "entries": entries,
                    "level": "component",
                    "index": index,
                    "torch_threads": threads,
                }
                report_component(result, params)


def report_component(result: Any, params: dict[str, Any]) -> None:
    lat = result.latencies_ms
    progress(
        f"  c={result.concurrency} torch_threads={params['torch_threads']} "
        f"index={params['index']}: {result.per_s:.1f} lookups/s, "
        f"p50 {percentile(lat, 50):.2f} ms" + (f", other {result.other}" if result.other else "")
    )
    emit("lookups_per_s", round(result.per_s, 1), "lookups/s", **params)
    emit("hit_latency_p50_ms", round(percentile(lat, 50), 3), "ms", **params)
    emit("hit_latency_p99_ms", round(percentile(lat, 99), 3), "ms", **params)
    counts = {stage: float(result.lookups) for stage in result.stage_s}
    report_stages(result.stage_s, counts, params)
    total = result.stage_s.get("total", 0.0)
    if total > 0:
        emit("verifier_share", round(result.verifier_s / total, 4), "ratio", **params)
        rest = total - result.stage_s.get("embed", 0.0) - result.stage_s.get("search", 0.0)
        emit("other_share", round((rest - result.verifier_s) / total, 4), "ratio", **params)


# --- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k through the gateway only")
    parser.add_argument(
        "--component-hnsw",
        action="store_true",
        help="also measure the in-process 100k namespace as HNSW (builds it: ~2 more minutes)",
    )
    parser.add_argument(
        "--embedder",
        default="auto",
        help="the gateway's cache.embedder, or several separated by commas (e.g. torch,onnx): "
        "the gateway phase runs once per backend, in that order (default: auto)",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="prompts stored through the gateway (default: 64 with --quick, else 200; at most "
        "200): the semantic queries are the rewordings of them the decision serves, so more "
        "prompts mean fewer identical requests at once at concurrency 64",
    )
    parser.add_argument(
        "--model-ms",
        type=float,
        default=0.0,
        help="the fake model answers after this long (default 0: at once); with a model's "
        "latency, a lookup that fails open costs its client what a miss costs",
    )
    args = parser.parse_args(argv)
    embedders = [name.strip() for name in args.embedder.split(",") if name.strip()]
    plan = QUICK if args.quick else FULL
    if args.component_hnsw:
        plan = dataclasses.replace(plan, component_hnsw=True)
    if args.prompts is not None:
        plan = dataclasses.replace(plan, real_prompts=args.prompts)
    unwind_on_sigterm()
    started = time.monotonic()
    failed = False
    emit_load("start")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        work_dir = Path(tmp)
        upstream: ServerProcess | None = None
        loadgen = LoadGenerator()
        # The in-process model loads while the first gateway starts (not while measuring).
        models: list[Any] = []
        models_ready = threading.Event()
        if not plan.component_entries:
            models_ready.set()
        try:
            upstream, upstream_url = start_fake_upstream(work_dir, args.model_ms)
            emit("model_ms", args.model_ms, "ms")
            loadgen.start()
            if plan.component_entries:
                loader = threading.Thread(target=_load_models, args=(models, models_ready))
                loader.daemon = True
                loader.start()
            prepared: Prepared | None = None
            real: list[StoredEntry] | None = None
            need_real = (
                len(plan.gateway_entries) > 1 or len(embedders) > 1 or bool(plan.component_entries)
            )
            for embedder in embedders:
                for entries in plan.gateway_entries:
                    prepared, snapshot, phase_failed = gateway_phase(
                        plan,
                        work_dir,
                        upstream_url,
                        loadgen,
                        entries,
                        real,
                        prepared,
                        models_ready,
                        embedder,
                    )
                    failed = failed or phase_failed
                    if real is None and need_real:
                        real = data.real_entries(snapshot)
                        progress(f"  {len(real)} real entries stored by the gateway")
            if plan.component_entries:
                models_ready.wait()
                if not models:
                    raise RuntimeError("the embedding model did not load (see above)")
                assert prepared is not None and real is not None
                component_phase(plan, work_dir, models[0], real, prepared.reworded)
            embed_phase(prepared.reworded if prepared else [], plan.embed_rounds)
        finally:
            loadgen.stop()
            if upstream is not None:
                upstream.stop()
    emit_load("end")
    progress(f"done in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


def emit_load(when: str) -> None:
    """The machine's 1-minute load average: on 2 shared cores, a run at a load of 6 is not
    comparable with one at 1 (compare variants within one run instead)."""
    emit("load_avg_1m", round(os.getloadavg()[0], 2), "tasks", when=when, cores=os.cpu_count())


def embed_phase(queries: list[str], rounds: int) -> None:
    """The forward pass alone, in this process: sentence-transformers' own path in float32
    (`path`: library, what the embedder ran before cache/bert.py), the fast path in each
    precision, and ONNX Runtime (`onnx`); `default`: what `embedder: auto` runs here. One
    semantic query at a time (`embed_alone_*`), and eight at a time (`embed_batch8_*`).
    Variants alternate pass by pass, so the machine's load hits all alike."""
    import torch

    from cache.embedder import load_embedder
    from cache.torch_encoder import SentenceEncoder

    if not queries:
        return
    progress("embed: the forward pass alone")
    # On the CPU, also on a GPU machine: these are the CPU's passes (bench/gpu_check.py
    # times the GPU's); ONNX Runtime runs on the CPU only.
    model = load_embedder(device="cpu", backend="torch").model
    onnx = load_embedder(device="cpu", backend="onnx")
    default = load_embedder(device="cpu")
    variants: dict[tuple[str, str], Any] = {
        ("library", "float32"): SentenceEncoder(model, fast=False),
        ("fast", "float32"): SentenceEncoder(model, "float32"),
        ("fast", "bfloat16"): SentenceEncoder(model, "bfloat16"),
        ("onnx", "float32"): onnx,
    }
    default_key = ("onnx" if default.backend == "onnx" else "fast", default.precision)
    for encoder in variants.values():
        encoder.encode(queries[:8])  # first passes allocate and pick kernels
    for size, metric in ((1, "embed_alone"), (8, "embed_batch8")):
        times: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        for _ in range(rounds):
            for start in range(0, len(queries) - size + 1, size):
                for key, encoder in variants.items():
                    sent = time.perf_counter()
                    encoder.encode(queries[start : start + size])
                    times[key].append((time.perf_counter() - sent) * 1000.0)
        for (path, precision), samples in times.items():
            params = {
                "path": path,
                "precision": precision,
                "default": (path, precision) == default_key,
                "threads": torch.get_num_threads(),
                "level": "component",
            }
            emit(f"{metric}_p50_ms", round(percentile(samples, 50), 3), "ms", **params)
            emit(f"{metric}_p90_ms", round(percentile(samples, 90), 3), "ms", **params)


def _load_models(out: list[Any], ready: threading.Event) -> None:
    try:
        from bench.cache_latency_component import Models

        out.append(Models())
    except Exception as exc:  # reported by main
        progress(f"loading the embedding model failed: {exc!r}")
    finally:
        ready.set()


if __name__ == "__main__":
    sys.exit(main())
