"""A backend's weights on local disk, as its starts need them (`warmpool.staging` stages them).

A start stages the weights first when they are not staged (`ensure`); while the backend
has work the manager `touch`es them, so they are the last in line for eviction. With
`staged: always` they are pinned (never evicted) and staged when the manager starts
(`prestage`), so the first start does not wait for them. A backend without a weights URI,
or without a stager, has nothing to stage: every call returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal, Protocol

log = logging.getLogger(__name__)

StagingEvent = Literal["staging_begun", "staging_done"]


class Stager(Protocol):
    """What the manager needs of `warmpool.staging.WeightStager`."""

    async def open(self) -> None: ...

    def is_staged(self, model: str) -> bool: ...

    def touch(self, model: str) -> None: ...

    def pin(self, model: str) -> None: ...

    async def stage(self, model: str, uri: str) -> object: ...


class BackendWeights:
    def __init__(
        self,
        backend: str,
        stager: Stager | None,
        uri: str | None,
        model: str,  # the stager's name for the weights
        pin: bool = False,
    ) -> None:
        self.model = model
        self._backend = backend
        self._stager = stager if uri is not None else None
        self._uri = uri or ""
        self._pin = pin

    @property
    def pinned(self) -> bool:
        """Staged at start and never evicted (`staged: always`)."""
        return self._pin and self._stager is not None

    async def open(self) -> None:
        if self._stager is not None:
            await self._stager.open()
            if self._pin:
                self._stager.pin(self.model)

    def touch(self) -> None:
        if self._stager is not None:
            self._stager.touch(self.model)

    async def ensure(self, mark: Callable[[StagingEvent], None]) -> None:
        """Stages the weights unless they are; `mark` hears when staging begins and ends."""
        if self._stager is None:
            return
        if self._stager.is_staged(self.model):
            self._stager.touch(self.model)
            return
        mark("staging_begun")
        await self._stager.stage(self.model, self._uri)
        mark("staging_done")

    async def prestage(self) -> None:
        try:
            await self.ensure(lambda _: None)
        except Exception as exc:  # the first request tries again, and reports it
            log.warning("%s: staging pinned weights at start failed: %s", self._backend, exc)
