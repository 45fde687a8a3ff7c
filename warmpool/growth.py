"""Growth: more replicas for one backend, one growth at a time, run as a task.

A growth stages the weights first if they are not (`warmpool.weights`), then asks the
provider for `target` replicas. It never asks for fewer than the provider has, ready or
starting: `ensure` with a lower count would stop replicas still loading (the manager
scales down only by stopping a replica it chose).

A failed growth is remembered for the retry delay (`ColdStarts.failed`), and it fails the
cold start it was for, or the one held when no other start is under way that could still
end it; `on_failed` listeners then hear of it (the gateway fails the requests it holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from anyio.abc import TaskGroup

from backends.providers.replicas import ReplicaProvider
from warmpool.cold_start import ColdStartFailed, ColdStarts, Episode
from warmpool.listeners import notify
from warmpool.weights import BackendWeights

log = logging.getLogger(__name__)


class Growth:
    def __init__(
        self,
        backend: str,
        provider: ReplicaProvider,
        weights: BackendWeights,
        starts: ColdStarts,
    ) -> None:
        self.running = False
        self.on_failed: list[Callable[[ColdStartFailed], None]] = []
        self._backend = backend
        self._provider = provider
        self._weights = weights
        self._starts = starts

    def begin(self, tasks: TaskGroup, target: int, episode: Episode | None) -> None:
        """Grows to `target` in a task; `episode` is the cold start it serves, if any."""
        self.running = True
        tasks.start_soon(self._grow_to, target, episode)

    async def _grow_to(self, target: int, episode: Episode | None) -> None:
        try:
            await self._weights.ensure(partial(self._starts.mark, episode))
            live = len(self._provider.ready()) + self._provider.starting()
            if target > live:  # never lower: ensure() would stop replicas still loading
                await self._provider.ensure(target)
        except Exception as exc:
            self._failed(exc, episode)
        else:
            self._starts.succeeded()
        finally:
            self.running = False

    def _failed(self, exc: Exception, episode: Episode | None) -> None:
        self._starts.failed(exc)
        log.warning("%s: start failed: %s: %s", self._backend, type(exc).__name__, exc)
        held = self._starts.current
        if held is not None and (held is episode or not self._provider.starting()):
            failure = self._starts.settle_failed(held, exc, "failed")
            notify(self.on_failed, failure)
