"""How long a backend takes to start, learned from its own recent starts.

A start's time is from its cold-start episode's beginning (the first request, or the
autoscaler's word) until a replica is ready, on the manager's clock; a stored timeline
(`warmpool.timeline.ColdStartRecord`, read back as JSON) gives the same span as its
`ready` event minus `begun_at`. The estimate is the median of the last `HISTORY` starts:
one start that staged its weights first (minutes) or one that found them in the page
cache (seconds) does not move it much, and it follows a lasting change within a few
starts. With no start measured there is no estimate (None), and the gateway then refuses
no request for want of time: a guess would refuse requests that would have been served.

    times = StartTimes(seed)              seed: past starts' seconds, oldest first
    times.observe(seconds)                a start just ended with a ready replica
    times.estimate_s()                    the median, or None
    times.remaining_s(elapsed_s)          the estimate less what a start under way has
                                          already taken (0 once it runs late), or None
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

HISTORY = 8  # starts remembered per backend
_SUCCEEDED = ("served", "ready", "no_first_byte")  # timeline outcomes with a ready replica


class StartTimes:
    """The last `history` start times of one backend (seconds) and their median."""

    def __init__(self, seed: Iterable[float] = (), history: int = HISTORY) -> None:
        if history < 1:
            raise ValueError("history must be at least 1")
        self._times: deque[float] = deque(maxlen=history)
        for seconds in seed:
            self.observe(seconds)

    @property
    def samples(self) -> int:
        return len(self._times)

    def observe(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self._times.append(seconds)

    def estimate_s(self) -> float | None:
        return statistics.median(self._times) if self._times else None

    def remaining_s(self, elapsed_s: float) -> float | None:
        estimate = self.estimate_s()
        return None if estimate is None else max(0.0, estimate - max(0.0, elapsed_s))


def ready_seconds(record: Mapping[str, Any]) -> float | None:
    """A stored timeline's start time: `begun_at` (else its first event) to its first
    `ready`; None for a start that failed or never got a replica."""
    if record.get("outcome") not in _SUCCEEDED or record.get("kind", "start") != "start":
        return None  # a wake (warmpool.sleep) takes seconds: no start's estimate
    times: dict[str, float] = {}
    for event in record.get("events") or ():
        if isinstance(event, Mapping) and isinstance(event.get("at"), int | float):
            times.setdefault(str(event.get("event")), float(event["at"]))
    begun = record.get("begun_at")
    start = float(begun) if isinstance(begun, int | float) else min(times.values(), default=None)
    ready = times.get("ready")
    if start is None or ready is None or ready < start:
        return None
    return ready - start


def start_history(
    records: Iterable[Mapping[str, Any]], history: int = HISTORY
) -> dict[str, list[float]]:
    """Each backend's last `history` start times, oldest first, from stored timelines in
    the order they were written."""
    by_backend: dict[str, deque[float]] = {}
    for record in records:
        seconds = ready_seconds(record)
        if seconds is not None:
            backend = str(record.get("backend"))
            by_backend.setdefault(backend, deque(maxlen=history)).append(seconds)
    return {backend: list(times) for backend, times in by_backend.items()}
