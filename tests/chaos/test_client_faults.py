"""Clients that misbehave: hostile bodies, slowloris, hanging up mid-stream."""

from __future__ import annotations

from bench import chaos_cases
from bench.chaos_deployment import Deployment


def test_hostile_bodies_get_4xx_never_5xx(live: Deployment) -> None:
    chaos_cases.hostile_bodies(live).check()


def test_slowloris_is_cut_off_and_starves_no_one(live: Deployment) -> None:
    chaos_cases.slow_clients(live).check()


def test_clients_leaving_mid_stream_cancel_upstream_without_leaks(live: Deployment) -> None:
    chaos_cases.disconnects(live).check()
