"""A local model-server process that the gateway starts with itself and stops with itself."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Mapping, Sequence

from backends.errors import LaunchError
from backends.probe import ReadinessProbe
from backends.spawn import Child, child_environment, first_cpus, signal_group, spawn

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


PROBE_TIMEOUT_S = 2.0  # one readiness probe; a loading server may be slow to answer


class LocalProcess:
    """`cpus`: the process runs on the gateway's first `cpus` CPUs, where the gateway has
    more than that (`backends[].launch.cpus`)."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        ready_url: str,
        cpus: int | None = None,
    ) -> None:
        self._command = list(command)
        self._env = child_environment(env)  # never the gateway's secrets
        self._ready_url = ready_url
        self._cpus = cpus
        self._process: Child | None = None

    async def start(self, timeout_s: float) -> None:
        cpus = first_cpus(self._cpus)
        if self._cpus is not None and cpus is None:
            logger.warning(
                "%r shares every CPU with the gateway: launch.cpus is %d, and the gateway "
                "has no more CPUs than that (or this platform sets no CPU affinity)",
                self._command[0],
                self._cpus,
            )
        try:  # not the event loop's fork: see backends/spawn.py
            self._process = await spawn(
                self._command, env=self._env, start_new_session=True, cpus=cpus
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {self._command[0]!r}: {exc.strerror}") from exc
        if cpus is not None:
            logger.info("%r runs on CPUs %s", self._command[0], sorted(cpus))
        await self._wait_ready(timeout_s)

    async def _wait_ready(self, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        probe = ReadinessProbe(PROBE_TIMEOUT_S)
        await probe.open()
        try:
            while time.monotonic() < deadline:
                if self._process.returncode is not None:
                    raise LaunchError(
                        f"{self._command[0]!r} exited with code {self._process.returncode} "
                        "before it was ready (its output is above)"
                    )
                if await probe.passes(self._ready_url):
                    return
                await asyncio.sleep(0.2)
        finally:
            await probe.close()
        await self.stop()
        raise LaunchError(f"{self._ready_url} was not ready within {timeout_s:.0f} s")

    async def stop(self, grace_s: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            signal_group(process.pid, signal.SIGKILL)
            await process.wait()
