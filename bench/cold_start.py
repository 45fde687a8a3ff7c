"""Time to first token of a scale-to-zero backend, from S3 to the first token, in four states.

Writes a synthetic Llama (`scripts/make_synthetic_model.py`: 1 GB in 0.1 GB shards, or
0.15 GB with --quick), uploads it to moto's S3 server (with a `manifest.json` of sha256s,
so staging checks every file), and then, each time with a fresh gateway whose `process`
backend runs the bundled worker on the staged weights (`weights: {uri: s3://...}`), sends
one streaming chat request (max_tokens 1) and times it to the chunk that carries the token:

    unstaged          empty cache folder: staging (download, verify, read-ahead), then start
    staged_disk       staged, its files dropped from the page cache (POSIX_FADV_DONTNEED)
    staged_pagecache  staged, its files read just before and locked in the page cache
                      until answered (see `bench/cold_start_files.py` for why)
    warm_pool         min_replicas 1: the request comes once the replica is ready
    asleep            an engine the gateway put to sleep (vLLM's sleep mode, faked: no GPU
                      here), woken by the request; `wake_s` is the fake engine's own wake
                      time in the same run (bench/cold_start_asleep.py)

In the same run, for the figures to be compared with:

    plain_download_gbps  ranged GETs of the same objects from the same endpoint, with the
                         staging's chunk size and parallelism, each chunk written in place
                         into a file per object (as `aws s3 cp` or any downloader ends: with
                         the object on disk), not synced; one round before and one after the
                         unstaged start, the median. Without --quick, the same GETs into
                         memory and dropped (no file at all) are reported beside it, as
                         plain_download_to_memory_gbps, not compared with
    raw_read_gbps        plain sequential 16 MiB reads of the staged weight files, one
                         thread, `cache`: pagecache (read just before) or disk (dropped);
                         the median of a few rounds

Prints JSON lines only (progress goes to stderr), `{"bench": "cold_start", "metric", "value",
"unit", ...}` with `size_gb` and `mode` on every line:

    model_bytes                       the weight files' bytes, with the run's settings
    ttft_s {scenario}                 request sent -> the token's chunk, at the client
    phase_s {scenario, phase}         with `share` (of ttft_s), `source`, and `breakdown`:
                                      true for the phases that add up to ttft_s exactly:
          request         client send -> the gateway's request_arrived
          staging         the gateway's timeline (staging_begun -> staging_done)
          spawn           -> the worker's spawn time (the manager and the provider)
          process_start, imports, weights_read, model_built, first_forward
                          the worker's own start-up report (`/startup`); first_forward is
                          its readiness probe, a real one-token forward pass
          ready_detect    the worker is ready -> the gateway sees it (its probe interval)
          first_token     the gateway's ready -> the token chunk reaches the client
                          (forwarding, prefill and one decode step, the stream back)
          warm_pool: first_event (-> the stream's role event, which the worker sends
                          before its forward pass) and forward (role event -> token)
      and, breakdown false: the timeline's own loading, first_byte and total
      (`cold_starts.jsonl`), and warm_pool's pool_start (its start before the request)
    load_gbps {scenario}              the worker's tensor bytes / its weights_read_s
    raw_read_gbps {cache}
    load_ratio {scenario, cache}      load_gbps / raw_read_gbps of the same cache state
                                      (staged_pagecache is the figure to quote)
    staging_gbps                      staged bytes / the unstaged start's staging phase
    plain_download_gbps, staging_ratio (staging / plain download)
    forward_s, first_event_s {scenario: warm_pool, request, route}
                                      request first (through the gateway) and the median
                                      of direct requests to the replica afterwards
    warm_pool_overhead_s {request}    first_event_s through the gateway minus direct
    target_met {target}               1 or 0, `observed` beside it, for the targets below

and, not with --quick, diagnostics of the staging: plain_download_to_memory_gbps (the same
GETs with no file written, see above), sha256_gbps (hashing the staged files
from the page cache, one thread, as verification does; staging hashes each file while it
downloads), and stager_download_gbps / stager_readahead_gbps (the same staging by a
WeightStager in this process: its own split; `bytes` 0 for the read-ahead when verification
had just read every file back, see warmpool.staging).

Targets: load_ratio (staged_pagecache) >= 0.7; staging_ratio >= 0.7; warm_pool ttft_s <
0.1 s + forward_s, where forward_s is measured on that first request (role event -> token);
asleep ttft_s <= 1.5 x wake_s + 0.05 s.
Then requests held through a long start (a 60 s start, 12 s with --quick; see
`bench/cold_start_held.py`): keepalive_max_gap_s <= 5 s on a held stream, then the whole
stream; a deadline shorter than the learned start refused in refusal_latency_ms < 50 with
retry_after_error_ratio <= 0.2.
GB are 10^9 bytes. moto reads a whole object for each ranged GET (`bench/cold_start_s3.py`):
shards are small and chunks large here for that reason, and GB/s of anything fetched from it
are moto's, on the same cores as everything else.

    python bench/cold_start.py            # 1 GB model, a few minutes
    python bench/cold_start.py --quick    # 0.15 GB, no diagnostics: four worker starts
                                          # (CPU-bound: its time grows with the load)

Exits 1 if a request failed. Temporary files (GBs) and every process are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
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

from bench import cold_start_asleep as asleep  # noqa: E402
from bench import cold_start_files as files  # noqa: E402
from bench import cold_start_held as held  # noqa: E402
from bench import cold_start_s3 as s3  # noqa: E402
from bench import cold_start_vllm  # noqa: E402
from bench.processes import OPERATOR, Gateway, ServerProcess, unwind_on_sigterm  # noqa: E402
from bench.processes import start_gateway as start_gateway_process  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402
from warmpool.layout import safe_name  # noqa: E402

BENCH = "cold_start"
KEY = "bench-" + "c" * 40
BACKEND = MODEL = "synthetic"
BUCKET, PREFIX = "coldstart", "synthetic"
SCENARIOS = ("unstaged", "staged_disk", "staged_pagecache", "warm_pool")
GB = 1e9
LONG_S = 900.0  # deadlines and timeouts: a cold start on a busy two-core machine is slow
WORKER_PHASES = {  # /startup's names -> ours, in the order they happen
    "process_start_s": "process_start",
    "imports_s": "imports",
    "weights_read_s": "weights_read",
    "model_built_s": "model_built",
    "first_forward_s": "first_forward",
}


@dataclass(frozen=True)
class Plan:
    size_gb: float
    shard_gb: float
    chunk_mb: int
    parallelism: int
    raw_rounds: int  # raw reads per cache state (the median is reported)
    warm_pairs: int  # direct / gateway request pairs after the warm pool's first request
    diagnostics: bool  # staging in this process, sha256 speed


FULL = Plan(
    size_gb=1.0,
    shard_gb=0.1,
    chunk_mb=32,
    parallelism=8,
    raw_rounds=3,
    warm_pairs=3,
    diagnostics=True,
)
QUICK = Plan(
    size_gb=0.15,
    shard_gb=0.05,
    chunk_mb=16,
    parallelism=8,
    raw_rounds=2,
    warm_pairs=1,
    diagnostics=False,
)


@dataclass
class Answer:
    status: int = 0
    sent_at: float = 0.0  # wall clock, to line up with the gateway's and worker's clocks
    first_event_s: float | None = None
    ttft_s: float | None = None
    cold_start_ms: int | None = None
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft_s is not None and self.error is None


@dataclass
class Result:
    scenario: str
    answer: Answer
    resident: float | None = None  # page-cache fraction of the weight files at the request
    record: dict[str, Any] | None = None  # the cold start's timeline (cold_starts.jsonl)
    startup: dict[str, Any] | None = None  # the worker's /startup report
    pool_start: dict[str, Any] | None = None  # warm_pool: the min_replicas start's timeline
    direct: list[Answer] = field(default_factory=list)  # warm_pool: straight to the worker
    later: list[Answer] = field(default_factory=list)  # warm_pool: through it, after the first


_emit = emitter(BENCH)


def emit(metric: str, value: float | int | None, unit: str, **fields: Any) -> None:
    # "fake": the bundled worker and the fake engine (asleep), not the real vLLM.
    _emit(metric, value, unit, **({"engine": "fake"} | fields))


progress = progress_of(BENCH)


# -- the model and its bucket --------------------------------------------------------------


def write_model(dest: Path, plan: Plan) -> Path:
    """In a subprocess: this process never imports torch (its threads, its memory)."""
    script = ROOT / "scripts" / "make_synthetic_model.py"
    command = [sys.executable, str(script), "--size-gb", str(plan.size_gb)]
    command += ["--shard-gb", str(plan.shard_gb), str(dest)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=LONG_S)
    if done.returncode != 0:
        raise RuntimeError(f"writing the model failed:\n{done.stderr}")
    return dest


def weight_paths(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def all_paths(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


# -- one gateway, one request --------------------------------------------------------------


class Bench:
    def __init__(self, plan: Plan, work_dir: Path, endpoint: str, loader: str | None):
        self.plan = plan
        self.work_dir = work_dir
        self.endpoint = endpoint
        self.loader = loader
        self.cache_dir = work_dir / "cache"
        self.staged = self.cache_dir / safe_name(BACKEND)  # the backend's {weights}
        self.gateway: Gateway | None = None
        self.gateway_for = ""  # the scenario self.gateway was started for

    def config(self, state_dir: Path, min_replicas: int) -> dict[str, Any]:
        command = ["{python}", "-m", "backends.worker", "--port", "{port}"]
        command += ["--chat-model", f"{MODEL}={{weights}}"]
        if self.loader:
            command += ["--weight-loader", self.loader]
        return {
            "state": {"url": "memory", "path": str(state_dir / "state.json")},
            "cache": {"enabled": False},
            "traffic": {"deadline_s": {"interactive": LONG_S, "batch": LONG_S}},
            "backends": [
                {
                    "name": BACKEND,
                    "kind": "process",
                    "command": command,
                    "models": [MODEL],
                    "weights": {"uri": f"s3://{BUCKET}/{PREFIX}/"},
                    "scaling": {
                        "min_replicas": min_replicas,
                        "max_replicas": 1,
                        "idle_s": LONG_S,
                        "last_replica_idle_s": LONG_S,
                        "ready_timeout_s": LONG_S,
                    },
                }
            ],
            "staging": {
                "cache_dir": str(self.cache_dir),
                "chunk_mb": self.plan.chunk_mb,
                "parallelism": self.plan.parallelism,
                "disk_budget_gb": max(10.0, 4 * self.plan.size_gb),
                "s3": {
                    "endpoint_url": self.endpoint,
                    "region": s3.REGION,
                    "access_key_id": s3.ACCESS_KEY,
                    "secret_access_key": s3.SECRET_KEY,
                },
            },
            "tenants": [
                {"name": "bench", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
            ],
        }

    def start(self, name: str) -> Gateway:
        """The scenario's fresh gateway; started ahead of `scenario` where nothing is timed."""
        state_dir = self.work_dir / f"gateway-{name}"
        state_dir.mkdir()
        min_replicas = 1 if name == "warm_pool" else 0
        self.gateway = start_gateway_process(
            self.config(state_dir, min_replicas), state_dir, timeout_s=120
        )
        self.gateway_for = name
        progress(f"{name}: gateway up")
        return self.gateway

    def scenario(self, name: str) -> Result:
        state_dir = self.work_dir / f"gateway-{name}"
        warm = name == "warm_pool"
        ready = self.gateway if self.gateway_for == name else None
        gateway = ready or self.start(name)
        try:
            result = Result(name, Answer())
            if warm:
                wait_for_replica(gateway)
                time.sleep(0.5)  # let the replica's start settle, as it would have by then
            if name != "unstaged":
                result.resident = files.resident(weight_paths(self.staged))
            url = gateway.base_url + "/chat/completions"
            result.answer = ask(url, {"Authorization": f"Bearer {KEY}"})
            records = read_records(state_dir / "cold_starts.jsonl", want_served=not warm)
            served = [r for r in records if r.get("outcome") == "served"]
            result.record = served[-1] if served else None
            if warm:
                result.pool_start = records[0] if records else None
            replica = replica_url(gateway)
            result.startup = worker_startup(replica)
            if warm and replica is not None:
                for _ in range(self.plan.warm_pairs):
                    result.direct.append(ask(replica + "/v1/chat/completions", {}))
                    result.later.append(ask(url, {"Authorization": f"Bearer {KEY}"}))
            if not result.answer.ok:
                progress(f"{name}: request failed: {result.answer}")
                progress("gateway log (tail):\n" + gateway.server.log()[-4000:])
            return result
        finally:
            gateway.stop()
            self.gateway, self.gateway_for = None, ""


