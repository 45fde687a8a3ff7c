"""What the gateway adds to a request: direct calls to a fast upstream vs calls through it,
and vs calls through a skeleton proxy.

Starts the fake upstream (bench/fake_upstream.py, model `echo`), a gateway in front
of it and the skeleton (bench/skeleton_proxy.py: a raw ASGI app served with the gateway's
uvicorn settings, in its own process, that checks the bearer key, counts the request and
relays the body unparsed through a pooled aiohttp session: about the least a Python proxy
can do), then, for each (concurrency, stream) in (1, 64) x (false, true), runs short rounds
direct / gateway / skeleton / direct / gateway / skeleton ... after a warm-up round of
each, so that noise on a shared machine falls on all three alike. The load comes from a
separate process (bench/loadgen.py: aiohttp, keep-alive, `concurrency` closed-loop workers,
a small pre-serialised chat body; a streamed answer is timed until its last byte, and
until its first).

Prints JSON lines only (progress goes to stderr), each with parameters concurrency and
stream:

    added_latency_p50_ms, added_latency_p99_ms   gateway pN - direct pN, pooled over rounds
    added_ttft_p50_ms (streams)                  the same, until the first bytes of the body
                                                 (a stream's first token); and the
                                                 skeleton's, skeleton_added_ttft_p50_ms
    throughput_gateway_rps, throughput_direct_rps, throughput_ratio (gateway / direct)
    gateway_rss_mb                               VmRSS of the gateway after those rounds

against the skeleton, measured in the same run with the same load:

    throughput_skeleton_rps, skeleton_cpu_ms_per_req (its CPU time per request)
    throughput_ratio_vs_skeleton                 gateway req/s / skeleton req/s
    throughput_ratio_vs_skeleton_round_min, _max the lowest and highest of the same ratio
                                                 per pair of rounds (gateway, then skeleton):
                                                 this machine's noise, in the ratio's terms
    cpu_ms_per_req_vs_skeleton                   gateway CPU ms/req / skeleton CPU ms/req

and, to judge the numbers: latency_{direct,gateway,skeleton}_p50_ms / _p99_ms;
gateway_cpu_ms_per_req
(the gateway's own CPU time per request through it) and gateway_cpu_cores (its CPU seconds
per second during the gateway rounds: near 1.0 means the single-process gateway was the
bottleneck, well below means the machine was); and loadgen_ceiling_rps (requests per
CPU-second of the load generator in the direct rounds: what it could drive with a whole
core to itself). Direct throughput at concurrency 64 is bounded by the load generator and
the upstream sharing the machine's cores, so throughput_ratio is if anything flattering.
gateway_rss_mb is read after each combination's rounds, in the same gateway process.

Every line also carries `concurrency_mode`: the gateway's backend runs with its default,
a learned concurrency limit (`adaptive`), or with `--concurrency-mode fixed`, a fixed limit
of `max_concurrency` (256), the relay alone. The learned limit at the end of each
combination's rounds is `gateway_concurrency_limit` (from /readyz): at concurrency 64 the
fake upstream's latency rises with its load on this machine's shared cores, the limit
settles near 8 and the other requests wait in the gateway's fair queue, which costs CPU a
fixed limit does not spend.

    python bench/proxy_overhead.py            # a few minutes
    python bench/proxy_overhead.py --quick    # the same measurements, under a minute
    python bench/proxy_overhead.py --quick --concurrency-mode fixed

Exits 1 if any request failed (the numbers are printed all the same).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
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

from bench.fake_upstream import fake_backend  # noqa: E402
from bench.loadgen import LoadGenerator, RoundResult, RoundSpec  # noqa: E402
from bench.measure import cpu_seconds, percentile  # noqa: E402
from bench.processes import (  # noqa: E402
    OPERATOR,
    Gateway,
    ServerProcess,
    free_port,
    start_fake_upstream,
    unwind_on_sigterm,
)
from bench.processes import start_gateway as start_gateway_process  # noqa: E402
from bench.report import emitter, progress_of  # noqa: E402

BENCH = "proxy_overhead"
KEY = "bench-" + "k" * 40
COMBINATIONS = [(1, False), (1, True), (64, False), (64, True)]
CHAT_PATH = "/chat/completions"


@dataclass(frozen=True)
class Plan:
    warm_up_s: float  # one round per target before the measured ones
    round_s: float
    pairs: int  # measured rounds per target


FULL = Plan(warm_up_s=1.5, round_s=2.5, pairs=6)
QUICK = Plan(warm_up_s=0.5, round_s=1.0, pairs=3)


@dataclass
class Series:
    """Pooled results of one target's measured rounds for one (concurrency, stream)."""

    latencies_ms: list[float] = field(default_factory=list)
    first_byte_ms: list[float] = field(default_factory=list)
    completed: int = 0
    seconds: float = 0.0
    errors: int = 0
    first_error: str | None = None
    loadgen_cpu_s: float = 0.0
    server_cpu_s: float = 0.0  # the proxy's CPU time, for gateway and skeleton rounds
    round_rps: list[float] = field(default_factory=list)  # each measured round's req/s

    def add(self, result: RoundResult, server_cpu_s: float) -> None:
        self.round_rps.append(result.rps)
        self.latencies_ms.extend(result.latencies_ms)
        self.first_byte_ms.extend(result.first_byte_ms)
        self.completed += result.completed
        self.seconds += result.duration_s
        self.errors += result.errors
        self.first_error = self.first_error or result.first_error
        self.loadgen_cpu_s += result.cpu_s
        self.server_cpu_s += server_cpu_s

    @property
    def rps(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0  # kB
    raise RuntimeError(f"no VmRSS for pid {pid}")


emit = emitter(BENCH)


progress = progress_of(BENCH)


def chat_body(stream: bool) -> str:
    body: dict[str, Any] = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    return orjson.dumps(body).decode()


def gateway_config(upstream_url: str, work_dir: Path, mode: str = "adaptive") -> dict[str, Any]:
    return {
        "state": {"url": "memory", "path": str(work_dir / "state.json")},
        "backends": [fake_backend(upstream_url, concurrency={"mode": mode})],
        "cache": {"enabled": False},  # the bare relay; the cache has its own benchmark
        "tenants": [
            {"name": "bench", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
        ],
    }


def start_skeleton(upstream_url: str, work_dir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    command = [sys.executable, "-m", "bench.skeleton_proxy", "--port", str(port)]
    server = ServerProcess(
        [*command, "--upstream", upstream_url, "--key", KEY],
        f"http://127.0.0.1:{port}/healthz",
        work_dir / f"skeleton-{port}.log",
    ).start()
    return server, f"http://127.0.0.1:{port}/v1"


def check_answers(*urls: str) -> None:
    """One request each way, so that a misconfiguration fails loudly rather than fast."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for url in urls:
        for stream in (False, True):
            response = httpx.post(url, content=chat_body(stream), headers=headers, timeout=10)
            done = not stream or "data: [DONE]" in response.text
            if response.status_code != 200 or "echo" not in response.text or not done:
                raise RuntimeError(f"{url} stream={stream}: {response.status_code} {response.text}")


TARGETS = ("direct", "gateway", "skeleton")


class Bench:
    def __init__(
        self,
        plan: Plan,
        loadgen: LoadGenerator,
        upstream_url: str,
        gateway: Gateway,
        skeleton: tuple[ServerProcess, str],
        mode: str,
    ):
        self.plan = plan
        self.loadgen = loadgen
        self.mode = mode
        self.readyz = gateway.base_url.removesuffix("/v1") + "/readyz"
        self.gateway_pid = _pid(gateway.server)
        headers = {"Content-Type": "application/json"}
        with_key = {**headers, "Authorization": f"Bearer {KEY}"}
        # target: (url, headers, the pid whose CPU time the round measures, if any)
        self.targets: dict[str, tuple[str, dict[str, str], int | None]] = {
            "direct": (upstream_url + CHAT_PATH, headers, None),
            "gateway": (gateway.base_url + CHAT_PATH, with_key, self.gateway_pid),
            "skeleton": (skeleton[1] + CHAT_PATH, with_key, _pid(skeleton[0])),
        }
        self.failed = False

    def learned_limit(self) -> int:
        """The backend's concurrency limit now (the sum over its replicas)."""
        capacity = httpx.get(self.readyz, timeout=10, headers=OPERATOR).json()["capacity"]
        return int(sum(backend["limit"] for backend in capacity.values()))

    def round(
        self, target: str, concurrency: int, stream: bool, seconds: float
    ) -> tuple[RoundResult, float]:
        url, headers, pid = self.targets[target]
        spec = RoundSpec(url, headers, [chat_body(stream)], concurrency, seconds, stream)
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        result = self.loadgen.closed(spec)
        return result, cpu_seconds(pid) - cpu_before if pid is not None else 0.0

    def combination(self, concurrency: int, stream: bool) -> None:
        plan = self.plan
        progress(f"concurrency={concurrency} stream={stream}: warm-up")
        for target in TARGETS:
            self.round(target, concurrency, stream, plan.warm_up_s)
        series = {target: Series() for target in TARGETS}
        for index in range(plan.pairs):
            for target in TARGETS:
                result, server_cpu = self.round(target, concurrency, stream, plan.round_s)
                series[target].add(result, server_cpu)
                progress(
                    f"  round {index + 1}/{plan.pairs} {target:8}: {result.rps:8.1f} req/s, "
                    f"p50 {percentile(result.latencies_ms, 50):.3f} ms"
                    + (f", {result.errors} errors" if result.errors else "")
                )
        self.report(concurrency, stream, series["direct"], series["gateway"], series["skeleton"])

    def report(
        self, concurrency: int, stream: bool, direct: Series, gateway: Series, skeleton: Series
    ) -> None:
        params = {"concurrency": concurrency, "stream": stream, "concurrency_mode": self.mode}
        d50, d99 = percentile(direct.latencies_ms, 50), percentile(direct.latencies_ms, 99)
        g50, g99 = percentile(gateway.latencies_ms, 50), percentile(gateway.latencies_ms, 99)
        emit("added_latency_p50_ms", round(g50 - d50, 3), "ms", **params)
        emit("added_latency_p99_ms", round(g99 - d99, 3), "ms", **params)
        if stream:  # a stream's first token: what a chat user waits for
            f50 = percentile(gateway.first_byte_ms, 50) - percentile(direct.first_byte_ms, 50)
            emit("added_ttft_p50_ms", round(f50, 3), "ms", **params)
            s50 = percentile(skeleton.first_byte_ms, 50) - percentile(direct.first_byte_ms, 50)
            emit("skeleton_added_ttft_p50_ms", round(s50, 3), "ms", **params)
        emit("throughput_gateway_rps", round(gateway.rps, 1), "req/s", **params)
        emit("throughput_direct_rps", round(direct.rps, 1), "req/s", **params)
        ratio = gateway.rps / direct.rps if direct.rps else 0.0
        emit("throughput_ratio", round(ratio, 3), "ratio", **params)
        emit("gateway_rss_mb", round(rss_mb(self.gateway_pid), 1), "MB", **params)
        emit("latency_direct_p50_ms", round(d50, 3), "ms", **params)
        emit("latency_direct_p99_ms", round(d99, 3), "ms", **params)
        emit("latency_gateway_p50_ms", round(g50, 3), "ms", **params)
        emit("latency_gateway_p99_ms", round(g99, 3), "ms", **params)
        s50, s99 = percentile(skeleton.latencies_ms, 50), percentile(skeleton.latencies_ms, 99)
        emit("latency_skeleton_p50_ms", round(s50, 3), "ms", **params)
        emit("latency_skeleton_p99_ms", round(s99, 3), "ms", **params)
        emit("throughput_skeleton_rps", round(skeleton.rps, 1), "req/s", **params)
        ratio = gateway.rps / skeleton.rps if skeleton.rps else float("nan")
        emit("throughput_ratio_vs_skeleton", round(ratio, 3), "ratio", **params)
        spread = round_ratios(gateway.round_rps, skeleton.round_rps)
        if spread:
            emit("throughput_ratio_vs_skeleton_round_min", round(spread[0], 3), "ratio", **params)
            emit("throughput_ratio_vs_skeleton_round_max", round(spread[-1], 3), "ratio", **params)
        if gateway.completed:
            per_request = gateway.server_cpu_s / gateway.completed * 1000.0
            emit("gateway_cpu_ms_per_req", round(per_request, 3), "ms", **params)
            cores = gateway.server_cpu_s / gateway.seconds
            emit("gateway_cpu_cores", round(cores, 3), "ratio", **params)
        if skeleton.completed:
            skeleton_per_request = skeleton.server_cpu_s / skeleton.completed * 1000.0
            emit("skeleton_cpu_ms_per_req", round(skeleton_per_request, 3), "ms", **params)
            cores = skeleton.server_cpu_s / skeleton.seconds
            emit("skeleton_cpu_cores", round(cores, 3), "ratio", **params)
            if gateway.completed:
                cpu_ratio = per_request / skeleton_per_request
                emit("cpu_ms_per_req_vs_skeleton", round(cpu_ratio, 3), "ratio", **params)
        if direct.loadgen_cpu_s:
            ceiling = direct.completed / direct.loadgen_cpu_s
            emit("loadgen_ceiling_rps", round(ceiling, 1), "req/s", **params)
        emit("gateway_concurrency_limit", self.learned_limit(), "requests", **params)
        for name, series in (("direct", direct), ("gateway", gateway), ("skeleton", skeleton)):
            if series.errors:
                self.failed = True
                progress(f"{name}: {series.errors} failed requests, first: {series.first_error}")


def round_ratios(gateway: list[float], skeleton: list[float]) -> list[float]:
    """Gateway req/s over the skeleton's in each pair of rounds run one after the other,
    sorted: how far the machine's noise moves the pooled ratio."""
    return sorted(g / s for g, s in zip(gateway, skeleton, strict=True) if s > 0)


def _pid(server: ServerProcess) -> int:
    if server.process is None:
        raise RuntimeError("server not started")
    return server.process.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter rounds, under a minute")
    parser.add_argument(
        "--concurrency-mode",
        choices=("adaptive", "fixed"),
        default="adaptive",
        help="the backend's concurrency mode (default: adaptive, the gateway's default)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    unwind_on_sigterm()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        work_dir = Path(tmp)
        upstream: ServerProcess | None = None
        gateway: Gateway | None = None
        skeleton: tuple[ServerProcess, str] | None = None
        loadgen = LoadGenerator()
        try:
            upstream, upstream_url = start_fake_upstream(work_dir)
            config = gateway_config(upstream_url, work_dir, args.concurrency_mode)
            gateway = start_gateway_process(config, work_dir)
            skeleton = start_skeleton(upstream_url, work_dir)
            check_answers(
                *(url + CHAT_PATH for url in (upstream_url, gateway.base_url, skeleton[1]))
            )
            progress(f"upstream {upstream_url}, gateway {gateway.base_url}, skeleton {skeleton[1]}")
            mode = args.concurrency_mode
            bench = Bench(plan, loadgen.start(), upstream_url, gateway, skeleton, mode)
            for concurrency, stream in COMBINATIONS:
                bench.combination(concurrency, stream)
            failed = bench.failed
        finally:
            loadgen.stop()
            if gateway is not None:
                gateway.stop()
            if skeleton is not None:
                skeleton[0].stop()
            if upstream is not None:
                upstream.stop()
    progress(f"done in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
