"""SLO goodput (issue 38): what the gateway's traffic control buys in front of a real
continuous-batching engine, counted as answers that meet their latency objective and
compared with the bare engine at the same offered load, in the same run.

Set-up, all real processes on loopback:

- the engine: vLLM's CPU build (`make engine`, backends/local_vllm.py: the 17M-parameter
  random Llama, `--scheduling-policy priority`, prefix caching on, as a user runs it), or
  with `--engine fake` bench/fake_engine.py (a modelled A100, fast to start);
- the mix, open-loop Poisson arrivals (bench/loadgen.py, its own process), three
  tenants: `interactive` (class interactive, streamed, a conversation-like mix) and `batch`
  and `noisy` (class batch, whole answers, a code-like mix: long prompts, short answers).
  Lengths are heavy-tailed: lognormal, clipped to the model's 1,024 tokens (`MIX`), shaped
  like the two mixes of the Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA
  2024: conversation prompts ~1k tokens with ~130-token answers, code prompts ~1.5-2k with
  ~15) and scaled down 8x to this model's context. Not fitted to any trace file (none is
  here) and not tuned on: every run draws a fresh seed, printed with every line, and
  `--seed` replays one. Each prompt starts with a token of its own, so the prefix cache
  finds nothing shared. Output is exactly `max_tokens` (`ignore_eos`).
  Shares at load 1: interactive 60%, batch 25%, noisy 15%; below 1 all scaled down, above
  1 the noisy tenant sends the excess. Load 1 is the bare engine's throughput of the mix
  measured first (a closed loop of 64 clients straight to it): a measured ceiling, not a
  searched capacity. It moves by half between runs here (20-30 req/s on one pinned
  core), so two versions are compared at a given `--bound-rps`.
- deadlines: interactive sends `x-request-timeout: 5` and gives up at 6 s; batch 15 and
  18 s. With `--deadlines none` no client says so (the gateway then takes its class
  defaults, `traffic.deadline_s`), and each still gives up at the same time. The bare
  engine gets no deadline (it has no such header) and the `priority` the gateway would
  add (its best configuration): a client that gives up closes its connection, which
  aborts the request in the engine.

The objective (SLO) per class, from the bare engine unloaded, measured for each seed
right before its phases, on interactive prompts streamed straight to it one at a time
(`unloaded_s` each, quick 7 s, full 30 s): time to first token from answers of one token
(hundreds of them), time per output token from answers of TPOT_MIN_TOKENS (64):
    interactive  answered in full within its deadline, time to first token within 2x the
                 unloaded p99, and for streams of at least 64 tokens time per output token
                 ((latency - first token) / (tokens - 1)) within 2x the unloaded p99
    batch        answered in full within its deadline
SLO goodput: answers that meet their SLO, ended in the measured window, per second
(DistServe, OSDI 2024; until 2026-12-06 those sent in it, which credited a deep queue at
5x with the answers it gave after arrivals stopped). Its ratio to the bare engine's at
the same load and seed (the same arrivals and prompts) is the headline.

Modes, one gateway each (replicas: `--replicas`, requests split evenly), backend `gpu`:
    bare              no gateway: straight to the engine
    fixed             concurrency.mode fixed, max_concurrency = the engine's mean running
                      count in the bare load-1 phase (the best hand-set limit)
    adaptive-metrics  engine vllm, priority_scheduling true, no capacity given
    adaptive-latency  engine none, no capacity given
    uncontrolled      concurrency.mode fixed, max_concurrency 4096
For each repeat (seed, seed+1, ...): bare at every load, then each mode at every load (1
first), the modes in an order shuffled by the seed, a mode's ablations beside it
(`mode_order`), its gateways started for them and stopped after, the engine and gateways
left to go idle between phases. Full runs add two phases at load 1: before the run's
first gateway mode, a gateway of that mode measured by nothing (`Bench.warm_gateways`),
and after every mode, bare again (`Bench.bare_again`). Each phase measures the requests
sent in its last `window_s` (quick 7 s, full 30 s), after 5 s of arrivals at loads up to
1 (quick: 2 s at load 1, 1 s below), and overloaded after 18 s, when the clients that
give up last have given up: until then the bare engine's queue still grows, and an
earlier window shows it answering batch requests in time that it cannot answer in steady
state.

`--ablate pacing,prefill_gate,...` adds each adaptive mode again with one traffic-core
controller off (the gateway's `traffic.controllers_off`), as mode `adaptive-metrics-no-pacing`
and so on: what each controller buys, on the same seeds and engine.

`--kv-blocks N` gives vLLM a KV cache of N blocks of 128 tokens (its
`--num-gpu-blocks-override`, honoured on CPU): small enough (64, say: 8,192 tokens), and
the engine preempts running requests to make room, which `preemptions` counts. Every line
then says `kv_blocks`.

`--pin on` runs the engine on the first CPU and everything else (gateways, load
generator, this script) on the others, so that the gateway's CPU does not slow the engine
(on a GPU it would not); `off` (default) shares them, as on this 2-core machine.

Metrics (JSON lines; every line has bench, seed, engine, replicas, pinned, and per phase
mode and load; class where it says):
    bound_rps, unloaded_ttft_p99_ms, unloaded_tpot_p99_ms   the references
    unloaded_stream_ttft_p99_ms the unloaded 64-token streams' own time to first token
                                p99, for comparison (the reference before 2026-12-06: a
                                few dozen samples at most)
    fixed_limit
    slo_goodput_rps             all, and by class
    slo_goodput_ratio_vs_bare   all, and by class (gateway modes)
    slo_goodput_ratio_vs_bare_load1   overloaded: / the bare engine's at load 1 (where
                                the bare engine meets no objective at 5x, the ratio above
                                is undefined; this one says how much of what the engine
                                does at its ceiling is kept under overload)
    ttft_p50_ms, ttft_p99_ms    interactive, answered
    p99_ratio_vs_engine_unloaded  ttft_p99_ms / the unloaded p99
    ttft_p50_ratio_vs_bare, ttft_p99_ratio_vs_bare   (gateway modes)
    tpot_p99_ms, tpot_p99_ratio_vs_unloaded   interactive streams of >= 64 tokens
    throughput_ratio_vs_bare    output tokens per second of answers completed in the window
    in_deadline_throughput_ratio_vs_bare   the same, of answers completed within their
                                deadline alone (in_deadline_tokens_per_s): the bare engine's
                                clients wait a second past it, the gateway cuts a stream there
    throughput_ratio_vs_bare_both   full runs, load 1: output tokens against the mean of
                                two bare load-1 phases, the first and one after every
                                gateway mode (the load-1 target judges this one)
    bare_again_ratio            full runs: the second bare load-1 phase's output tokens
                                over the first's, the reference's own spread
    client_timeouts             requests the client gave up on (whole phase)
    client_timeouts_streaming   of those, streams whose first token had come: the client's
                                total timeout (6 s) cut them while tokens flowed
    deadline_cut_streams        streams the gateway ended at the client's deadline
                                (`x-request-timeout`, 5 s) with a `deadline_exceeded`
                                event, tokens still flowing (none with `--deadlines none`)
    refused_share, refusal_latency_p99_ms   429 and 503 (these and the two below: all, and by class)
    refused_late_share          of those refusals, the ones that came after a wait in the
                                gateway's queue (`deadline_slipped`, `deadline_passed`),
                                not at arrival: the late ones refusal_latency_p99_ms shows
    refused_at_deadline_share   of those refusals, the ones dropped at their deadline
                                (`deadline_passed`), not when a re-check saw it slip
    jain_fairness               class batch: Jain's index over its tenants of SLO goodput
                                / max-min fair share (water-filling by offered rate)
    concurrency_limit_mean, in_flight_mean, queued_mean   from /readyz (summed over
                                replicas), engine_running_mean, engine_waiting_mean (its
                                /metrics), preemptions (its counter over the phase),
                                engine_prefix_hit_rate (prompt tokens its prefix cache
                                served, of those looked up, in the window)
    engine_limit_mean, latency_limit_mean, latency_measuring_share   the first gateway's
                                two limiters, and how much of the phase the latency one
                                spent measuring its baseline (limit pinned at half)
    limit_trace                 with `--trace`: the first gateway's limit at each /readyz
                                poll (0.5 s) of the whole phase, with t_s, in_flight,
                                queued, pace_per_s (the pacer's lower-class rate),
                                latency_phase, latency_cause (why a measurement
                                began), engine_running, engine_waiting; the
                                loads run in order (1, 0.3, 5) on the same gateways, so
                                the rows follow the limit through two load changes
    loadgen_lag_p99_ms
    mode_order                  each gateway mode's place in its seed's order (bare is first;
                                the others shuffled by the seed, each mode's ablations
                                next to it)
With `--repeats` > 1, each metric of a (mode, load, class) again with `repeat: "all"`: the
median, and `low` and `high` over the repeats. Last, `target_met` per adaptive mode (the
issue's targets, on the last repeat's figures or the medians). Its light-load check
compares phases minutes apart; bench/light_load_paired.py measures the same bound paired,
in one phase, beside the engine compared with itself.

Run:
    python bench/slo_goodput.py --quick             # vLLM, one repeat: about 3m50 here
    python bench/slo_goodput.py --quick --engine fake
    python bench/slo_goodput.py --repeats 3 --replicas 2 --pin on   # every mode, full

Exits 0 once the figures are printed, whatever they are; non-zero only when it could not
measure (a server that did not start, a gateway that refused its configuration).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

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
from backends.spawn import on_cpus  # noqa: E402
from backends.worker.tiny_model import VLLM, write_tiny_chat_model  # noqa: E402
from bench.capacity import (  # noqa: E402
    CLASS_OF,
    KEYS,
    MODEL,
    RANK,
    SHARES,
    TENANTS,
)
from bench.capacity import capacity_view as first_backend_view  # noqa: E402
from bench.capacity import gateway_config as capacity_gateway_config  # noqa: E402
from bench.loadgen import (  # noqa: E402
    LoadGenerator,
    PhaseResult,
    PhaseSpec,
    Poll,
    Record,
    RoundResult,
    RoundSpec,
    StreamSpec,
)
from bench.measure import percentile  # noqa: E402
from bench.overload import jain, max_min_shares, start_all  # noqa: E402
from bench.processes import (  # noqa: E402
    OPERATOR,
    Gateway,
    ServerProcess,
    free_port,
    unwind_on_sigterm,
)
from bench.report import emitter, progress_of  # noqa: E402
from gateway.settings_types import Controller  # noqa: E402
from gateway.traffic.engine_metrics import parse as parse_metrics  # noqa: E402

BENCH = "slo_goodput"
CHAT_PATH = "/v1/chat/completions"
# (x-request-timeout sent, when the client gives up), seconds, by class
DEADLINES = {"interactive": (5.0, 6.0), "batch": (15.0, 18.0)}
SLO_FACTOR = 2.0  # the objective: within this many times the unloaded p99
TPOT_MIN_TOKENS = 64  # time per output token is judged on streams at least this long
# The unloaded references come from prompts of the interactive mix sent straight to the
# engine one at a time, never two together: time to first token from answers of one
# token (hundreds of samples; taken from a few dozen streams instead, its p99 was their
# slowest one's and moved by a third between two runs of a seed: 52.8 and 70.6 ms,
# 2026-12-06), time per output token from streams of TPOT_MIN_TOKENS tokens. Until
# 2026-12-07 the streams came at 4% of load 1, open loop, and now and then two ran
# together, half of them under 64 tokens: one at a time the reference is truly unloaded,
# and quick seed 301 had 14 samples in 7 s where the open loop had given 7 in 20 s.
MODES = ("bare", "fixed", "adaptive-metrics", "adaptive-latency", "uncontrolled")
ADAPTIVE = ("adaptive-metrics", "adaptive-latency")
# `--ablate C`: the mode again with controller C off (traffic.controllers_off), "MODE-no-C".
ABLATED = "-no-"
CONTROLLERS: tuple[str, ...] = get_args(Controller)


@dataclass(frozen=True)
class Lengths:
    """Lognormal prompt and output lengths in tokens: (median, sigma), clipped."""

    prompt_median: float
    prompt_sigma: float
    prompt_max: int
    output_median: float
    output_sigma: float
    output_max: int

    def draw(self, rng: random.Random) -> tuple[int, int]:
        prompt = rng.lognormvariate(math.log(self.prompt_median), self.prompt_sigma)
        output = rng.lognormvariate(math.log(self.output_median), self.output_sigma)
        return (
            max(8, min(self.prompt_max, round(prompt))),
            max(2, min(self.output_max, round(output))),
        )


# conversation-like (interactive) and code-like (batch): see the module docstring
MIX = {
    "interactive": Lengths(128, 1.0, 640, 32, 1.0, 256),
    "batch": Lengths(192, 0.9, 768, 16, 1.2, 192),
}


@dataclass(frozen=True)
class Plan:
    quick: bool
    window_s: float  # the measured window: requests sent in it count
    warm_s: float  # arrivals before the window, at load 1
    light_warm_s: float  # the same below load 1, where the engine settles at once
    unloaded_s: float  # each of the two unloaded references (first token, per token)
    bound_s: float
    loads: tuple[float, ...]  # must hold 1: `fixed` takes its limit from bare's load-1 phase
    bare_again: bool  # bare's load-1 phase again after the gateway modes (`Bench.bare_again`)
    gateway_warm_s: float  # a gateway at load 1, measured by nothing, first (`warm_gateways`)

    def warm_up_s(self, load: float) -> float:
        """Arrivals before the window. Overloaded, until the clients that give up last
        have given up: before that the bare engine's queue still grows, and a window that
        ends earlier shows it answering batch requests it cannot answer in steady state."""
        if load < 1.0:
            return self.light_warm_s
        if load == 1.0:
            return self.warm_s
        return max(client_s for _, client_s in DEADLINES.values())


QUICK = Plan(
    True,
    window_s=7.0,
    warm_s=2.0,
    light_warm_s=1.0,
    unloaded_s=7.0,
    bound_s=6.0,
    loads=(1.0, 0.3, 5.0),
    bare_again=False,  # a quick run stays under 4 minutes; its load 1 is no verdict anyway
    gateway_warm_s=0.0,  # the same
)
FULL = Plan(
    False,
    window_s=30.0,
    warm_s=5.0,
    light_warm_s=5.0,
    unloaded_s=30.0,
    bound_s=10.0,
    loads=(1.0, 0.3, 0.5, 5.0),
    bare_again=True,
    gateway_warm_s=35.0,  # one load-1 phase: what was measured to be enough (seed 591)
)


@dataclass(frozen=True)
class Run:
    """What every line says about the run."""

    seed: int
    engine: str
    replicas: int
    pinned: bool
    deadlines: str  # "sent" (x-request-timeout) or "none"
    kv_blocks: int | None = None  # vLLM's KV cache in blocks (`--kv-blocks`); None: its own


_emit = emitter(BENCH, digits=4)


def emit(run: Run, metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
    """A figure, with what every line says about the run."""
    kv = {"kv_blocks": run.kv_blocks} if run.kv_blocks is not None else {}
    about = {
        "seed": run.seed,
        "engine": run.engine,
        "replicas": run.replicas,
        "pinned": run.pinned,
        "deadlines": run.deadlines,
        **kv,
    }
    _emit(metric, value, unit, **(about | fields))


progress = progress_of(BENCH)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


# --- the workload ---------------------------------------------------------------------------


def offered(load: float) -> dict[str, float]:
    """Each tenant's rate as a fraction of load 1: scaled below it, the excess to `noisy`."""
    if load <= 1.0:
        return {tenant: share * load for tenant, share in SHARES.items()}
    return {**SHARES, "noisy": SHARES["noisy"] + load - 1.0}


