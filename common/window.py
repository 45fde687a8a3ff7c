"""Amounts summed per key over a sliding window of time: the one building block behind the
traffic core's recent counts (dispatches per class, completions per class and tenant, the
prompt steps of finished lower-class requests).

Pure: the caller passes the time. An entry recorded at `t` counts while `now - window_s <
t`, so it leaves the window at exactly `t + window_s`. Memory is one entry per record
still in the window, and one sum per key with an entry in it: a key whose last entry left
is forgotten.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WindowSums(Generic[K]):
    """Per-key sums of the amounts recorded in the last `window_s` (on the caller's clock)."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._entries: deque[tuple[float, K, float]] = deque()
        self._sums: dict[K, float] = {}
        self._counts: dict[K, int] = {}  # entries per key: a float sum may keep a residue

    def add(self, at: float, key: K, amount: float = 1.0) -> None:
        """Records `amount` for `key` at time `at` (not before the last record's time)."""
        self._entries.append((at, key, amount))
        self._sums[key] = self._sums.get(key, 0.0) + amount
        self._counts[key] = self._counts.get(key, 0) + 1

    def expire(self, now: float) -> list[K]:
        """Drops what left the window by `now`; returns the keys forgotten (no entry left)."""
        horizon = now - self.window_s
        gone: list[K] = []
        entries = self._entries
        while entries and entries[0][0] <= horizon:
            _, key, amount = entries.popleft()
            self._counts[key] -= 1
            if self._counts[key]:
                self._sums[key] -= amount
            else:
                del self._counts[key], self._sums[key]
                gone.append(key)
        return gone

    def get(self, key: K) -> float:
        """The sum for `key` in the window as of the last `expire` (0 when none)."""
        return self._sums.get(key, 0.0)

    def __iter__(self) -> Iterator[K]:
        """The keys with an entry in the window."""
        return iter(self._sums)

    def __bool__(self) -> bool:
        return bool(self._entries)
