"""Liveness of backends, probed in the background so /readyz answers without waiting."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio

from backends.errors import BackendError
from backends.http import HttpUpstream

_log = logging.getLogger("gateway.health")


class BackendHealth:
    def __init__(self, upstreams: Mapping[str, HttpUpstream], paths: Mapping[str, str]) -> None:
        self._upstreams = upstreams
        self._paths = paths
        self.reachable: dict[str, bool] = dict.fromkeys(upstreams, False)

    async def probe_all(self) -> None:
        async with anyio.create_task_group() as group:
            for name in self._upstreams:
                group.start_soon(self._probe, name)

    async def run(self, interval_s: float = 2.0) -> None:
        while True:
            await self.probe_all()
            await anyio.sleep(interval_s)

    async def _probe(self, name: str) -> None:
        try:
            # Any HTTP answer (even 401 or 404) means the server is up and reachable.
            await self._upstreams[name].get(self._paths[name], timeout_s=1.0)
            up = True
        except (BackendError, TimeoutError):
            up = False
        if up != self.reachable[name]:
            _log.info(
                '{"event": "backend_reachable", "backend": "%s", "up": %s}', name, str(up).lower()
            )
        self.reachable[name] = up