class Bodies:
    """Request bodies for the engine measured: vLLM's tokenizer counts a short word as a
    token, the fake engine four characters."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def prompt(self, tokens: int, rng: random.Random) -> str:
        tag = f"r{rng.randrange(10**9)}"  # no prefix shared with another request
        if self.kind == "vllm":
            return tag + " word" * max(1, tokens - 2)
        return tag + "w" * max(0, 4 * tokens - len(tag))

    def body(self, tenant: str, lengths: tuple[int, int], direct: bool, rng: random.Random) -> str:
        klass = CLASS_OF[tenant]
        prompt, output = lengths
        fields: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": self.prompt(prompt, rng)}],
            "max_tokens": output,
        }
        if self.kind == "vllm":
            fields["ignore_eos"] = True
        if klass == "interactive":
            fields |= {"stream": True, "stream_options": {"include_usage": True}}
        if direct:  # what the gateway adds with priority_scheduling
            fields["priority"] = RANK[klass]
        return orjson.dumps(fields).decode()

    def variants(
        self, tenant: str, count: int, seed: int, direct: bool, max_tokens: int | None = None
    ) -> list[str]:
        """`count` bodies for a tenant, the same for every mode at a seed (`direct` only
        adds the priority). `max_tokens`: every one writes exactly that many tokens (the
        unloaded references), from prompts of their own."""
        # The phases' key is the one every printed seed was run with, so that they replay.
        key = "False" if max_tokens is None else f"max{max_tokens}"
        rng = random.Random(f"{seed}/{tenant}/{key}")
        bodies = []
        for _ in range(count):
            prompt, output = MIX[CLASS_OF[tenant]].draw(rng)
            output = output if max_tokens is None else max_tokens
            bodies.append(self.body(tenant, (prompt, output), direct, rng))
        return bodies


def streams(
    bodies: Bodies,
    rates: dict[str, float],
    duration_s: float,
    seed: int,
    direct: bool,
    send_deadlines: bool = True,
) -> list[StreamSpec]:
    """The phase's streams; `send_deadlines` False: no client says when it gives up."""
    result = []
    for tenant in TENANTS:
        if rates.get(tenant, 0.0) <= 0:
            continue
        header_s, client_s = DEADLINES[CLASS_OF[tenant]]
        count = int(rates[tenant] * duration_s * 1.5) + 20  # more than the arrivals drawn
        result.append(
            StreamSpec(
                tenant,
                None if direct else KEYS[tenant],
                rates[tenant],
                "",
                CLASS_OF[tenant] == "interactive",
                header_s if send_deadlines and not direct else None,
                client_s,
                variants=bodies.variants(tenant, count, seed, direct),
            )
        )
    return result


