"""A gateway replica SIGKILLed under load."""

from __future__ import annotations

from bench import chaos_cases
from bench.chaos_deployment import Deployment


def test_replica_killed_under_load_clients_retry_on_the_other(live: Deployment) -> None:
    chaos_cases.replica_killed(live).check()
