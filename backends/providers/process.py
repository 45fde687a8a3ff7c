"""Model-server processes that the gateway starts, supervises, restarts and stops itself.

Any command line works (the bundled worker, `vllm serve`, a llama.cpp server): `{port}`,
`{host}`, `{weights}` and `{python}` in it are substituted. Each replica is a slot with a
stable id whose supervisor task (in the task group given to `start`) runs one process at a
time, in its own process group:

    launch ─► probe ready_path until 200 ─► ready ─► process exits ─► "crashed"
       ▲          (exit or ready_timeout_s ─► "crashed")                  │
       └──────────────────── backoff (restart_policy) ◄──────────────────┘

A stop request (stop_replica, ensure lowering the count, close) takes the replica out of
`ready()` at once, then sends SIGTERM to its process group, waits `grace_s` for the server
to finish the requests it holds, and only then sends SIGKILL. A replica asked to stop is
never restarted. Which replica to stop, and when it is idle, is the caller's decision.
"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import anyio
from anyio.abc import TaskGroup

from backends.errors import LaunchError
from backends.launcher import free_port
from backends.probe import ReadinessProbe
from backends.providers.errors import ProviderClosed, ReplicaNotFound
from backends.providers.replicas import Phase, Replica, ReplicaEvent, ReplicaListener, notify
from backends.providers.restart_policy import (
    RestartBackoff,
    consecutive_failures,
    restart_delay,
)
from backends.spawn import Child, child_environment, signal_group, spawn

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("{port}", "{host}", "{weights}", "{python}")


@dataclass(frozen=True)
class ProcessLaunch:
    """What to run. `env` is added to the allowlisted part of the gateway's environment
    (backends/spawn.py `child_environment`)."""

    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    weights: str | None = None
    host: str = "127.0.0.1"
    ready_path: str = "/health"
    base_url_template: str = "http://{host}:{port}/v1"
    log_file: Path | None = None  # stdout and stderr appended here; None: inherited
    # Where a start went, read from what the replica wrote to `log_file` since its launch
    # (its output, its launch's unix time -> seconds per phase): backends/vllm_startup.py.
    start_phases: Callable[[str, float], Mapping[str, float]] | None = None
    cwd: Path | None = None


@dataclass(frozen=True)
class ProcessTimings:
    ready_timeout_s: float = 600.0  # loading weights onto a GPU takes minutes
    probe_interval_s: float = 0.5
    probe_timeout_s: float = 2.0
    grace_s: float = 30.0  # SIGTERM → SIGKILL: the longest request a replica may finish


@dataclass(eq=False)
class _Slot:
    id: str
    stopping: bool = False
    process: Child | None = None
    replica: Replica | None = None
    ready_since: float | None = None  # anyio.current_time() when its probe passed
    log_offset: int = 0  # where its output begins in the launch's log_file
    launched_at: float = 0.0  # unix time
    scope: anyio.CancelScope | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


class ProcessProvider:
    def __init__(
        self,
        name: str,
        launch: ProcessLaunch,
        timings: ProcessTimings | None = None,
        backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if launch.weights is None and any("{weights}" in part for part in launch.command):
            raise LaunchError(f"{name}: the command uses {{weights}} but no weights are set")
        if not launch.command:
            raise LaunchError(f"{name}: the command is empty")
        self.name = name
        self.on_change: list[ReplicaListener] = []
        self._launch = launch
        self._timings = timings or ProcessTimings()
        self._backoff = backoff or RestartBackoff()
        self._clock = clock
        self._probe = ReadinessProbe(self._timings.probe_timeout_s)
        self._slots: dict[str, _Slot] = {}
        self._numbers = itertools.count(1)
        self._task_group: TaskGroup | None = None
        self._closed = False

    async def start(self, task_group: TaskGroup) -> None:
        await self._probe.open()
        self._task_group = task_group

    async def ensure(self, count: int) -> None:
        if self._closed:
            raise ProviderClosed(f"{self.name} is closed")
        if count < 0:
            raise ValueError(f"replica count must be >= 0, not {count}")
        live = [slot for slot in self._slots.values() if not slot.stopping]
        for _ in range(count - len(live)):
            self._spawn()
        await self._stop(_surplus(live, len(live) - count))

    def ready(self) -> list[Replica]:
        return [
            slot.replica
            for slot in self._slots.values()
            if slot.replica is not None and slot.ready_since is not None and not slot.stopping
        ]

    def starting(self) -> int:
        return sum(
            1 for slot in self._slots.values() if slot.ready_since is None and not slot.stopping
        )

    async def stop_replica(self, replica_id: str) -> None:
        slot = self._slots.get(replica_id)
        if slot is None:
            raise ReplicaNotFound(f"{self.name} has no replica {replica_id!r}")
        await self._stop([slot])

    async def close(self) -> None:
        self._closed = True
        await self._stop(list(self._slots.values()))
        await self._probe.close()

    def _spawn(self) -> None:
        assert self._task_group is not None, "start() the provider first"
        slot = _Slot(f"{self.name}-{next(self._numbers)}")
        self._slots[slot.id] = slot
        self._task_group.start_soon(self._supervise, slot, name=f"replica {slot.id}")

    async def _stop(self, slots: Sequence[_Slot]) -> None:
        """Stops the slots concurrently (each supervisor drains its own process)."""
        for slot in slots:
            slot.stopping = True
            if slot.scope is not None:
                slot.scope.cancel()
        for slot in slots:
            await slot.done.wait()

    async def _supervise(self, slot: _Slot) -> None:
        failures = 0
        try:
            while not slot.stopping:
                detail = "stopped"
                with anyio.CancelScope() as slot.scope:
                    detail = await self._run_once(slot)
                ready_for = _ready_for(slot)
                await self._reap(slot)
                if slot.stopping:
                    break
                self._emit("crashed", slot, detail)
                logger.warning("replica %s crashed: %s", slot.id, detail)
                failures = consecutive_failures(failures, ready_for, self._backoff)
                with anyio.CancelScope() as slot.scope:
                    await anyio.sleep(restart_delay(failures, self._backoff))
        finally:
            with anyio.CancelScope(shield=True):
                await self._reap(slot)
            del self._slots[slot.id]
            self._emit("stopped", slot, "")
            slot.done.set()

    async def _run_once(self, slot: _Slot) -> str:
        """Runs one process until it ends; returns why it ended (cancelled on a stop)."""
        port = free_port(self._launch.host)
        with anyio.CancelScope(shield=True):  # a process we started must be ours to reap
            try:
                process = slot.process = await self._open(port, slot)
            except OSError as exc:
                return f"cannot start {self._launch.command[0]!r}: {exc.strerror or exc}"
        host = self._launch.host
        slot.replica = Replica(slot.id, self._launch.base_url_template.format(host=host, port=port))
        self._emit("process_started", slot, f"pid {process.pid}")
        if not await self._wait_ready(process, f"http://{host}:{port}{self._launch.ready_path}"):
            if process.returncode is not None:
                return f"exited with code {process.returncode} before it was ready"
            return f"not ready within {self._timings.ready_timeout_s:g} s"
        slot.ready_since = anyio.current_time()
        self._emit("ready", slot, "", await self._start_phases(slot))
        code = await process.wait()
        return f"exited with code {code}" if code >= 0 else f"killed by signal {-code}"

    async def _open(self, port: int, slot: _Slot) -> Child:
        slot.launched_at = self._clock()
        spawned_at = {"WORKER_SPAWNED_AT": f"{slot.launched_at:.6f}"}
        env = child_environment({**self._launch.env, **spawned_at})  # never the gateway's secrets
        log = await self._open_log()
        if log is not None:
            slot.log_offset = log.tell()  # appending: its own output starts here
        try:
            return await spawn(  # not the event loop's fork: see backends/spawn.py
                self._command(port),
                stdout=log,
                stderr=log,
                env=env,
                cwd=self._launch.cwd,
                start_new_session=True,  # its own process group: signals reach its children
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor

    async def _start_phases(self, slot: _Slot) -> Mapping[str, float]:
        """Where the replica's start went, from its output since its launch (empty when
        the launch has no log file or no reader: the timeline's own phases stand)."""
        path, read = self._launch.log_file, self._launch.start_phases
        if path is None or read is None:
            return {}

        def output() -> str:
            with path.open("rb") as log:
                log.seek(slot.log_offset)
                return log.read().decode("utf-8", "replace")

        try:
            text = await anyio.to_thread.run_sync(output)
        except OSError:
            return {}
        return read(text, slot.launched_at)

    async def _open_log(self) -> IO[bytes] | None:
        path = self._launch.log_file
        if path is None:
            return None
        return await anyio.to_thread.run_sync(path.open, "ab")

    def _command(self, port: int) -> list[str]:
        values = {
            "{port}": str(port),
            "{host}": self._launch.host,
            "{weights}": self._launch.weights or "",
            "{python}": sys.executable,
        }
        return [_substitute(part, values) for part in self._launch.command]

    async def _wait_ready(self, process: Child, url: str) -> bool:
        """True once `url` answers 200; False if the process exits or the time runs out."""
        with anyio.move_on_after(self._timings.ready_timeout_s):
            while process.returncode is None:
                if await self._probe.passes(url):
                    return process.returncode is None
                await anyio.sleep(self._timings.probe_interval_s)
        return False

    async def _reap(self, slot: _Slot) -> None:
        """Ends the slot's process group (if anything is left of it) and waits for it."""
        slot.ready_since = None
        process = slot.process
        if process is None:
            return
        if process.returncode is None:
            signal_group(process.pid, signal.SIGTERM)
            with anyio.move_on_after(self._timings.grace_s):
                await process.wait()
        # SIGKILL the group even when its leader has exited: a server's own children
        # (engine processes holding GPU memory) must not outlive it.
        signal_group(process.pid, signal.SIGKILL)
        await process.aclose()
        slot.process = None  # only now: a reap cancelled halfway is redone in full

    def _emit(
        self, phase: Phase, slot: _Slot, detail: str, phases: Mapping[str, float] | None = None
    ) -> None:
        base_url = slot.replica.base_url if slot.replica else None
        at = self._clock()
        event = ReplicaEvent(self.name, phase, slot.id, at, base_url, detail, phases or {})
        notify(self.on_change, event)


def _surplus(live: Sequence[_Slot], excess: int) -> list[_Slot]:
    """Which replicas to stop to shed `excess`: those not ready yet, then the newest."""
    if excess <= 0:
        return []
    ranked = sorted(enumerate(live), key=lambda pair: (pair[1].ready_since is not None, -pair[0]))
    return [slot for _, slot in ranked[:excess]]


def _ready_for(slot: _Slot) -> float | None:
    if slot.ready_since is None:
        return None
    return anyio.current_time() - slot.ready_since


def _substitute(part: str, values: Mapping[str, str]) -> str:
    # Plain replacement, not str.format: other braces (JSON arguments) pass unchanged.
    for placeholder in PLACEHOLDERS:
        part = part.replace(placeholder, values[placeholder])
    return part
