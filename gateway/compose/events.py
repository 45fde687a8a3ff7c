"""The report events' log (requests, scale decisions): for `gateway.compose.build` and the
pools' scale recorder."""

from __future__ import annotations

import contextlib

from anyio.abc import TaskGroup

from common.redis_client import RedisFactory
from gateway.events import EventLog, open_sink
from gateway.metrics import Metrics
from gateway.settings import Settings


def open_event_log(
    settings: Settings,
    clients: RedisFactory,
    kind: str,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> EventLog:
    sink = open_sink(settings, clients, kind)
    events = EventLog(sink, kind=kind, on_drop=metrics.events_dropped)
    stack.push_async_callback(events.close)
    tasks.start_soon(events.run)
    return events
