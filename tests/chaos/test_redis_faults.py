"""Redis stopped, restarted and flushed while traffic runs through two replicas."""

from __future__ import annotations

from bench import chaos_cases
from bench.chaos_deployment import Deployment


def test_redis_stopped_and_restarted_while_traffic_runs(live: Deployment) -> None:
    chaos_cases.redis_outage(live).check()


def test_redis_flushed_while_traffic_runs(live: Deployment) -> None:
    chaos_cases.redis_flush(live).check()
