"""Real servers as subprocesses on free loopback ports, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]


def unwind_on_sigterm() -> None:
    """A SIGTERM unwinds like Ctrl-C, so that a benchmark's `finally` stops its servers
    (vLLM's engine core outlives its API server when that is killed alone) and removes
    its files."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# Every gateway a test starts has this operator key, which reads /metrics and /readyz's
# details (gateway/tenancy/operators.py): send `OPERATOR` as the headers of those reads.
OPERATOR_KEY = "op-test-operator-key-0123456789abcdef"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A subprocess serving HTTP; its output goes to `log_path` (tests scan it for secrets)."""

    def __init__(
        self,
        command: list[str],
        ready_url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.command = command
        self.ready_url = ready_url
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> ServerProcess:
        """Starts the process and returns at once (`wait_ready` waits for it)."""
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> ServerProcess:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.command} exited {self.process.returncode}:\n{self.log()}"
                )
            try:
                if httpx.get(self.ready_url, timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.ready_url} not ready in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


def start_fake_upstream(log_dir: Path, echo_delay_ms: float = 0.0) -> tuple[ServerProcess, str]:
    port = free_port()
    delay = ["--echo-delay-ms", str(echo_delay_ms)] if echo_delay_ms else []
    server = ServerProcess(
        [sys.executable, "-m", "bench.fake_upstream", "--port", str(port), *delay],
        f"http://127.0.0.1:{port}/v1/models",
        log_dir / f"fake-upstream-{port}.log",
    ).start()
    return server, f"http://127.0.0.1:{port}/v1"


def start_gateway(
    config: dict[str, Any],
    work_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Gateway:
    port = free_port()
    config_path = work_dir / f"gateway-{port}.yaml"
    config_path.write_text(yaml.safe_dump(with_shared_batch_files(config, work_dir)))
    server = ServerProcess(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(config_path),
            "--port",
            str(port),
        ],
        f"http://127.0.0.1:{port}/healthz",
        work_dir / f"gateway-{port}.log",
        env={"GATEWAY_OPERATOR_KEY": OPERATOR_KEY, **(env or {})},
    ).start(timeout_s)
    return Gateway(server, port, config_path)


def with_shared_batch_files(config: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    """`config`, where it shares a Redis state and says nothing of batch files, with them
    in one folder of `work_dir` marked shared: the gateways a test starts run on this one
    machine, so that folder is one every replica sees (a gateway refuses to start with a
    Redis state and local files otherwise: docs/batch-jobs.md "Where it lives")."""
    state = config.get("state") or {}
    batches = config.get("batches") or {}
    if state.get("url", "memory") == "memory" or "files" in batches:
        return config
    if batches.get("enabled", True) is False:
        return config
    files = {"path": str(work_dir / "batch-files"), "shared": True}
    return {**config, "batches": {**batches, "files": files}}


class Gateway:
    def __init__(self, server: ServerProcess, port: int, config_path: Path) -> None:
        self.server = server
        self.port = port
        self.config_path = config_path
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = self.url + "/v1"

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            timeout=60,
        )

    def stop(self) -> int | None:
        return self.server.stop()


class RedisServer:
    """A private redis-server on a free loopback port (nothing kept on disk)."""

    def __init__(self, folder: Path, binary: str = "redis-server", timeout_s: float = 10.0) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.url):
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"started redis-server on port {self.port}; it does not answer")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False
