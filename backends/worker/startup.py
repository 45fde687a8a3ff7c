"""How far a worker has come in starting, and how long each step took.

A worker goes through these phases, in this order, each ending where the next begins:

    starting         process exec → the server is up (answers /health with 503)
    importing        torch and transformers imported, device chosen
    reading_weights  safetensors files → tensors (chat models on the fast loader)
    building         models assembled around those tensors; tokenizers; embedding models
    probing          one real forward pass per model (a generated token, an embedding)
    ready            serving

or `failed` from any of them. Durations are differences of consecutive marks, so they add
up to the total exactly. Marks come from one clock: the wall clock at the moment the report
is created, advanced by `perf_counter`, so they can be compared with the spawn time (a
wall-clock instant) and never go backwards.

The spawn time is the `WORKER_SPAWNED_AT` environment variable (Unix seconds) when the
launcher sets it, which also counts the launcher's own fork and exec; otherwise the start
time of this process in /proc/self/stat (set at fork, 10 ms resolution).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

Phase = Literal[
    "starting", "importing", "reading_weights", "building", "probing", "ready", "failed"
]
SPAWNED_AT_ENV = "WORKER_SPAWNED_AT"

# Each phase's duration, under the name the report gives it.
DURATIONS: dict[Phase, str] = {
    "starting": "process_start_s",
    "importing": "imports_s",
    "reading_weights": "weights_read_s",
    "building": "model_built_s",
    "probing": "first_forward_s",
}
# Where each phase ends, under the name of the report's timeline.
MILESTONES: dict[Phase, str] = {
    "starting": "serving",
    "importing": "imported",
    "reading_weights": "weights_read",
    "building": "model_built",
    "probing": "first_forward",
}


class StartupReport:
    """Written by the loading thread, read by request handlers; a lock keeps reads whole."""

    def __init__(
        self, spawned_at: float, spawned_from: str, clock: Callable[[], float] | None = None
    ) -> None:
        self.spawned_at = spawned_at
        self.spawned_from = spawned_from
        self._clock = clock or _wall_clock()
        self._lock = threading.Lock()
        self._phase: Phase = "starting"
        self._marks: list[tuple[Phase, float]] = []  # (phase that ended, when)
        self._models: dict[str, dict[str, object]] = {}
        self._error: str | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def ready(self) -> bool:
        return self._phase == "ready"

    @property
    def failed(self) -> bool:
        return self._phase == "failed"

    def begin(self, phase: Phase) -> None:
        """End the current phase now and start `phase`."""
        with self._lock:
            if self._phase not in ("ready", "failed"):
                self._marks.append((self._phase, self._clock()))
                self._phase = phase

    def fail(self, error: str) -> None:
        with self._lock:
            self._error = error
            self._phase = "failed"

    def record(self, model: str, **facts: object) -> None:
        """Add facts about one model (its loader, bytes, how long each of its steps took)."""
        with self._lock:
            self._models.setdefault(model, {}).update(facts)

    def as_json(self) -> dict[str, object]:
        with self._lock:
            marks, models = list(self._marks), {k: dict(v) for k, v in self._models.items()}
            phase, error = self._phase, self._error
        timeline = {MILESTONES[name]: round(at - self.spawned_at, 4) for name, at in marks}
        durations: dict[str, float | None] = dict.fromkeys(DURATIONS.values())
        starts = [self.spawned_at, *(at for _, at in marks)]
        for (name, end), start in zip(marks, starts, strict=False):
            durations[DURATIONS[name]] = round(end - start, 4)
        return {
            "ready": phase == "ready",
            "phase": phase,
            "phases": durations,
            "total_s": timeline.get("first_forward") if phase == "ready" else None,
            "elapsed_s": round(self._clock() - self.spawned_at, 4),
            "timeline": timeline,
            "spawned_at": self.spawned_at,
            "spawned_from": self.spawned_from,
            "models": models,
            "error": error,
        }


def spawn_time(environ: Mapping[str, str]) -> tuple[float, str]:
    """When this process was started (Unix seconds), and where that was read from."""
    value = environ.get(SPAWNED_AT_ENV, "")
    if value:
        try:
            return float(value), SPAWNED_AT_ENV
        except ValueError:
            pass  # a malformed value is ignored rather than stopping the worker
    started = _proc_start_time()
    if started is not None:
        return started, "/proc/self/stat"
    return time.time(), "worker main()"


def _proc_start_time() -> float | None:
    """Linux only: field 22 of /proc/self/stat is the start time in clock ticks since boot."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # fields after the command name start at field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return time.time() - age


def _wall_clock() -> Callable[[], float]:
    wall, counter = time.time(), time.perf_counter()
    return lambda: wall + (time.perf_counter() - counter)
