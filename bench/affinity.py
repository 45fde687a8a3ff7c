"""Replica affinity on two real vLLM replicas, with a multi-turn workload: the engines' own
prefix-cache hit rate and the clients' time to first token, affinity on and off.

Setup: two vLLM engines (CPU build, the tiny random Llama, prefix caching on; on CPU a
cache block is 128 tokens), one gateway whose backend lists both (`base_url` and
`base_urls`), once with `affinity: true` and once with `affinity: false`, in the same run.
Each mode gets fresh conversations (its own seed's words), so neither finds the other's
prefixes in the engines' caches.

Workload: `--sessions` conversations (16; quick 8), all at once (`--concurrency`),
`--turns` turns each (6; quick 4), a user's thinking time between turns (exponential, mean
`--think-s` 2 s). A conversation is a system prompt shared by all, a first user message of
about 300 tokens of its own, then per turn the model's streamed answer (24 tokens) and a
new user message of about 20 tokens; each turn sends the whole conversation so far, as
chat clients do. Without the thinking time a closed loop sends a session's next turn the
instant its replica frees a slot, so even choice by headroom sends it back there.
`--key header` sends `x-session-id` (the session key); `--key prefix` sends none (the
first two messages are the key).

Metrics (JSON lines with bench, seed, engine, mode, key):
    prefix_cache_hit_rate   hits / queries of both engines' `vllm:prefix_cache_*_total`
                            over the mode (tokens; first turns, which cannot hit, included)
    later_turns_cached_share  of the prompt tokens of the turns after the first, the share
                            the engine read from its prefix cache (each answer's
                            `usage.prompt_tokens_details.cached_tokens`)
    ttft_p50_ms, ttft_p99_ms   client-side, to the first streamed bytes, turns after the first
    engine_share_max        the busier engine's share of the requests
    {cached_share,hit_rate,ttft_p50,ttft_p99}_ratio_on_vs_{off,round_robin}

Modes, in one run on the same engines: `on` and `off` (the gateway with `affinity: true`
and `false`; off, it sends each request to the replica with the most headroom, and at light
load, ties, to the first), and `round-robin` (no gateway: the client sends each request to
the next engine, as a round-robin balancer in front of the engines would).

With `--pin on` (the default) each engine runs on a CPU of its own, as replicas on their
own GPUs do; the gateway and the clients share both CPUs.

Run: python bench/affinity.py [--quick] [--seed N] [--repeats N] [--key header|prefix]
                              [--pin on|off]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import orjson

from backends.spawn import on_cpus
from bench.capacity import MODEL
from bench.measure import percentile
from bench.processes import Gateway, start_gateway, unwind_on_sigterm
from bench.report import emitter, progress_of
from bench.slo_goodput import PREFIX_COUNTERS, Engine

BENCH = "affinity"
KEY = "sk-bench-affinity-0123456789abcdef"
SYSTEM = "You are a careful assistant. Answer the question about the text in a few words."
WORDS = [
    "river",
    "stone",
    "market",
    "winter",
    "garden",
    "letter",
    "silver",
    "orange",
    "window",
    "mountain",
    "forest",
    "engine",
    "paper",
    "castle",
    "bridge",
    "harbor",
    "lantern",
    "meadow",
    "copper",
    "violin",
    "island",
    "signal",
    "ladder",
    "pocket",
    "thunder",
    "candle",
    "rabbit",
    "saddle",
    "timber",
    "velvet",
    "whistle",
    "anchor",
    "basket",
    "cotton",
    "dragon",
    "feather",
    "glacier",
    "hammer",
    "jacket",
    "kettle",
    "lemon",
    "marble",
    "needle",
    "oyster",
    "pepper",
    "quilt",
    "ribbon",
    "spider",
    "tunnel",
    "umbrella",
    "valley",
    "walnut",
    "yellow",
    "zipper",
    "arrow",
    "blanket",
    "canyon",
    "desert",
    "falcon",
    "gravel",
]


emit = emitter(BENCH)


progress = progress_of(BENCH)


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def started_on(cpu: int | None, work: Path) -> Engine:
    """An engine whose processes run on `cpu` alone (they inherit this process's CPU set
    while it starts them); None: on every CPU."""
    with on_cpus(None if cpu is None else {cpu}):
        # Each answer's prefix-cache hits in its usage (`cached_tokens`).
        return Engine("vllm", work, extra=["--enable-prompt-tokens-details"])


def gateway_config(urls: list[str], work: Path, affinity: bool) -> dict[str, Any]:
    return {
        "state": {"url": "memory", "path": str(work / f"state-{affinity}.json")},
        "cache": {"enabled": False},  # every turn must reach an engine
        "backends": [
            {
                "name": "vllm",
                "kind": "http",
                "base_url": urls[0],
                "base_urls": urls[1:],
                "models": [MODEL],
                "engine": "vllm",
                "affinity": affinity,
                "timeouts": {"read_s": 120},
            }
        ],
        "tenants": [{"name": "bench", "keys": [{"env": "BENCH_AFFINITY_KEY"}]}],
    }


def counters(engine: Engine) -> dict[str, float]:
    return engine.counters(PREFIX_COUNTERS | {"vllm:request_success_total": "requests"})


@dataclass
class Turn:
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int  # of the prompt, read from the engine's prefix cache


async def conversation(
    client: Targets,
    rng: random.Random,
    session: str,
    turns: int,
    key: str,
    think_s: float,
) -> list[Turn]:
    """One session's turns in order, a user's thinking time between them (exponential,
    mean `think_s`); the turns after the first."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": words(rng, 300)},
    ]
    headers = {"authorization": f"Bearer {KEY}"}
    if key == "header":
        headers["x-session-id"] = session
    done: list[Turn] = []
    for turn in range(turns):
        if turn:
            await asyncio.sleep(rng.expovariate(1 / think_s) if think_s > 0 else 0)
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 24,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        usage: dict[str, Any] = {}
        started = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        async with client.http.stream(
            "POST", client.next() + "/v1/chat/completions", json=body, headers=headers
        ) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {(await answer.aread())[:200]!r}")
            async for line in answer.aiter_lines():
                if first is None and line.startswith("data: "):
                    first = time.perf_counter() - started
                if line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        parts.append((choice.get("delta") or {}).get("content") or "")
        if turn > 0 and first is not None:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            done.append(Turn(first * 1000, int(usage.get("prompt_tokens") or 0), int(cached)))
        messages += [
            {"role": "assistant", "content": "".join(parts)},
            {"role": "user", "content": words(rng, 20)},
        ]
    return done


