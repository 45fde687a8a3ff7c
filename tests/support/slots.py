"""Waiting, in an end-to-end test, until a gateway's backend holds a request."""

from __future__ import annotations

import time

import httpx

from bench.capacity import capacity_view
from bench.processes import OPERATOR, Gateway


def holding(gateway: Gateway, backend: str, timeout_s: float = 10.0) -> None:
    """Returns once `backend` has a request in flight (its /readyz `in_flight`). A fixed
    sleep after starting the holder (0.3 s) was too short once under `make test`'s load:
    the next request found the slot free (a clean clone, 2026-12-07)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readyz = httpx.get(gateway.url + "/readyz", headers=OPERATOR).text
        view = capacity_view(readyz, backend)
        if view is not None and view.get("in_flight"):
            return
        time.sleep(0.02)
    raise AssertionError(f"no request held {backend}'s slot within {timeout_s} s")
