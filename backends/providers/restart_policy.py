"""When to restart a crashed replica: exponential backoff, forgiven after a healthy run."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from common.backoff import Backoff


@dataclass(frozen=True)
class RestartBackoff:
    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 60.0
    reset_after_s: float = 60.0  # a replica ready this long starts counting failures afresh

    @cached_property
    def delays(self) -> Backoff:
        """No jitter: one replica restarting has nobody to be spread out from."""
        return Backoff(self.initial_s, self.max_s, self.factor, jitter="none")


def consecutive_failures(previous: int, ready_for_s: float | None, backoff: RestartBackoff) -> int:
    """Failures in a row after one more; `ready_for_s` is None when it never got ready."""
    if ready_for_s is not None and ready_for_s >= backoff.reset_after_s:
        return 1
    return previous + 1


def restart_delay(failures: int, backoff: RestartBackoff) -> float:
    """Seconds to wait before the next start, after `failures` (>= 1) failures in a row."""
    return float(backoff.delays.delay_s(failures))