@dataclass
class Targets:
    """Where each request goes: the gateway, or the engines in turn (round-robin)."""

    http: httpx.AsyncClient
    urls: list[str]
    sent: int = 0

    def next(self) -> str:
        self.sent += 1
        return self.urls[self.sent % len(self.urls)]


async def workload(urls: list[str], seed: int, args: argparse.Namespace) -> list[Turn]:
    sessions, concurrency, turns = args.sessions, args.concurrency, args.turns
    key, think_s = args.key, args.think_s
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=180, limits=limits) as http:
        client = Targets(http, urls)

        async def one(index: int) -> list[Turn]:
            async with gate:
                rng = random.Random(f"{seed}/{index}")
                session = f"session-{seed}-{index}"
                return await conversation(client, rng, session, turns, key, think_s)

        done = await asyncio.gather(*(one(i) for i in range(sessions)))
    return [turn for turns_ in done for turn in turns_]


def measure(
    engines: list[Engine], work: Path, mode: str, seed: int, args: argparse.Namespace
) -> dict[str, float]:
    """One mode's figures: `on`, `off` (the gateway's affinity), `round-robin` (no gateway:
    the client sends each request to the next engine, as a round-robin balancer would)."""
    if mode == "round-robin":
        return figures(engines, lambda: asyncio.run(workload([e.url for e in engines], seed, args)))
    urls = [e.url + "/v1" for e in engines]
    folder = work / f"gw-{mode}"
    folder.mkdir(exist_ok=True)
    gateway: Gateway = start_gateway(gateway_config(urls, work, mode == "on"), folder)
    try:
        return figures(engines, lambda: asyncio.run(workload([gateway.url], seed, args)))
    finally:
        gateway.stop()


