"""A small real deployment on loopback for fault injection: two gateway replicas sharing a
private Redis (restartable on its port), a healthy upstream and a misbehaving one.

Healthy traffic (`echo`) and the faults (`slow`, `die-midstream`, ...) go to two backends
on two upstream processes, so a fault that opens one backend's circuit breaker, or kills
its upstream, never changes what the healthy backend answers.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fake_upstream import MODELS, on_demand_backend
from bench.processes import (
    Gateway,
    ServerProcess,
    free_port,
    redis_answers,
    start_fake_upstream,
    start_gateway,
)

KEYS = {name: f"sk-test-chaos-{name}-0123456789" for name in ("a", "b", "q", "k")}
QUOTA_RPM = 40  # requests per minute of tenants `q` and `k`, shared by the replicas
MAX_BODY = 64 * 1024
READ_TIMEOUT_S = 1.5  # the faulty backend's first-byte / between-chunks timeout
# The fake upstream's misbehaving models, served by the faulty backend; all but
# `busy-429`, which no case uses.
FAULT_MODELS = [m for m in MODELS if m not in ("echo", "busy-429")]


# The fake upstream as a model server each gateway replica starts on demand and stops
# when idle: cold starts, and a worker to kill while it serves.
ON_DEMAND = on_demand_backend(
    ["cold-echo", "slow-cold"],
    {"idle_s": 1.0, "last_replica_idle_s": 2.0, "stable_window_s": 1.0},
    max_concurrency=8,
)


# A model server whose start always fails: its weights are staged from an S3 endpoint that
# refuses every connection (`never_starts`), so streamed requests held for it get
# keep-alives, then the start's error.
NEVER_STARTS_MODEL = "never-ready"


def never_starts(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The backend, and the staging settings whose S3 endpoint refuses connections."""
    backend = on_demand_backend(
        [NEVER_STARTS_MODEL], {}, name="never-starts", weights={"uri": "s3://chaos/none/"}
    )
    staging = {
        "cache_dir": str(folder / "weights"),
        "s3": {
            "endpoint_url": f"http://127.0.0.1:{free_port()}",  # nothing listens there
            "access_key_id": "chaos",
            "secret_access_key": "chaos-unused",
        },
    }
    return backend, staging


# The fake vLLM engine in sleep mode, which each gateway replica starts on demand, puts to
# sleep when idle, wakes for requests and stops after sleep_s: the sleep tier's cycle
# (tests/chaos/test_sleep_cycles.py). A long doze, so a burst can arrive while it dozes.
SLEEPY = {
    "name": "sleepy",
    "kind": "process",
    "command": [
        *("{python}", "-m", "bench.fake_engine", "--port", "{port}", "--model", "sleepy-llm"),
        *("--enable-sleep-mode", "--doze-s", "0.6", "--wake-s", "0.3", "--step-a-ms", "2"),
    ],
    "models": ["sleepy-llm"],
    "engine": "vllm",
    "sleep": True,
    "scaling": {"idle_s": 1.0, "sleep_s": 4.0, "stable_window_s": 1.0, "panic_window_s": 0.5},
}


def key_hash(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


class RestartableRedis:
    """A private redis-server that can be stopped and started again on the same port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, timeout_s: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.folder)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.url):
            assert time.monotonic() < deadline, f"redis-server on {self.port} does not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url, socket_timeout=2).flushall()


def restart_upstream(server: ServerProcess) -> None:
    """Starts a killed fake upstream again, on the same port (its URL stays valid)."""
    server.kill()
    server.start()


def upstream_stats(base_url: str) -> dict[str, int]:
    return dict(httpx.get(base_url.removesuffix("/v1") + "/_stats", timeout=5).json())


def deployment_config(
    redis_url: str, good: str, faulty: str, prefix: str, folder: Path
) -> dict[str, Any]:
    def tenant(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "keys": [{"sha256": key_hash(KEYS[name])}], **extra}

    unstartable, staging = never_starts(folder)

    return {
        "state": {"url": redis_url, "prefix": prefix},
        "limits": {"max_body_bytes": MAX_BODY},
        # A generous lookup budget: the 2-core test machine is slow; a stopped Redis must
        # still fail open well inside it (checked by the latency of those answers).
        # Few entries per namespace: a soak reaches the LRU bound during its warm-up, so
        # memory growth after it is a leak, not the cache filling up.
        "cache": {"enabled": True, "lookup_budget_ms": 1000, "max_entries_per_namespace": 200},
        "backends": [
            {"name": "good", "base_url": good, "models": ["echo"]},
            ON_DEMAND,
            SLEEPY,
            {
                "name": "faulty",
                "base_url": faulty,
                "models": FAULT_MODELS,
                "api_key": "upstream-secret-xyz",
                "timeouts": {"connect_s": 1.0, "read_s": READ_TIMEOUT_S},
                # Its models answer in 0 s to minutes by design: the latency limiter would
                # read the slow ones as a queue and shed (503) where these cases check
                # what the deadline and timeouts do. Learned limits have their own tests.
                "concurrency": {"mode": "fixed"},
            },
            unstartable,
        ],
        "staging": staging,
        "tenants": [
            tenant("a"),
            tenant("b"),
            tenant("q", quotas={"requests_per_minute": QUOTA_RPM, "tokens_per_minute": 100_000}),
            tenant("k", quotas={"requests_per_minute": QUOTA_RPM}),  # the replica-kill case's
        ],
        # Keep-alives at once: a held stream's status goes out before its start can fail.
        "traffic": {"breaker": False, "hold": {"keepalive_s": 0.05}},
    }


@dataclass
class Deployment:
    folder: Path
    redis: RestartableRedis
    good: ServerProcess
    good_url: str
    faulty: ServerProcess
    faulty_url: str
    config: dict[str, Any]
    replicas: list[Gateway] = field(default_factory=list)

    @property
    def base_urls(self) -> list[str]:
        return [g.base_url for g in self.replicas]

    def log_paths(self) -> list[Path]:
        return [g.server.log_path for g in self.replicas]

    def add_replica(self, config: dict[str, Any] | None = None) -> Gateway:
        gateway = start_gateway(config or self.config, self.folder, timeout_s=180)
        self.replicas.append(gateway)
        return gateway

    def close(self) -> None:
        for gateway in self.replicas:
            gateway.stop()
        for server in (self.good, self.faulty):
            server.stop()
        self.redis.stop()


@contextlib.contextmanager
def deployment(folder: Path, replicas: int = 2, prefix: str = "chaos") -> Iterator[Deployment]:
    """Everything started is stopped on the way out, even when a later start fails."""
    with contextlib.ExitStack() as stack:
        redis_server = RestartableRedis(folder)
        stack.callback(redis_server.stop)
        good, good_url = start_fake_upstream(folder)
        stack.callback(good.stop)
        faulty, faulty_url = start_fake_upstream(folder)
        stack.callback(faulty.stop)
        config = deployment_config(redis_server.url, good_url, faulty_url, prefix, folder)
        made = Deployment(folder, redis_server, good, good_url, faulty, faulty_url, config)
        stack.callback(made.close)
        # Started side by side: each spends most of its start loading MiniLM.
        with ThreadPoolExecutor(max(1, replicas)) as pool:
            list(pool.map(lambda _: made.add_replica(), range(replicas)))
        yield made