# --- processes ------------------------------------------------------------------------------


class Engine:
    """The engine's process: vLLM's CPU build or the fake."""

    def __init__(self, kind: str, work_dir: Path, extra: Sequence[str] = ()) -> None:
        """`extra`: more vLLM flags."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = work_dir / f"engine-{port}.log"
        self.kind = kind
        if kind == "vllm":
            model = write_tiny_chat_model(default_model(), shape=VLLM)
            command = command_line(engine_python(), model, port, name=MODEL, extra=extra)
            env = environment() | {"VLLM_SERVER_DEV_MODE": "1"}  # for /reset_prefix_cache
            server = ServerProcess(command, self.url + "/health", log, env=env)
            self.server = server.start(timeout_s=400)
        else:
            command = [sys.executable, "-m", "bench.fake_engine", "--port", str(port)]
            command += ["--scheduling-policy", "priority", "--model", MODEL]
            self.server = ServerProcess(command, self.url + "/health", log).start()

    def scrape(self) -> Any:
        return parse_metrics("vllm", httpx.get(self.url + "/metrics", timeout=10).text)

    def counters(self, names: dict[str, str]) -> dict[str, float]:
        """Counters now, summed over their series: {name in /metrics: key} -> {key: sum}."""
        return counter_sums(httpx.get(self.url + "/metrics", timeout=10).text, names)

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sample = self.scrape()
            if not sample.running and not sample.waiting:
                return
            time.sleep(0.2)
        progress(f"engine still busy after {timeout_s:g} s")

    def forget_prompts(self) -> None:
        """Empties vLLM's prefix cache (the fake has none). Every phase of a seed sends the
        same bodies, so without this each phase after the first read prompts an earlier
        phase had computed (2026-12-06, seed 71: the bare engine at load 1 read 30% of its
        prompt tokens so, the unloaded reference's; every mode at 0.3 three quarters, its
        own load-1 phase's)."""
        if self.kind != "vllm":
            return
        for _ in range(50):  # it fails while a request holds blocks: wait for it
            answer = httpx.post(self.url + "/reset_prefix_cache", timeout=30)
            answer.raise_for_status()
            if answer.json().get("success"):
                return
            time.sleep(0.2)
        raise RuntimeError("vLLM kept its prefix cache for 10 s: a request holds blocks")

    def stop(self) -> None:
        self.server.stop()


PREFIX_COUNTERS = {
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prefix_cache_queries_total": "queries",
}


def counter_sums(text: str, names: dict[str, str]) -> dict[str, float]:
    """{key: the sum of the series of each counter named} in a /metrics text."""
    found = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            found[names[name]] += float(line.rsplit(" ", 1)[1])
    return found


MAX_BOUND_RPS = 200  # bodies drawn for the bound: more than any engine here completes


def measured_bound_rps(engine: Engine, bodies: Bodies, seconds: float, seed: int) -> float:
    """The engine's completions per second of the mix (load-1 shares, whole answers) under
    a closed loop of 64 clients straight to it."""
    import asyncio

    rng = random.Random(f"{seed}/bound")
    tenants = [t for t, share in SHARES.items() for _ in range(round(share * 20))]
    # Never one body twice: a repeated prompt is read from the engine's prefix cache, and
    # the bound then counts answers the phases, whose prompts are all new, cannot give.
    rounds = math.ceil(MAX_BOUND_RPS * seconds / len(tenants))
    pool = [bodies.body(t, MIX[CLASS_OF[t]].draw(rng), True, rng) for t in tenants * rounds]
    pool = [orjson.dumps({**orjson.loads(b), "stream": False}).decode() for b in pool]
    engine.forget_prompts()

    sent = itertools.count()  # the clients take bodies in turn, each once

    async def client(http: httpx.AsyncClient, until: float, done: list[int]) -> None:
        while time.monotonic() < until:
            if (n := next(sent)) >= len(pool):
                raise RuntimeError(f"the bound's {len(pool)} bodies ran out: raise MAX_BOUND_RPS")
            answer = await http.post(CHAT_PATH, content=pool[n])
            if answer.status_code == 200:
                done.append(1)

    async def run() -> float:
        done: list[int] = []
        limits = httpx.Limits(max_connections=64)
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(
            base_url=engine.url, timeout=120, limits=limits, headers=headers
        ) as http:
            started = time.monotonic()
            await asyncio.gather(*(client(http, started + seconds, done) for _ in range(64)))
            return len(done) / (time.monotonic() - started)

    return asyncio.run(run())


def gateway_config(
    engine_url: str, work_dir: Path, mode: str, limit: int, name: str
) -> dict[str, Any]:
    """bench/capacity.py's gateway for the mode, with its own state file (`name`: one per
    replica) and, for "MODE-no-C", controller C off."""
    base, _, off = mode.partition(ABLATED)
    config = capacity_gateway_config(engine_url, work_dir, base, limit)
    config["state"]["path"] = str(work_dir / f"state-{name}.json")
    config["traffic"] = {"controllers_off": [off] if off else []}
    return config


def capacity_view(readyz: str) -> dict[str, Any]:
    """The first backend's entry of /readyz's `capacity` ({} if none)."""
    return first_backend_view(readyz) or {}


def wait_gateways_idle(gateways: list[Gateway], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    for gateway in gateways:
        while time.monotonic() < deadline:
            answer = httpx.get(gateway.url + "/readyz", timeout=10, headers=OPERATOR)
            view = capacity_view(answer.text)
            if not view.get("in_flight") and not view.get("queued"):
                break
            time.sleep(0.1)


# --- one phase's figures ------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    ttft_ms: float  # interactive time to first token, at most
    tpot_ms: float  # interactive time per output token (streams >= TPOT_MIN_TOKENS), at most


def tpot_ms(record: Record) -> float:
    return (record[3] - record[2]) / (record[7] - 1) if record[7] > 1 else float("nan")


def per_token_ms(result: RoundResult, tokens: int) -> list[float]:
    """Time per output token of each stream of a closed round whose answers all wrote
    `tokens` tokens: as `tpot_ms` reads a record."""
    pairs = zip(result.latencies_ms, result.first_byte_ms, strict=True)
    return [(total - first) / (tokens - 1) for total, first in pairs]


def answered(record: Record) -> bool:
    return record[4] == 200 and record[5] is None


def in_time(record: Record, klass: str) -> bool:
    """Ended within the deadline its class's clients send (`x-request-timeout`)."""
    return record[3] <= DEADLINES[klass][0] * 1000.0


def meets(record: Record, klass: str, objective: Objective) -> bool:
    if not answered(record) or not in_time(record, klass):
        return False
    if klass == "batch":
        return True
    if record[2] > objective.ttft_ms:
        return False
    return record[7] < TPOT_MIN_TOKENS or tpot_ms(record) <= objective.tpot_ms


@dataclass
class Phase:
    result: PhaseResult
    tenants: list[str]  # by stream index
    window: tuple[float, float]

    def records(self, klass: str | None = None, tenant: str | None = None) -> list[Record]:
        """The requests sent inside the window (of a class, a tenant)."""
        return self._in_window(lambda r: r[1], klass, tenant)

    def ended(self, klass: str | None = None, tenant: str | None = None) -> list[Record]:
        """The requests that ended inside the window (of a class, a tenant)."""
        return self._in_window(lambda r: r[1] + r[3] / 1000, klass, tenant)

    def _in_window(
        self, at: Callable[[Record], float], klass: str | None, tenant: str | None
    ) -> list[Record]:
        low, high = self.window
        return [
            r
            for r in self.result.records
            if low <= at(r) < high
            and (klass is None or self.class_of(r) == klass)
            and (tenant is None or self.tenants[r[0]] == tenant)
        ]

    def class_of(self, record: Record) -> str:
        return CLASS_OF[self.tenants[record[0]]]

    @property
    def seconds(self) -> float:
        return self.window[1] - self.window[0]

    def slo_goodput(
        self, objective: Objective, klass: str | None = None, tenant: str | None = None
    ) -> float:
        """Answers that met their SLO and ended inside the window, per second. By the
        time they were sent instead, a gateway holding a deep queue at 5x was credited
        with the answers it gave after arrivals stopped, from the queue the window had
        left it (2026-12-06: admission on the model alone held 518 waiting and counted
        34.7 req/s against 22.5 with the measured drain, at the same output tokens/s)."""
        ended = self.ended(klass, tenant)
        good = [r for r in ended if meets(r, self.class_of(r), objective)]
        return len(good) / self.seconds

    def ttfts(self) -> list[float]:
        return [r[2] for r in self.records("interactive") if answered(r)]

    def tpots(self) -> list[float]:
        kept = self.records("interactive")
        return [tpot_ms(r) for r in kept if answered(r) and r[7] >= TPOT_MIN_TOKENS]

    def tokens_per_s(self, in_deadline: bool = False) -> float:
        """Output tokens of answers completed inside the window, per second; with
        `in_deadline`, of those completed within their class's deadline alone (the bare
        engine finishes answers its client has not yet given up on, up to a second past
        the deadline the gateway would cut them at)."""
        kept = [r for r in self.ended() if answered(r)]
        if in_deadline:
            kept = [r for r in kept if in_time(r, self.class_of(r))]
        return sum(r[7] for r in kept) / self.seconds

    def polled(self, prefix: str) -> list[list[str]]:
        """Each poll's texts whose name starts with `prefix` taken in the window, by poll."""
        low, high = self.window
        return [
            [text for at, text in samples if low <= at < high]
            for name, samples in self.result.polls.items()
            if name.startswith(prefix)
        ]


# Refusals after a wait in the gateway's queue, as the load generator reads their codes:
# dropped when a re-check saw the wait slip past the deadline, or at the deadline.
SLIPPED, AT_DEADLINE = "overloaded:deadline_slipped", "overloaded:deadline_passed"


def figures(
    phase: Phase, objective: Objective, rates: dict[str, float]
) -> dict[tuple[str, str | None], float]:
    """(metric, class) -> value for one phase."""
    out: dict[tuple[str, str | None], float] = {}
    out[("slo_goodput_rps", None)] = phase.slo_goodput(objective)
    for klass in RANK:
        out[("slo_goodput_rps", klass)] = phase.slo_goodput(objective, klass)
    ttfts, tpots = phase.ttfts(), phase.tpots()
    out[("ttft_p50_ms", None)] = percentile(ttfts, 50)
    out[("ttft_p99_ms", None)] = percentile(ttfts, 99)
    out[("p99_ratio_vs_engine_unloaded", None)] = ratio(
        percentile(ttfts, 99), objective.ttft_ms / SLO_FACTOR
    )
    out[("tpot_p99_ms", None)] = percentile(tpots, 99)
    out[("tpot_p99_ratio_vs_unloaded", None)] = ratio(
        percentile(tpots, 99), objective.tpot_ms / SLO_FACTOR
    )
    out[("output_tokens_per_s", None)] = phase.tokens_per_s()
    out[("in_deadline_tokens_per_s", None)] = phase.tokens_per_s(in_deadline=True)
    records = phase.result.records
    out[("client_timeouts", None)] = sum(1 for r in records if r[6])
    streaming = sum(1 for r in records if r[5] == "client_timeout_streaming")
    out[("client_timeouts_streaming", None)] = streaming
    cut = sum(1 for r in records if r[5] == "stream:deadline_exceeded")
    out[("deadline_cut_streams", None)] = cut
    for klass in (None, *RANK):
        out.update(refusal_figures(phase.records(klass), klass))
    batch = [t for t in TENANTS if CLASS_OF[t] == "batch"]
    goodput = {t: phase.slo_goodput(objective, tenant=t) for t in batch}
    fair = max_min_shares({t: rates[t] for t in batch}, sum(goodput.values()))
    out[("jain_fairness", "batch")] = jain([ratio(goodput[t], fair[t]) for t in batch])
    out.update(load_figures(phase))
    out[("loadgen_lag_p99_ms", None)] = phase.result.lag_p99_ms
    return out


def refusal_figures(records: list[Record], klass: str | None) -> Figures:
    """Refusals of the requests sent in the window (`records`, of one class or all): by
    class too, so that a late refusal says whose wait it ended (the top class waits for
    slots alone, lower classes for the pacer and the prefill gate as well)."""
    refused = [r for r in records if r[4] in (429, 503)]
    late = sum(1 for r in refused if r[5] in (SLIPPED, AT_DEADLINE))
    at_deadline = sum(1 for r in refused if r[5] == AT_DEADLINE)
    return {
        ("refused_share", klass): ratio(len(refused), len(records)),
        ("refusal_latency_p99_ms", klass): percentile([r[3] for r in refused], 99),
        ("refused_late_share", klass): ratio(late, len(refused)),
        ("refused_at_deadline_share", klass): ratio(at_deadline, len(refused)),
    }


def load_figures(phase: Phase) -> dict[tuple[str, str | None], float]:
    out: dict[tuple[str, str | None], float] = {}
    replicas = phase.polled("readyz")
    if replicas:
        for metric, key in (
            ("concurrency_limit_mean", "limit"),
            ("in_flight_mean", "in_flight"),
            ("queued_mean", "queued"),
        ):
            means = [mean(capacity_view(text).get(key) for text in texts) for texts in replicas]
            out[(metric, None)] = sum(means)
    out.update(limit_figures(replicas))
    engine = [t for t in next(iter(phase.polled("engine")), []) if not t.startswith("error")]
    samples = [parse_metrics("vllm", text) for text in engine]
    out[("engine_running_mean", None)] = mean(s.running for s in samples)
    out[("engine_waiting_mean", None)] = mean(s.waiting for s in samples)
    preempted = [s.preemptions for s in samples if s.preemptions is not None]
    out[("preemptions", None)] = preempted[-1] - preempted[0] if preempted else float("nan")
    out[("engine_prefix_hit_rate", None)] = prefix_hit_rate(engine)
    return out


def prefix_hit_rate(texts: list[str]) -> float:
    """Prompt tokens the engine read from its prefix cache between the first and the last
    of its /metrics `texts`, of those it looked up. This workload shares no prefix between
    requests, so anything above a few percent is a request seen by an earlier phase."""
    if len(texts) < 2:
        return float("nan")
    first, last = (counter_sums(texts[i], PREFIX_COUNTERS) for i in (0, -1))
    return ratio(last["hits"] - first["hits"], last["queries"] - first["queries"])


def limit_figures(replicas: list[list[str]]) -> dict[tuple[str, str | None], float]:
    """Where the learned limit came from (the first gateway replica's engine replica):
    the two limiters' means, and the share of polls the latency limiter was measuring its
    baseline (its limit pinned at half)."""
    views = [v for text in (replicas[0] if replicas else []) if (v := replica_view(text))]
    if not views or views[0].get("mode") != "adaptive":
        return {}
    latency = [v.get("latency") or {} for v in views]
    return {
        ("engine_limit_mean", None): mean(v.get("engine_limit") for v in views),
        ("latency_limit_mean", None): mean(v.get("latency_limit") for v in views),
        ("latency_measuring_share", None): mean(
            float(lat.get("phase") == "measuring_min") for lat in latency if lat
        ),
    }


def limit_trace(phase: Phase) -> list[dict[str, Any]]:
    """The first gateway's learned limit through the whole phase, one row per /readyz
    poll (every 0.5 s), with the engine's running and waiting from its nearest poll."""
    polls = phase.result.polls
    engine = [
        (at, parse_metrics("vllm", text))
        for at, text in polls.get("engine", [])
        if not text.startswith("error")
    ]
    rows = []
    for at, text in polls.get("readyz-0", []):
        if text.startswith("error"):
            continue
        view, replica = capacity_view(text), replica_view(text)
        latency = replica.get("latency") or {}
        nearest = min(engine, key=lambda e: abs(e[0] - at))[1] if engine else None
        rows.append(
            {
                "t_s": round(at, 2),
                "limit": view.get("limit"),
                "in_flight": view.get("in_flight"),
                "queued": view.get("queued"),
                "pace_per_s": view.get("pace_per_s"),
                "latency_phase": latency.get("phase"),
                "latency_cause": latency.get("cause"),
                "engine_running": nearest.running if nearest else None,
                "engine_waiting": nearest.waiting if nearest else None,
            }
        )
    return rows


def replica_view(readyz: str) -> dict[str, Any]:
    """The first engine replica's entry of the first backend's /readyz capacity view."""
    replicas = capacity_view(readyz).get("replicas") or [{}]
    first = replicas[0]
    return first if isinstance(first, dict) else {}


def mean(values: Iterable[Any]) -> float:
    kept = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.fmean(kept) if kept else float("nan")


UNITS = {
    "slo_goodput_rps": "req/s",
    "output_tokens_per_s": "tokens/s",
    "in_deadline_tokens_per_s": "tokens/s",
    "client_timeouts": "requests",
    "client_timeouts_streaming": "requests",
    "deadline_cut_streams": "requests",
    "refused_share": "fraction",
    "refused_late_share": "fraction",
    "refused_at_deadline_share": "fraction",
    "jain_fairness": "index",
    "preemptions": "requests",
    "engine_prefix_hit_rate": "ratio",
    "engine_running_mean": "requests",
    "engine_waiting_mean": "requests",
    "concurrency_limit_mean": "requests",
    "in_flight_mean": "requests",
    "queued_mean": "requests",
    "engine_limit_mean": "requests",
    "latency_limit_mean": "requests",
    "latency_measuring_share": "fraction",
}


def unit_of(metric: str) -> str:
    if metric in UNITS:
        return UNITS[metric]
    return "ratio" if "ratio" in metric else "ms"


POOLED = "throughput_ratio_vs_bare_both"  # load 1, against both bare phases' mean


def bare_again_ratio(first: Figures, again: Figures) -> float:
    """The second bare load-1 phase's output tokens over the first's."""
    key = ("output_tokens_per_s", None)
    return ratio(again[key], first[key])


def pooled_throughput_ratios(
    results: dict[tuple[int, str, float], Figures], seed: int, modes: list[str], again: Figures
) -> dict[str, float]:
    """Each mode's load-1 output tokens over the mean of the bare engine's two load-1
    phases (`Bench.bare_again`), for the modes that ran at load 1."""
    key = ("output_tokens_per_s", None)
    reference = (results[(seed, "bare", 1.0)][key] + again[key]) / 2
    return {
        mode: ratio(results[(seed, mode, 1.0)][key], reference)
        for mode in modes
        if (seed, mode, 1.0) in results
    }


def versus_bare(
    own: dict[tuple[str, str | None], float], bare: dict[tuple[str, str | None], float]
) -> dict[tuple[str, str | None], float]:
    out: dict[tuple[str, str | None], float] = {}
    for klass in (None, *RANK):
        out[("slo_goodput_ratio_vs_bare", klass)] = ratio(
            own[("slo_goodput_rps", klass)], bare[("slo_goodput_rps", klass)]
        )
    out[("throughput_ratio_vs_bare", None)] = ratio(
        own[("output_tokens_per_s", None)], bare[("output_tokens_per_s", None)]
    )
    out[("in_deadline_throughput_ratio_vs_bare", None)] = ratio(
        own[("in_deadline_tokens_per_s", None)], bare[("in_deadline_tokens_per_s", None)]
    )
    for q in ("p50", "p99"):
        out[(f"ttft_{q}_ratio_vs_bare", None)] = ratio(
            own[(f"ttft_{q}_ms", None)], bare[(f"ttft_{q}_ms", None)]
        )
    return out


# --- the run ----------------------------------------------------------------------------------


Figures = dict[tuple[str, str | None], float]


class Bench:
    def __init__(
        self,
        plan: Plan,
        kind: str,
        work_dir: Path,
        run: Run,
        modes: list[str],
        bound_rps: float | None = None,
        trace: bool = False,
    ) -> None:
        """`bound_rps`: load 1 given (`--bound-rps`); None: measured first. `trace`: the
        learned limit through each phase (`limit_trace`) too."""
        self.trace = trace
        self.plan = plan
        self.kind = kind
        self.work_dir = work_dir
        self.run = run
        self.modes = modes
        self.bodies = Bodies(kind)
        self.engine: Engine | None = None
        self.loadgen: LoadGenerator | None = None
        self.gateways: dict[str, list[Gateway]] = {}
        self.results: dict[tuple[int, str, float], Figures] = {}  # (seed, mode, load)
        self.bound_rps = bound_rps

    def start(self, pin: bool) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        if pin and len(cpus) < 2:
            raise RuntimeError("--pin on needs at least 2 CPUs")
        progress(f"starting the engine ({self.run.engine})")
        blocks = self.run.kv_blocks
        extra = ["--num-gpu-blocks-override", str(blocks)] if blocks is not None else []
        with on_cpus({cpus[0]} if pin else None):
            self.engine = Engine(self.kind, self.work_dir, extra)
        if pin:  # the gateways and the load generator it starts next, and this script
            os.sched_setaffinity(0, set(cpus[1:]))
        self.loadgen = LoadGenerator().start()
        progress("the engine and the load generator are up")

    def stop(self) -> None:
        for replicas in self.gateways.values():
            for gateway in replicas:
                gateway.stop()
        if self.loadgen is not None:
            self.loadgen.stop()
        if self.engine is not None:
            self.engine.stop()

    def phase(
        self,
        mode: str,
        load: float,
        seed: int,
        rates: dict[str, float],
        duration_s: float,
        window_s: float,
    ) -> Phase:
        assert self.engine is not None and self.loadgen is not None
        direct = mode == "bare"
        replicas = self.gateways.get(mode, [])
        urls = [self.engine.url + CHAT_PATH] if direct else [g.url + CHAT_PATH for g in replicas]
        send = self.run.deadlines == "sent"
        specs = streams(self.bodies, rates, duration_s, seed, direct, send)
        client_s = max(DEADLINES[CLASS_OF[s.tenant]][1] for s in specs)
        polls = [Poll("engine", self.engine.url + "/metrics", 0.5, 0.0, duration_s)]
        polls += [
            Poll(f"readyz-{i}", g.url + "/readyz", 0.5, 0.0, duration_s, headers=OPERATOR)
            for i, g in enumerate(replicas)
        ]
        spec = PhaseSpec(
            url=urls[0],
            duration_s=duration_s,
            cutoff_s=duration_s + client_s + 1.0,
            seed=seed * 100 + round(load * 10),
            streams=specs,
            polls=polls,
            urls=urls,
        )
        self.engine.forget_prompts()
        result = self.loadgen.open(spec)
        self.engine.wait_idle()
        wait_gateways_idle(replicas)
        return Phase(result, [s.tenant for s in specs], (duration_s - window_s, duration_s))

    def objective(self, run: Run) -> Objective:
        seed, seconds = run.seed, self.plan.unloaded_s
        firsts = self.one_at_a_time(seed, seconds, 1).first_byte_ms
        long_ = self.one_at_a_time(seed, seconds, TPOT_MIN_TOKENS)
        per_token = per_token_ms(long_, TPOT_MIN_TOKENS)
        streamed = percentile(long_.first_byte_ms, 99)
        emit(run, "unloaded_stream_ttft_p99_ms", streamed, "ms", samples=len(per_token))
        ttft, tpot = percentile(firsts, 99), percentile(per_token, 99)
        emit(run, "unloaded_ttft_p99_ms", ttft, "ms", samples=len(firsts))
        emit(run, "unloaded_tpot_p99_ms", tpot, "ms", samples=len(per_token))
        if not ttft > 0 or not tpot > 0:
            raise RuntimeError("the unloaded references measured nothing")
        progress(f"seed {seed}, unloaded: TTFT p99 {ttft:.1f} ms, TPOT p99 {tpot:.1f} ms")
        return Objective(SLO_FACTOR * ttft, SLO_FACTOR * tpot)

    def one_at_a_time(self, seed: int, seconds: float, max_tokens: int) -> RoundResult:
        """Interactive prompts streamed straight to the engine one at a time for `seconds`,
        each answering `max_tokens` tokens: an unloaded reference."""
        assert self.engine is not None and self.loadgen is not None
        bodies = self.bodies.variants("interactive", 256, seed, True, max_tokens)
        url = self.engine.url + CHAT_PATH
        headers = {"content-type": "application/json"}
        self.engine.forget_prompts()
        result = self.loadgen.closed(RoundSpec(url, headers, bodies, 1, seconds, stream=True))
        self.engine.wait_idle()
        if result.errors:
            raise RuntimeError(f"an unloaded reference failed: {result.first_error}")
        return result

    def find_bound(self) -> dict[str, Any]:
        """Load 1 (`self.bound`): measured, or given as `bound_rps`; returns what its
        `bound_rps` line says of where it came from."""
        assert self.engine is not None
        if self.bound_rps is None:
            seconds, seed = self.plan.bound_s, self.run.seed
            self.bound = measured_bound_rps(self.engine, self.bodies, seconds, seed)
            progress(f"load 1 measured: {self.bound:.1f} req/s")
            source: dict[str, Any] = {"clients": 64}
        else:
            self.bound = self.bound_rps
            source = {"given": True}
        self.engine.wait_idle()
        return source

    def measure(self, repeats: int) -> None:
        source = self.find_bound()
        emit(self.run, "bound_rps", self.bound, "req/s", **source)
        for repeat in range(repeats):
            run = replace(self.run, seed=self.run.seed + repeat)
            # Each seed's references right before its phases: this machine's speed drifts
            # over a run (a reference taken once moved by half between runs an hour apart).
            objective = self.objective(run)
            for position, mode in enumerate(self.mode_order(run)):
                if position == 1 and repeat == 0:  # the run's first gateway mode
                    self.warm_gateways(run, mode)
                self.mode_phases(run, objective, mode)
            if self.plan.bare_again:
                self.bare_again(run, objective)

    def warm_gateways(self, run: Run, mode: str) -> None:
        """Before the run's first gateway mode, once: `mode`'s gateways at load 1 for
        `plan.gateway_warm_s`, measured by nothing, then stopped.

        The first gateway mode of a run did worse at load 1 than the next in six runs of six
        (2026-12-07, docs/slo-goodput.md): by 0.07-0.21 of the bare engine's output, while
        the bare engine did not slow down between its own load-1 phases, and the same mode
        run again did not (seed 591: adaptive-metrics 0.89 first, 0.94 and 0.92 after
        another gateway had run). Whatever the first gateway meets once, a stall at load 1
        leaves a backlog that nothing drains (the engine has no room to spare there), so it
        lasts the window."""
        if self.plan.gateway_warm_s <= 0:
            return
        progress(f"seed {run.seed}, load 1: {mode}, a warm-up measured by nothing")
        self.start_gateways(mode, self.mode_limit(run, mode))
        try:
            warm_s = self.plan.gateway_warm_s
            self.phase(mode, 1.0, run.seed, self.rates(1.0), warm_s, warm_s)
        finally:
            for gateway in self.gateways.pop(mode, []):
                gateway.stop()

    def bare_again(self, run: Run, objective: Objective) -> None:
        """Bare's load-1 phase once more, after every gateway mode, and the gateway modes'
        load-1 throughput against the mean of the two (`pooled_throughput_ratios`).

        At load 1 the bare engine is at its ceiling, where a queue neither grows nor drains
        for long, and its output moved by 17% over four bare phases of the same arrivals
        back to back (seed 571, 582-704 tokens/s; docs/slo-goodput.md): one phase is too
        noisy a reference for a 0.95 target, and one taken first flatters every mode that
        ran while the machine sped up (or the reverse). Two phases, one before and one after
        the gateway modes, halve the reference's variance and cancel a steady drift;
        `bare_again_ratio` is their own spread."""
        progress(f"seed {run.seed}, load 1: bare, again")
        _, again = self.measured_phase(run, objective, "bare", 1.0)
        first = self.results[(run.seed, "bare", 1.0)]
        emit(
            run, "bare_again_ratio", bare_again_ratio(first, again), "ratio", mode="bare", load=1.0
        )
        modes = [m for m in self.modes if m != "bare"]
        for mode, value in pooled_throughput_ratios(self.results, run.seed, modes, again).items():
            self.results[(run.seed, mode, 1.0)][(POOLED, None)] = value
            emit(run, POOLED, value, "ratio", mode=mode, load=1.0)

    def mode_order(self, run: Run) -> list[str]:
        """Bare first (the others are judged against it, `fixed` takes its limit from it),
        then the gateway modes in an order shuffled by the seed: run in a fixed order, the
        first gateway mode of every seed did worst at load 1 (2026-12-06), where two of
        the modes beside it could not differ from it (controllers that only refuse, and
        nothing was refused).

        A mode and its ablations (`--ablate`) run one after the other, in an order of
        their own drawn from the seed: shuffled among all the modes, a pair ran up to
        three places apart, and the machine's speed moved by a fifth within a run (seeds
        632-633, docs/slo-goodput.md), more than what the pairs differed by."""
        groups: dict[str, list[str]] = {}
        for mode in self.modes:
            if mode != "bare":
                groups.setdefault(mode.partition(ABLATED)[0], []).append(mode)
        bases = list(groups)
        random.Random(f"{run.seed}/order").shuffle(bases)
        within = random.Random(f"{run.seed}/pairs")
        order = []
        for base in bases:
            within.shuffle(groups[base])  # a mode alone: nothing drawn, order unchanged
            order += groups[base]
        for position, mode in enumerate(order, 1):
            emit(run, "mode_order", position, "position", mode=mode)
        return ["bare", *order]

    def mode_phases(self, run: Run, objective: Objective, mode: str) -> None:
        """Every load for one mode, its gateways started for them and stopped after (an
        idle gateway still reads the engine's metrics, on the engine's CPU)."""
        if mode != "bare":
            limit = self.mode_limit(run, mode)
            if mode == "fixed":
                basis = "bare engine's mean running count at load 1"
                emit(run, "fixed_limit", limit, "requests", basis=basis)
            self.start_gateways(mode, limit)
        try:
            for load in self.plan.loads:
                self.load_phase(run, objective, mode, load)
        finally:
            for gateway in self.gateways.pop(mode, []):
                gateway.stop()

    def load_phase(self, run: Run, objective: Objective, mode: str, load: float) -> None:
        progress(f"seed {run.seed}, load {load:g}: {mode}")
        phase, own = self.measured_phase(run, objective, mode, load)
        if mode != "bare":
            own |= versus_bare(own, self.results[(run.seed, "bare", load)])
        if load > 1.0:  # overloaded, the bare engine may meet no objective at all
            at_one = self.results[(run.seed, "bare", 1.0)][("slo_goodput_rps", None)]
            own[("slo_goodput_ratio_vs_bare_load1", None)] = ratio(
                own[("slo_goodput_rps", None)], at_one
            )
        self.results[(run.seed, mode, load)] = own
        for (metric, klass), value in own.items():
            extra = {} if klass is None else {"class": klass}
            emit(run, metric, value, unit_of(metric), mode=mode, load=load, **extra)
        for row in limit_trace(phase) if self.trace and mode != "bare" else []:
            limit = row.pop("limit")
            emit(run, "limit_trace", limit, "requests", mode=mode, load=load, **row)

    def rates(self, load: float) -> dict[str, float]:
        """Each tenant's arrivals per second at `load` (`offered`) times load 1."""
        return {t: r * self.bound for t, r in offered(load).items()}

    def measured_phase(
        self, run: Run, objective: Objective, mode: str, load: float
    ) -> tuple[Phase, Figures]:
        """One phase of the plan's length at `load` through `mode`, and its figures."""
        rates, window = self.rates(load), self.plan.window_s
        duration = self.plan.warm_up_s(load) + window
        phase = self.phase(mode, load, run.seed, rates, duration, window)
        return phase, figures(phase, objective, rates)

    def start_gateways(self, mode: str, limit: int) -> None:
        assert self.engine is not None
        configs = {
            f"{mode}#{i}": gateway_config(
                self.engine.url, self.work_dir, mode, limit, f"{mode}-{i}"
            )
            for i in range(self.run.replicas)
        }
        started = start_all(configs, self.work_dir)
        self.gateways[mode] = [started[name] for name in sorted(started)]

    def mode_limit(self, run: Run, mode: str) -> int:
        """The limit a mode's gateways start with: for `fixed`, the bare engine's mean
        running count at load 1 (the best hand-set limit); 1 (unused) for the others."""
        if mode != "fixed":
            return 1
        running = self.results[(run.seed, "bare", 1.0)][("engine_running_mean", None)]
        return max(1, round(running)) if not math.isnan(running) else 1


def summarise(bench: Bench, seeds: list[int]) -> None:
    """With several repeats: each figure's median, low and high over them."""
    for mode in bench.modes:
        for load in bench.plan.loads:
            runs = [
                bench.results[(s, mode, load)] for s in seeds if (s, mode, load) in bench.results
            ]
            for key in runs[0] if runs else {}:
                values = [r[key] for r in runs if not math.isnan(r.get(key, float("nan")))]
                if not values:
                    continue
                extra = {} if key[1] is None else {"class": key[1]}
                emit(
                    bench.run,
                    key[0],
                    statistics.median(values),
                    unit_of(key[0]),
                    mode=mode,
                    load=load,
                    repeat="all",
                    low=round(min(values), 4),
                    high=round(max(values), 4),
                    seeds=seeds,
                    **extra,
                )


def targets(bench: Bench, seeds: list[int]) -> None:
    """The issue's targets per adaptive mode, on the medians over the repeats."""
    light = [load for load in bench.plan.loads if load < 1.0]
    for mode in bench.modes:
        if mode.partition(ABLATED)[0] not in ADAPTIVE:
            continue

        def median(load: float, metric: str, klass: str | None = None, mode: str = mode) -> float:
            values = [bench.results[(s, mode, load)].get((metric, klass), math.nan) for s in seeds]
            kept = [v for v in values if not math.isnan(v)]
            return statistics.median(kept) if kept else math.nan

        checks = {
            # on the rates: where the bare engine meets no objective its ratio is undefined
            "slo_goodput": goodput_at_least_bare(bench, mode, 5.0, seeds),
            "ttft_p99": median(5.0, "p99_ratio_vs_engine_unloaded") <= SLO_FACTOR,
            "tpot_p99": median(5.0, "tpot_p99_ratio_vs_unloaded") <= SLO_FACTOR,
            "client_timeouts": median(5.0, "client_timeouts") == 0,
            "jain": median(5.0, "jain_fairness", "batch") >= 0.95,
            "refusal_p99": not median(5.0, "refusal_latency_p99_ms") > 50.0,
            "throughput_load1": load1_throughput(median) >= 0.95,
            # Against a bare phase minutes earlier, within the noise of the machine's drift
            # and of a p99 over about a hundred answers: bench/light_load_paired.py judges
            # the same bound with both halves in one phase, and the engine against itself.
            "light_ttft": all(light_ok(bench, mode, load, seeds) for load in light),
        }
        failed = [name for name, ok in checks.items() if not ok]
        emit(
            bench.run, "target_met", int(not failed), "bool", mode=mode, failed=failed, seeds=seeds
        )


def load1_throughput(median: Callable[[float, str], float]) -> float:
    """Load 1's throughput ratio: against both bare phases where the plan ran bare's
    load 1 again (`Bench.bare_again`), else against the one."""
    both = median(1.0, POOLED)
    return both if not math.isnan(both) else median(1.0, "throughput_ratio_vs_bare")


def goodput_at_least_bare(bench: Bench, mode: str, load: float, seeds: list[int]) -> bool:
    """SLO goodput at least the bare engine's at the same load, on the median of each."""
    own = [bench.results[(s, mode, load)][("slo_goodput_rps", None)] for s in seeds]
    bare = [bench.results[(s, "bare", load)][("slo_goodput_rps", None)] for s in seeds]
    return statistics.median(own) >= statistics.median(bare)


def light_ok(bench: Bench, mode: str, load: float, seeds: list[int]) -> bool:
    """TTFT p50 and p99 within 10% plus 2 ms of the bare engine's at the same light load."""
    for seed in seeds:
        own, bare = bench.results.get((seed, mode, load)), bench.results.get((seed, "bare", load))
        if own is None or bare is None:
            return False
        for q in ("ttft_p50_ms", "ttft_p99_ms"):
            if not own[(q, None)] <= bare[(q, None)] * 1.1 + 2.0:
                return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--engine", choices=("vllm", "fake"), default="vllm")
    parser.add_argument(
        "--seed", type=int, default=None, help="replay a run (default: a fresh one)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="seeds per load (quick 1, full 3)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="gateway replicas per mode")
    parser.add_argument(
        "--bound-rps",
        type=float,
        default=None,
        help="load 1 in requests/s, instead of measuring it (to compare two versions)",
    )
    parser.add_argument("--pin", choices=("off", "on"), default="off")
    parser.add_argument(
        "--deadlines",
        choices=("sent", "none"),
        default="sent",
        help="none: clients send no x-request-timeout (they still give up as before)",
    )
    parser.add_argument("--modes", default=None, help=f"comma-separated, of {','.join(MODES)}")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="vLLM's KV cache in blocks of 128 tokens (--num-gpu-blocks-override): small "
        "enough, and the engine preempts",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also the first gateway's limit every 0.5 s of each phase (limit_trace lines)",
    )
    parser.add_argument(
        "--ablate",
        default="",
        help=f"comma-separated, of {','.join(CONTROLLERS)}: each adaptive mode again with it off",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    modes = (
        args.modes or ("bare,adaptive-metrics,adaptive-latency" if args.quick else ",".join(MODES))
    ).split(",")
    unknown = set(modes) - set(MODES)
    if unknown or "bare" not in modes:
        parser.error(f"--modes: bare and some of {', '.join(MODES)}; got {args.modes}")
    modes = ["bare", *[m for m in MODES if m in modes and m != "bare"]]
    ablate = [c for c in args.ablate.split(",") if c]
    if set(ablate) - set(CONTROLLERS):
        parser.error(f"--ablate: some of {', '.join(CONTROLLERS)}; got {args.ablate}")
    modes += [f"{m}{ABLATED}{c}" for m in ADAPTIVE if m in modes for c in ablate]
    if args.engine == "vllm" and not engine_python().exists():
        print(f"{engine_python()} is missing: run `make engine` first", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    repeats = args.repeats or (1 if args.quick else 3)
    engine_name = ENGINE_NAME if args.engine == "vllm" else "fake"
    if args.kv_blocks is not None and (args.engine != "vllm" or args.kv_blocks < 8):
        parser.error("--kv-blocks: vLLM only, and at least 8 (one 1,024-token request)")
    run = Run(seed, engine_name, args.replicas, args.pin == "on", args.deadlines, args.kv_blocks)
    progress(f"seed {seed} (replay with --seed {seed}), engine {engine_name}, modes {modes}")
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="slo-goodput-") as folder:
        bench = Bench(plan, args.engine, Path(folder), run, modes, args.bound_rps, args.trace)
        try:
            bench.start(args.pin == "on")
            bench.measure(repeats)
        finally:
            bench.stop()
        seeds = [seed + i for i in range(repeats)]
        if repeats > 1:
            summarise(bench, seeds)
        targets(bench, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
