"""Upstreams that die, hang, lie or dawdle, under traffic: every request still gets exactly
one answer (the model's, the cache's, or the documented error) and is logged once."""

from __future__ import annotations

from bench import chaos_cases
from bench.chaos_deployment import Deployment


def test_every_upstream_fault_gets_its_documented_answer(live: Deployment) -> None:
    chaos_cases.upstream_faults(live).check()


def test_upstream_killed_mid_request_and_mid_stream_then_back(live: Deployment) -> None:
    for burst in chaos_cases.upstream_killed(live):
        burst.check()


def test_upstream_slower_than_its_timeout_gets_504_at_the_timeout(live: Deployment) -> None:
    chaos_cases.slow_upstream(live).check()
