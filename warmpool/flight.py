"""A staging in flight: one download that the concurrent `stage()` calls for a model share.

The caller that starts it leads (`WeightStager._lead`): it does the work and settles the
`Flight`'s future; the others await that future (shielded) and hear its progress. A leader
cancelled midway ends the future with `LeaderGone`, and one of the waiting callers leads in
its place, resuming from what is on disk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from warmpool.staged import StagedModel

# The stager's logger: a listener's failure is the stager's to report.
log = logging.getLogger("warmpool.staging")

# (bytes done, bytes in total); done counts resumed bytes, and steps back when a file that
# failed verification is fetched again.
Progress = Callable[[int, int], None]


class LeaderGone(Exception):
    """The caller doing a shared staging was cancelled; a waiting caller takes over."""


@dataclass
class Flight:
    future: asyncio.Future[StagedModel]
    listeners: list[Progress] = field(default_factory=list)
    total: int = 0
    done: int = 0

    def report(self, delta: int) -> None:
        self.done += delta
        for listener in list(self.listeners):
            try:
                listener(self.done, self.total)
            except Exception:
                # A caller's broken progress bar must not fail a download others wait for.
                log.exception("progress callback failed; it gets no more updates")
                self.listeners.remove(listener)
