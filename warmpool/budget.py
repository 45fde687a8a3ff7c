"""Which staged models to evict so that another fits the disk budget. A pure function.

Everything on disk counts: published models, partial downloads left by interrupted
stagings, and the full size of stagings in progress (reserved up front, so two concurrent
stagings cannot both count on the same free space). Pinned and busy entries never go;
the rest go least recently used first, and only as many as needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmpool.errors import DiskBudgetExceeded


@dataclass(frozen=True)
class CacheEntry:
    model: str
    bytes: int
    last_used: float
    pinned: bool = False
    busy: bool = False  # being staged or read ahead
    partial: bool = False  # an interrupted download, not a published model

    @property
    def evictable(self) -> bool:
        return not (self.pinned or self.busy)


def plan_eviction(
    entries: Sequence[CacheEntry], model: str, needed: int, budget: int
) -> list[CacheEntry]:
    """The entries to remove, in order, so that `needed` more bytes fit into `budget`."""
    free = budget - sum(e.bytes for e in entries)
    victims: list[CacheEntry] = []
    for entry in sorted((e for e in entries if e.evictable), key=lambda e: e.last_used):
        if free >= needed:
            break
        victims.append(entry)
        free += entry.bytes
    if free < needed:
        unevictable = sum(e.bytes for e in entries if not e.evictable)
        raise DiskBudgetExceeded(model, needed, budget, unevictable)
    return victims
