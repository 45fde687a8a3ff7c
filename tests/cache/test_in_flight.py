"""The registry of what is under way per exact cache key (cache/in_flight.py): each kind of
work is found by key while it runs, and ending an older one leaves a newer one in place."""

from __future__ import annotations

import anyio
import numpy as np

from cache.entry import CacheEntry
from cache.in_flight import InFlight


def entry(entry_id: str, key: str = "k") -> CacheEntry:
    vector = np.zeros(4, dtype=np.float32)
    return CacheEntry(entry_id, "ns", "p", key, "n", vector, b"", b"{}", "m", "t", 0.0, 60.0)


async def test_a_lookup_is_found_until_it_ends_and_its_waiters_wake() -> None:
    registry: InFlight[str, object] = InFlight()
    shared = registry.begin_lookup("k")
    assert registry.lookup("k") is shared and registry.lookup("other") is None
    shared.result = "found"
    registry.end_lookup("k", shared)
    assert registry.lookup("k") is None
    with anyio.fail_after(1):
        await shared.done.wait()


def test_a_flight_that_lands_late_leaves_the_next_one_up() -> None:
    registry: InFlight[str, object] = InFlight()
    first, second = object(), object()
    assert registry.lead("k", first) is first
    registry.lead("k", second)  # the first was released; a new leader took the key
    registry.land("k", first)
    assert registry.flight("k") is second
    registry.land("k", second)
    assert registry.flight("k") is None


def test_the_first_answer_storing_is_served_and_only_its_end_clears_it() -> None:
    registry: InFlight[str, object] = InFlight()
    one, two = entry("e1"), entry("e2")
    registry.store(one)
    registry.store(two)  # an identical answer while the first is storing: not served
    assert registry.storing("k") is one and registry.storing_id("e1") is one
    assert registry.storing_id("e2") is None
    registry.stored(two)
    assert registry.storing("k") is one
    registry.stored(one)
    assert registry.storing("k") is None and registry.storing_id("e1") is None
