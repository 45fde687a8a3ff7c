"""Bundled-worker-style backends under traffic: cold starts, and workers killed while they
serve. (Killed mid-start, staging interrupted, S3 5xx, corrupted objects: tests/warmpool.)"""

from __future__ import annotations

from bench import chaos_cases
from bench.chaos_deployment import Deployment


def test_cold_start_then_worker_killed_while_serving(live: Deployment) -> None:
    for burst in chaos_cases.cold_starts(live):
        burst.check()


def test_held_streams_whose_start_fails_end_with_its_error(live: Deployment) -> None:
    chaos_cases.held_start_fails(live).check()