def ask(url: str, headers: dict[str, str]) -> Answer:
    """One streaming chat request; timed to its first event and to the token's chunk."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 1,
        "stream": True,
    }
    answer = Answer()
    timeout = httpx.Timeout(LONG_S, connect=10.0)
    with httpx.Client(timeout=timeout) as client:
        answer.sent_at = time.time()
        started = time.perf_counter()
        try:
            with client.stream("POST", url, json=body, headers=headers) as response:
                answer.status = response.status_code
                if "x-cold-start-ms" in response.headers:
                    answer.cold_start_ms = int(response.headers["x-cold-start-ms"])
                if response.status_code != 200:
                    answer.error = response.read().decode(errors="replace")[:500]
                    return answer
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter() - started
                    chunk = orjson.loads(line[6:])
                    if answer.first_event_s is None:
                        answer.first_event_s = now
                    if "error" in chunk:
                        answer.error = str(chunk["error"])[:500]
                        continue
                    choice = (chunk.get("choices") or [{}])[0]
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        answer.text += content
                    # The token's chunk; an empty token (a special one) comes as the last chunk.
                    if answer.ttft_s is None and (content or choice.get("finish_reason")):
                        answer.ttft_s = now
        except httpx.HTTPError as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
    return answer


def wait_for_replica(gateway: Gateway, timeout_s: float = LONG_S) -> None:
    deadline = time.monotonic() + timeout_s
    while replica_url(gateway) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no replica ready in {timeout_s} s:\n{gateway.server.log()}")
        time.sleep(0.05)


def replica_url(gateway: Gateway) -> str | None:
    """The ready replica's root URL, from the gateway's /readyz."""
    try:
        ready = httpx.get(gateway.url + "/readyz", timeout=5, headers=OPERATOR).json()
    except (httpx.HTTPError, ValueError):
        return None
    urls = ready.get("replicas", {}).get(BACKEND) or []
    return str(urls[0]).removesuffix("/v1") if urls else None


def worker_startup(replica: str | None) -> dict[str, Any] | None:
    if replica is None:
        return None
    try:
        response = httpx.get(replica + "/startup", timeout=5)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def read_records(path: Path, want_served: bool, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The gateway's cold-start timelines (written when the first byte went out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = []
        if path.exists():
            records = [orjson.loads(line) for line in path.read_text().splitlines() if line]
        served = any(r.get("outcome") == "served" for r in records)
        if served or not want_served or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


# -- baselines -----------------------------------------------------------------------------


def stage_directly(endpoint: str, cache_dir: Path, plan: Plan) -> Any:
    """The same staging, by a WeightStager in this process: its download and read-ahead
    throughputs, which the gateway does not report."""
    from pydantic import SecretStr

    from warmpool.s3 import S3WeightSource
    from warmpool.staging import WeightStager

    async def stage() -> Any:
        factory = S3WeightSource.factory(
            endpoint_url=endpoint,
            region=s3.REGION,
            access_key_id=SecretStr(s3.ACCESS_KEY),
            secret_access_key=SecretStr(s3.SECRET_KEY),
        )
        stager = WeightStager(
            cache_dir,
            factory,
            int(max(10.0, 4 * plan.size_gb) * GB),
            chunk_bytes=plan.chunk_mb * 1024 * 1024,
            parallelism=plan.parallelism,
        )
        async with stager:
            return await stager.stage(MODEL, f"s3://{BUCKET}/{PREFIX}/")

    return asyncio.run(stage())


def raw_reads(paths: list[Path], cache: str, rounds: int) -> float:
    """Median GB/s of `rounds` plain reads, each from the given cache state."""
    speeds = []
    for _ in range(rounds):
        if cache == "disk":
            files.drop(paths)
        else:
            files.warm(paths)
        size, seconds = files.raw_read(paths)
        speeds.append(size / seconds / GB)
    return statistics.median(speeds)


# -- the report ----------------------------------------------------------------------------


def breakdown(result: Result) -> list[tuple[str, float, str]]:
    """(phase, seconds, source) that add up to ttft_s, from three clocks on one machine."""
    answer, record, startup = result.answer, result.record, result.startup
    if answer.ttft_s is None or record is None:
        return []
    events: dict[str, float] = {}
    for event in record["events"]:
        events.setdefault(event["event"], event["at"])
    token_at = answer.sent_at + answer.ttft_s
    arrived = events.get("request_arrived", answer.sent_at)
    ready = events.get("ready")
    if ready is None:
        return []
    phases = [("request", arrived - answer.sent_at, "client+gateway")]
    staging = record["phases"].get("staging", 0.0)
    if "staging" in record["phases"]:
        phases.append(("staging", staging, "gateway timeline"))
    worker = (startup or {}).get("phases") or {}
    spawned_at = (startup or {}).get("spawned_at")
    if spawned_at is None or not all(worker.get(k) is not None for k in WORKER_PHASES):
        phases.append(("loading", ready - arrived - staging, "gateway timeline"))
    else:
        phases.append(("spawn", spawned_at - arrived - staging, "gateway timeline"))
        phases += [
            (ours, float(worker[theirs]), "worker") for theirs, ours in WORKER_PHASES.items()
        ]
        worker_ready = spawned_at + sum(float(worker[k]) for k in WORKER_PHASES)
        phases.append(("ready_detect", ready - worker_ready, "gateway timeline"))
    phases.append(("first_token", token_at - ready, "client"))
    return phases


def report(results: dict[str, Result], baselines: dict[str, Any], common: dict[str, Any]) -> bool:
    failed = False
    loads: dict[str, float] = {}
    for name, result in results.items():
        answer = result.answer
        scenario = {"scenario": name, **common}
        if not answer.ok or answer.ttft_s is None:
            failed = True
            emit("ttft_s", -1, "s", error=answer.error or f"HTTP {answer.status}", **scenario)
            continue
        extra: dict[str, Any] = {"cold_start_ms": answer.cold_start_ms}
        if result.resident is not None:
            extra["resident_fraction"] = round(result.resident, 3)
        emit("ttft_s", round(answer.ttft_s, 4), "s", **extra, **scenario)
        ttft = answer.ttft_s
        for phase, seconds, source in breakdown(result):
            share = round(seconds / ttft, 3)
            emit(
                "phase_s",
                round(seconds, 4),
                "s",
                phase=phase,
                share=share,
                source=source,
                breakdown=True,
                **scenario,
            )
        for phase, seconds in (result.record or {}).get("phases", {}).items():
            if phase != "staging":  # already above, in the breakdown
                emit(
                    "phase_s",
                    round(seconds, 4),
                    "s",
                    phase=phase,
                    share=round(seconds / ttft, 3),
                    source="gateway timeline",
                    breakdown=False,
                    **scenario,
                )
        model = ((result.startup or {}).get("models") or {}).get(MODEL) or {}
        if name != "warm_pool" and model.get("load_gbps") is not None:
            loads[name] = float(model["load_gbps"])
            emit(
                "load_gbps",
                round(loads[name], 3),
                "GB/s",
                source="worker /startup: tensor bytes / weights_read_s",
                loader=model.get("loader"),
                bytes=model.get("bytes"),
                weights_read_s=model.get("weights_read_s"),
                **scenario,
            )
        elif name != "warm_pool" and result.record and "loading" in result.record["phases"]:
            # No /startup report: all of the worker's start counts as the load (an estimate).
            loads[name] = baselines["weight_bytes"] / result.record["phases"]["loading"] / GB
            emit(
                "load_gbps",
                round(loads[name], 3),
                "GB/s",
                source="estimate: weight bytes / the timeline's loading phase",
                **scenario,
            )
        if name == "warm_pool":
            failed |= warm_pool_report(result, scenario)
    raw = baselines["raw_read_gbps"]
    for cache, value in raw.items():
        emit("raw_read_gbps", round(value, 3), "GB/s", cache=cache, **common)
    for scenario_name, cache in (("staged_pagecache", "pagecache"), ("staged_disk", "disk")):
        if scenario_name in loads:
            ratio = loads[scenario_name] / raw[cache]
            emit(
                "load_ratio",
                round(ratio, 3),
                "ratio",
                scenario=scenario_name,
                cache=cache,
                **common,
            )
            if scenario_name == "staged_pagecache":
                target("load_ratio >= 0.7", ratio >= 0.7, round(ratio, 3), common)
    downloads = baselines["plain_download_gbps"]
    plain = statistics.median(downloads)
    spread = {"rounds": len(downloads), "min": round(min(downloads), 3)}
    emit("plain_download_gbps", round(plain, 3), "GB/s", **spread, **common)
    unstaged = results.get("unstaged")
    staging_s = ((unstaged.record or {}).get("phases") or {}).get("staging") if unstaged else None
    if staging_s:
        staging = baselines["staged_bytes"] / staging_s / GB
        emit("staging_gbps", round(staging, 3), "GB/s", seconds=round(staging_s, 3), **common)
        emit("staging_ratio", round(staging / plain, 3), "ratio", **common)
        target("staging_ratio >= 0.7", staging / plain >= 0.7, round(staging / plain, 3), common)
    if memory := baselines.get("plain_to_memory_gbps"):
        spread = {"rounds": len(memory), "min": round(min(memory), 3)}
        value = round(statistics.median(memory), 3)
        emit("plain_download_to_memory_gbps", value, "GB/s", **spread, **common)
    if "sha256_gbps" in baselines:
        emit("sha256_gbps", round(baselines["sha256_gbps"], 3), "GB/s", cache="pagecache", **common)
    for part in ("download", "readahead"):
        throughput = getattr(baselines.get("stager"), part, None)
        if throughput is not None and throughput.seconds > 0:
            emit(
                f"stager_{part}_gbps",
                round(throughput.bytes / throughput.seconds / GB, 3),
                "GB/s",
                seconds=round(throughput.seconds, 3),
                bytes=throughput.bytes,  # readahead: 0 when verification read it all back
                **common,
            )
    return failed


def warm_pool_report(result: Result, scenario: dict[str, Any]) -> bool:
    """The model's own time is measured on the request itself: the worker sends the
    stream's role event before its forward pass and the token event after it, so
    forward = ttft - first_event, and first_event is what came before the model's work
    (the gateway, the connection, the worker parsing and tokenising). A relay that held
    the role event back would move time from forward to first_event, never the other way.
    Direct requests to the replica, after the first one, say what the worker alone takes."""
    answer = result.answer
    if result.pool_start is not None:
        total = (result.pool_start.get("phases") or {}).get("total")
        if total is not None:
            source = "gateway timeline (the min_replicas start, before the request)"
            emit(
                "phase_s",
                round(total, 4),
                "s",
                phase="pool_start",
                source=source,
                breakdown=False,
                **scenario,
            )
    if answer.ttft_s is None or answer.first_event_s is None:
        return True
    ttft, first_event = answer.ttft_s, answer.first_event_s
    forward = ttft - first_event
    for phase, seconds in (("first_event", first_event), ("forward", forward)):
        emit(
            "phase_s",
            round(seconds, 4),
            "s",
            phase=phase,
            share=round(seconds / ttft, 3),
            source="client: the stream's role event, sent before the forward pass",
            breakdown=True,
            **scenario,
        )
    emit("forward_s", round(forward, 4), "s", request="first", route="gateway", **scenario)
    emit("first_event_s", round(first_event, 4), "s", request="first", route="gateway", **scenario)
    direct = [a for a in result.direct if a.ok and a.ttft_s is not None]
    later = [a for a in result.later if a.ok and a.ttft_s is not None]
    if direct:
        median = statistics.median
        direct_first = median(a.first_event_s or 0.0 for a in direct)
        n = {"requests": len(direct)}
        emit(
            "forward_s",
            round(median(a.ttft_s or 0.0 for a in direct), 4),
            "s",
            request="median",
            route="direct",
            **n,
            **scenario,
        )
        emit(
            "first_event_s",
            round(direct_first, 4),
            "s",
            request="median",
            route="direct",
            **n,
            **scenario,
        )
        overhead = first_event - direct_first
        emit("warm_pool_overhead_s", round(overhead, 4), "s", request="first", **scenario)
        if later:
            later_first = median(a.first_event_s or 0.0 for a in later)
            emit(
                "warm_pool_overhead_s",
                round(later_first - direct_first, 4),
                "s",
                request="median",
                requests=len(later),
                **scenario,
            )
    target(
        "warm_pool ttft_s < 0.1 + forward_s",
        ttft < 0.1 + forward,
        round(ttft - forward, 4),
        scenario,
    )
    return False


def target(name: str, met: bool, observed: float, common: dict[str, Any]) -> None:
    params = {k: v for k, v in common.items() if k != "scenario"}
    emit("target_met", int(met), "bool", target=name, observed=observed, **params)


# -- the run -------------------------------------------------------------------------------


def run(plan: Plan, work_dir: Path, model_dir: Path | None, args: argparse.Namespace) -> int:
    started = time.monotonic()
    moto: ServerProcess | None = None
    bench: Bench | None = None
    try:
        source = model_dir or work_dir / "model"
        progress(f"writing a {plan.size_gb:g} GB synthetic model to {source}")
        # Side by side, while nothing is timed: moto and its bucket while the model is
        # written, the first scenario's gateway while the model is uploaded. Not earlier: a
        # gateway left idle for half a minute staged measurably slower here (its pages
        # reclaimed, see cold_start_files), and staging is what it is timed on.
        with ThreadPoolExecutor(1) as beside:
            written = beside.submit(write_model, source, plan)
            moto, endpoint = s3.start_moto(work_dir)
            s3.create_bucket(endpoint, BUCKET)
            bench = Bench(plan, work_dir, endpoint, args.weight_loader)
            written.result()
            gateway_up = beside.submit(bench.start, SCENARIOS[0])
            progress(f"uploading to moto at {endpoint}")
            manifest = not args.no_manifest
            objects = s3.upload_model(endpoint, BUCKET, PREFIX, source, manifest=manifest)
            gateway_up.result()
        weight_bytes = sum(p.stat().st_size for p in weight_paths(source))
        files.drop(all_paths(source))  # the source is not what the worker reads; free it
        common: dict[str, Any] = {
            "size_gb": plan.size_gb,
            "mode": "quick" if args.quick else "full",
        }
        baselines: dict[str, Any] = {
            "staged_bytes": sum(o.size for o in objects),
            "weight_bytes": weight_bytes,
        }
        emit(
            "model_bytes",
            weight_bytes,
            "bytes",
            weight_files=len(weight_paths(source)),
            staged_bytes=baselines["staged_bytes"],
            shard_gb=plan.shard_gb,
            chunk_mb=plan.chunk_mb,
            parallelism=plan.parallelism,
            manifest=not args.no_manifest,
            loader=args.weight_loader or "worker default",
            **common,
        )
        chunk = plan.chunk_mb * 1024 * 1024

        def plain_round(to_dir: Path | None = None) -> float:
            size, seconds = s3.plain_download(
                endpoint, BUCKET, objects, chunk, plan.parallelism, to_dir
            )
            where = "memory" if to_dir is None else "disk"
            progress(f"plain download to {where}: {size / GB:.3f} GB in {seconds:.2f} s")
            return size / seconds / GB

        plain_dir = work_dir / "plain-download"

        def disk_round() -> float:
            try:
                return plain_round(plain_dir)
            finally:  # deleted at once: its dirty pages are dropped, not written back later
                shutil.rmtree(plain_dir, ignore_errors=True)

        memory = [plain_round()] if plan.diagnostics else []
        downloads = [disk_round()]
        results: dict[str, Result] = {}

        def scenario(name: str) -> None:
            progress(f"{name}: fresh gateway, one request")
            results[name] = bench.scenario(name)
            answer = results[name].answer
            progress(f"{name}: ttft {answer.ttft_s} s, answer {answer.text!r}")

        scenario("unstaged")
        downloads.append(disk_round())
        baselines["plain_download_gbps"] = downloads
        if plan.diagnostics:
            memory.append(plain_round())
            baselines["plain_to_memory_gbps"] = memory
            stager_dir = work_dir / "stager-cache"
            progress("staging once more, in this process, for the stager's own timings")
            baselines["stager"] = stage_directly(endpoint, stager_dir, plan)
            shutil.rmtree(stager_dir, ignore_errors=True)
            size, seconds = s3.sha256_read(weight_paths(bench.staged))
            baselines["sha256_gbps"] = size / seconds / GB

        weights, staged_files = weight_paths(bench.staged), all_paths(bench.staged)
        raw = {"disk": raw_reads(weights, "disk", plan.raw_rounds)}
        files.drop(staged_files)
        scenario("staged_disk")
        files.warm(staged_files)
        with files.Held(staged_files):  # in the page cache until answered (cold_start_files)
            raw["pagecache"] = raw_reads(weights, "pagecache", plan.raw_rounds)
            scenario("staged_pagecache")
            scenario("warm_pool")
        baselines["raw_read_gbps"] = raw
        failed = report(results, baselines, common)
        failed |= asleep.run(work_dir, common, emit, progress)
        failed |= held.run_held(work_dir, args.quick, common, progress)  # cold_start_held.py
    finally:
        if bench is not None and bench.gateway is not None:
            bench.gateway.stop()
        if moto is not None:
            moto.stop()
        kill_strays(work_dir)
    progress(f"done in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


def kill_strays(work_dir: Path) -> None:
    """Processes of this run still alive (a worker whose gateway was killed): each one's
    command line names this run's own temporary folder, so only they are matched."""
    marker = str(work_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cmdline").read_bytes():
                progress(f"killing stray process {entry.name}")
                os.kill(int(entry.name), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 0.15 GB model, no diagnostics")
    parser.add_argument("--size-gb", type=float, help="model size (default 1.0, quick 0.15)")
    parser.add_argument("--chunk-mb", type=int, help="staging chunk (default 32, quick 16)")
    parser.add_argument("--parallelism", type=int, help="staging GETs in flight (default 8)")
    parser.add_argument(
        "--weight-loader", choices=("mmap", "chunked", "transformers"), help="the worker's"
    )
    parser.add_argument(
        "--no-manifest", action="store_true", help="no sha256 manifest (sizes checked only)"
    )
    parser.add_argument(
        "--model-dir", type=Path, help="write (or reuse) the synthetic model here; kept after"
    )
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the work folder")
    parser.add_argument(
        "--engine",
        choices=("fake", "vllm"),
        default="fake",
        help="fake: the bundled worker's starts from S3 and the fake engine's sleep; vllm: "
        "a real vLLM start through the gateway against vLLM alone (bench/cold_start_vllm.py)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    overrides = {
        "size_gb": args.size_gb,
        "chunk_mb": args.chunk_mb,
        "parallelism": args.parallelism,
    }
    plan = Plan(**{**vars(plan), **{k: v for k, v in overrides.items() if v is not None}})
    unwind_on_sigterm()
    parent = args.tmp.resolve() if args.tmp else None
    work_dir = Path(tempfile.mkdtemp(prefix="bench-cold-start-", dir=parent))
    try:
        if args.engine == "vllm":
            return cold_start_vllm.run(work_dir, emit, progress)
        return run(plan, work_dir, args.model_dir, args)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
