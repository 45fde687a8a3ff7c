"""A backend with a sleep tier (vLLM's sleep mode, faked) cycled through start, sleep,
wake (a burst arriving while it dozes) and stop under traffic: no request lost."""

from __future__ import annotations

from bench import chaos_sleep
from bench.chaos_deployment import Deployment


def test_start_sleep_wake_stop_cycle_loses_no_request(live: Deployment) -> None:
    for burst in chaos_sleep.sleep_cycles(live):
        burst.check()