def figures(engines: list[Engine], run: Callable[[], list[Turn]]) -> dict[str, float]:
    before = [counters(e) for e in engines]
    turns = run()
    after = [counters(e) for e in engines]
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    queries = sum(d["queries"] for d in delta)
    requests = [d["requests"] for d in delta]
    ttfts = [t.ttft_ms for t in turns]
    prompted = sum(t.prompt_tokens for t in turns)
    return {
        "later_turns_cached_share": sum(t.cached_tokens for t in turns) / prompted
        if prompted
        else float("nan"),
        "prefix_cache_hit_rate": sum(d["hits"] for d in delta) / queries
        if queries
        else float("nan"),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "engine_share_max": max(requests) / sum(requests) if sum(requests) else float("nan"),
    }


MODES = ("on", "off", "round-robin")
UNITS = {
    "later_turns_cached_share": "ratio",
    "prefix_cache_hit_rate": "ratio",
    "ttft_p50_ms": "ms",
    "ttft_p99_ms": "ms",
    "engine_share_max": "ratio",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--key", choices=["header", "prefix"], default="header")
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    # A user reads and types between turns: without that pause a closed loop sends a
    # session's next turn the instant its replica frees the slot, back to that replica.
    parser.add_argument("--think-s", type=float, default=2.0)
    parser.add_argument("--turns", type=int, default=None)
    # Each engine on a CPU of its own, as replicas on their own GPUs are (the gateway and
    # the clients share both): unpinned, two engines on two cores contend for both.
    parser.add_argument("--pin", choices=("on", "off"), default="on")
    args = parser.parse_args(argv)
    args.sessions = args.sessions or (8 if args.quick else 16)
    args.turns = args.turns or (4 if args.quick else 6)
    args.concurrency = args.concurrency or args.sessions
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    os.environ["BENCH_AFFINITY_KEY"] = KEY
    fields = {"seed": seed, "engine": "vllm-cpu", "key": args.key, "quick": args.quick}
    fields["pinned"] = args.pin == "on"
    progress(f"seed {seed}; starting two vLLM engines")
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as folder:
        work = Path(folder)
        cpus = sorted(os.sched_getaffinity(0))
        pinned = args.pin == "on" and len(cpus) >= 2
        engines = [started_on(cpus[i] if pinned else None, work) for i in range(2)]
        try:
            results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for repeat in range(args.repeats):
                for index, mode in enumerate(MODES):
                    run_seed = seed * 1000 + repeat * 10 + index  # fresh conversations
                    progress(f"repeat {repeat}, {mode}")
                    results[mode].append(measure(engines, work, mode, run_seed, args))
        finally:
            for engine in engines:
                engine.stop()
    for mode, runs in results.items():
        for metric, unit in UNITS.items():
            values = [r[metric] for r in runs]
            spread = {"low": min(values), "high": max(values), "repeats": len(values)}
            emit(metric, round(statistics.median(values), 4), unit, mode=mode, **fields, **spread)
    for metric, name in (
        ("later_turns_cached_share", "cached_share"),
        ("prefix_cache_hit_rate", "hit_rate"),
        ("ttft_p50_ms", "ttft_p50"),
        ("ttft_p99_ms", "ttft_p99"),
    ):
        on = statistics.median(r[metric] for r in results["on"])
        for other in ("off", "round-robin"):
            base = statistics.median(r[metric] for r in results[other])
            label = f"{name}_ratio_on_vs_{other.replace('-', '_')}"
            emit(label, round(on / base, 4) if base else None, "ratio", **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
