"""Each backend's recent start times, read back from the cold-start timelines the gateway
stored (`cold_starts.jsonl`, or the Redis stream): a restarted gateway knows how long its
backends take to start (warmpool.start_estimate) before it has started one itself.

Read once, at start-up. A store that cannot be read in time costs the estimates, never
the start: the backends then learn from their next starts.
"""

from __future__ import annotations

import logging
import time

import anyio

from common.redis_client import RedisFactory
from gateway.admin.reports.cold_start_report import start_time
from gateway.admin.reports.source import ReportUnavailable, read_events
from gateway.events import COLD_STARTS
from gateway.settings import Settings
from warmpool.start_estimate import start_history

log = logging.getLogger(__name__)
WINDOW_S = 30 * 86400.0  # starts older than this say little about the backend as it is
READ_TIMEOUT_S = 2.0


async def past_start_times(settings: Settings, clients: RedisFactory) -> dict[str, list[float]]:
    """Per backend, its last starts' seconds to ready, oldest first (empty when unknown)."""
    now = time.time()
    with anyio.move_on_after(READ_TIMEOUT_S):
        try:
            window = now - WINDOW_S, now
            records = await read_events(settings, clients, COLD_STARTS, start_time, *window)
        except ReportUnavailable as exc:
            log.warning("past cold starts unreadable, start estimates begin empty: %s", exc)
            return {}
        return start_history(records)
    log.warning(
        "past cold starts not read within %g s; start estimates begin empty", READ_TIMEOUT_S
    )
    return {}
