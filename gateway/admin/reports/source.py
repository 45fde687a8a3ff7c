"""Reads events back from where the gateway writes them (see `gateway.events`): JSON lines
next to the state file, or the capped Redis streams, a time range at a time.

A Redis stream id starts with the time the entry was added (in ms), a little after the
event itself (events are written in batches; a cold start is written when it ends), so a
range is read by id with a margin and then filtered on the event's own time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson
import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.events import jsonl_path, stream_key
from gateway.settings import Settings

Record = dict[str, Any]
TimeOf = Callable[[Record], float | None]
PAGE = 10_000


class ReportUnavailable(Exception):
    """The state store could not be read; the message says why."""


async def read_events(
    settings: Settings,
    kind: str,
    time_of: TimeOf,
    since: float | None,
    until: float,
    margin_s: float = 60.0,
) -> list[Record]:
    """Records of `kind` whose time is in [since, until) (since None: from the start)."""
    low = None if since is None else since - margin_s
    if settings.state.url == "memory":
        records = await anyio.to_thread.run_sync(_read_file, jsonl_path(settings, kind))
    else:
        key = stream_key(settings.state.prefix, kind)
        records = await _read_stream(settings.state.url, key, low, until + margin_s)
    return sorted(
        (r for r in records if _within(time_of(r), since, until)),
        key=lambda r: time_of(r) or 0.0,
    )


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


async def _read_stream(url: str, key: str, low: float | None, high: float) -> list[Record]:
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    start = "-" if low is None else f"{max(0, int(low * 1000))}-0"
    end = f"{int(high * 1000)}"
    records: list[Record] = []
    try:
        while True:
            found: Any = await client.xrange(key, min=start, max=end, count=PAGE)
            page: list[tuple[Any, dict[Any, Any]]] = found or []
            records.extend(_decoded(fields) for _, fields in page)
            if len(page) < PAGE:
                return [r for r in records if r]
            last = page[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    except (RedisError, OSError) as exc:
        raise ReportUnavailable(f"cannot read {key}: {type(exc).__name__}: {exc}") from exc
    finally:
        await client.aclose()


def _decoded(fields: dict[Any, Any]) -> Record:
    """The entry's one field (`e` for gateway events, `record` for cold starts)."""
    for value in fields.values():
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(value)
            if isinstance(record, dict):
                return record
    return {}
