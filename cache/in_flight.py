"""What is under way for each exact cache key, in one place.

The exact key names the cache scope, the model, every field that changes the answer and
the prompt: two requests with one key could share a cache entry. Three things may be under
way for a key, each letting an identical request that comes meanwhile wait instead of doing
the work again:

    a lookup          its result, for identical lookups (cache/semantic.py `_shared`)
    an upstream call  a flight, that identical requests follow (gateway/coalesce.py)
    a store           the answer, served from memory to identical lookups until the store
                      has it (cache/semantic.py `store_later`)

A repeat that comes at any moment finds one of them, as long as a flight lands only once
its answer is storing: gateway/lifecycle.py stores, then lands, in one step with no wait
between. One registry is shared by the cache and the flights (gateway/compose/ builds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio

from cache.entry import CacheEntry

R = TypeVar("R")  # what a lookup finds
F = TypeVar("F")  # a flight


@dataclass(eq=False)
class Shared(Generic[R]):
    """A lookup under way, for identical ones to wait on."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: R | None = None  # None once done: its request left before it ended


class InFlight(Generic[R, F]):
    def __init__(self) -> None:
        self._lookups: dict[str, Shared[R]] = {}
        self._flights: dict[str, F] = {}
        self._storing: dict[str, CacheEntry] = {}

    # Lookups.

    def lookup(self, key: str) -> Shared[R] | None:
        return self._lookups.get(key)

    def begin_lookup(self, key: str) -> Shared[R]:
        shared = self._lookups[key] = Shared()
        return shared

    def end_lookup(self, key: str, shared: Shared[R]) -> None:
        if self._lookups.get(key) is shared:
            del self._lookups[key]
        shared.done.set()

    # Flights.

    def flight(self, key: str) -> F | None:
        return self._flights.get(key)

    def lead(self, key: str, flight: F) -> F:
        self._flights[key] = flight
        return flight

    def land(self, key: str, flight: F) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]

    # Stores.

    def storing(self, key: str) -> CacheEntry | None:
        return self._storing.get(key)

    def storing_id(self, entry_id: str) -> CacheEntry | None:
        return next((e for e in self._storing.values() if e.entry_id == entry_id), None)

    def store(self, entry: CacheEntry) -> None:
        """The first answer being stored for a key is the one served meanwhile."""
        self._storing.setdefault(entry.exact_key, entry)

    def stored(self, entry: CacheEntry) -> None:
        """`entry` is stored, or will not be: served from the store from now on."""
        if self._storing.get(entry.exact_key, entry).entry_id == entry.entry_id:
            self._storing.pop(entry.exact_key, None)
