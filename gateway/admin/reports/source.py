"""Reads events back from where the gateway writes them (see `gateway.events`): JSON lines
next to the state file, or the capped Redis streams, a time range at a time.

A Redis stream id starts with the time the entry was added (in ms), a little after the
event itself (events are written in batches; a cold start is written when it ends), so a
range is read by id with a margin and then filtered on the event's own time.

A range may hold a million events, and reading, decoding, filtering, sorting (and even
freeing) that many takes seconds: `EventRange.records` does it all in a worker thread
(with redis-py's blocking client: its parser is Python, a page of ten thousand entries
would hold the loop for a quarter of a second), where the report is built too
(gateway/admin/reports/__init__.py). The worker holds the GIL, and so the loop, for as
long as one call into C lasts: freeing a list of a million records is one such call (a
quarter of a second), so `release` frees them a slice at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson
from redis.exceptions import RedisError

from common.redis_client import RedisFactory
from gateway.events import jsonl_path, stream_key
from gateway.settings import Settings

Record = dict[str, Any]
TimeOf = Callable[[Record], float | None]
PAGE = 10_000
RELEASED_AT_ONCE = 1_000  # records freed in one go: about half a millisecond


class ReportUnavailable(Exception):
    """The state store could not be read; the message says why."""


@dataclass(frozen=True)
class StreamRange:
    clients: RedisFactory
    key: str
    low: float | None  # unix times, bounds of the entries' ids
    high: float


@dataclass(frozen=True)
class EventRange:
    """Events of one kind whose time is in [since, until) (since None: from the start), and
    where they are: a JSON lines file or a stream. `records` blocks: a worker's call."""

    time_of: TimeOf
    since: float | None
    until: float
    path: Path | None = None
    stream: StreamRange | None = None

    def records(self) -> list[Record]:
        """Those in the range, by time; raises ReportUnavailable."""
        if self.stream is not None:
            found = _read_stream(self.stream)
        else:
            found = _read_file(self.path) if self.path is not None else []
        try:
            return sorted(
                (r for r in found if _within(self.time_of(r), self.since, self.until)),
                key=lambda r: self.time_of(r) or 0.0,
            )
        finally:
            release(found)  # those out of range are freed here


def event_range(
    settings: Settings,
    clients: RedisFactory,
    kind: str,
    time_of: TimeOf,
    since: float | None,
    until: float,
    margin_s: float = 60.0,
) -> EventRange:
    if settings.state.url == "memory":
        return EventRange(time_of, since, until, path=jsonl_path(settings, kind))
    key = stream_key(settings.state.prefix, kind)
    low = None if since is None else since - margin_s
    stream = StreamRange(clients, key, low, until + margin_s)
    return EventRange(time_of, since, until, stream=stream)


async def read_events(
    settings: Settings,
    clients: RedisFactory,
    kind: str,
    time_of: TimeOf,
    since: float | None,
    until: float,
    margin_s: float = 60.0,
) -> list[Record]:
    """Records of `kind` whose time is in [since, until) (since None: from the start)."""
    wanted = event_range(settings, clients, kind, time_of, since, until, margin_s)
    return await anyio.to_thread.run_sync(wanted.records)


def release(items: list[Any], at_once: int = RELEASED_AT_ONCE) -> None:
    """Empties `items` a slice at a time: between slices, the event loop's thread can take
    the GIL (its last reference gone, a record is freed where its list is emptied)."""
    while items:
        del items[-at_once:]


def _within(at: float | None, since: float | None, until: float) -> bool:
    return at is not None and (since is None or at >= since) and at < until


def _read_file(path: Path) -> list[Record]:
    if not path.exists():
        return []
    records: list[Record] = []
    with path.open("rb") as lines:
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError):  # a line cut by a crash
                record = orjson.loads(line)
                if isinstance(record, dict):
                    records.append(record)
    return records


def _read_stream(stream: StreamRange) -> list[Record]:
    client = stream.clients.blocking_client("reports", 10.0)
    start = "-" if stream.low is None else f"{max(0, int(stream.low * 1000))}-0"
    end = f"{int(stream.high * 1000)}"
    records: list[Record] = []
    try:
        while True:
            found: Any = client.xrange(stream.key, min=start, max=end, count=PAGE)
            page: list[tuple[Any, dict[Any, Any]]] = found or []
            records.extend(r for _, fields in page if (r := _decoded(fields)))
            if len(page) < PAGE:
                return records
            last = page[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    except (RedisError, OSError) as exc:
        raise ReportUnavailable(f"cannot read {stream.key}: {type(exc).__name__}: {exc}") from exc
    finally:
        client.close()


def _decoded(fields: dict[Any, Any]) -> Record:
    """The entry's one field (`e` for gateway events, `record` for cold starts)."""
    for value in fields.values():
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(value)
            if isinstance(record, dict):
                return record
    return {}
