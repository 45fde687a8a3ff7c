"""Request and scale events for the operator reports (`gateway report`, `/admin/reports`).

    pipeline ─ record() ─► buffer ─(every `flush_s`, or `max_batch` events)─► sink
                                      JSON lines next to the state file  (`state.url: memory`)
                                      a capped Redis stream per kind     (a `redis://` state)

`record` only appends to a list: the request path never waits on the sink. The writer
task serializes a whole batch and hands it to the sink at once (one file append in a
thread, or one pipelined round trip of XADDs). A failing sink loses report lines, never
requests: the batch is dropped and the next one is tried afresh. Lines lost (these, a
full buffer's, cold-start records the store refused) are counted by kind and reason,
`gateway_events_dropped_total`, and logged once per kind of error until writes succeed
again: a store down for an hour writes a few log lines, not one per batch.

What is recorded never includes prompt text or keys: the cache namespace is already an
opaque hash, tenants and models are names from the operator's config.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread
import orjson
from anyio.abc import TaskGroup
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.redis_client import RedisFactory
from gateway.errors import GatewayError
from gateway.private_files import owner_only, private_dir
from gateway.settings import Settings
from warmpool.timeline import ColdStartRecord

_log = logging.getLogger("gateway.events")

REQUESTS = "requests"  # one RequestEvent per finished request on the OpenAI routes
SCALE = "scale"  # one ScaleEvent when a scale-to-zero backend goes warm, asleep or to zero
COLD_STARTS = "cold_starts"  # one ColdStartRecord per finished start (RedisTimelineSink)
FIELD = "e"  # the stream entry's one field: the event as JSON
STREAM_MAXLEN = {REQUESTS: 1_000_000, SCALE: 100_000}


@dataclass(slots=True, kw_only=True)
class RequestEvent:
    """One finished request. `cache` is the hit tier (`exact`, `normalized`, `semantic`),
    `miss`, `bypass` (the client said no-store or no-cache), `coalesced` (answered by an
    identical request's upstream call), or `none` (not cacheable)."""

    ts: float  # wall clock, when the answer was done
    request_id: str
    tenant: str | None
    model: str | None
    backend: str | None
    status: int
    latency_ms: float
    cache: str
    namespace: str | None = None
    similarity: float | None = None  # of the hit, or the best near miss (semantic tier)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    saved_tokens: int = 0
    saved_prompt_tokens: int = 0
    saved_completion_tokens: int = 0
    cold_wait_ms: float | None = None  # waited for a cold start this long before dispatch
    refused: str | None = None  # why it was shed or refused (quota, overload, cold start)
    at_zero: bool = False  # its backend had no ready replica when it arrived
    # why a cache lookup missed: "budget", "store", "error" (failed open), "no_entry",
    # "no_candidate", "refused:<rule>", "explore" (error-bounded mode)
    miss_reason: str | None = None


@dataclass(slots=True)
class ScaleEvent:
    """A scale-to-zero backend went warm (replicas ready), asleep (none ready, some in the
    sleep tier) or to zero (none at all)."""

    ts: float
    backend: str
    models: list[str]
    ready: int
    asleep: int = 0


# The store is out of reach (stopped, network, disk): expected, and nothing to fix here.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
DropHook = Callable[[str, str, int], None]  # (kind, reason, lines lost): a metric


class Drops:
    """Report lines lost, of one kind: counted by reason (`buffer_full`, `store_unavailable`,
    `store_error`, `error`), and logged once per kind of error until a write succeeds."""

    def __init__(self, kind: str, on_drop: DropHook | None = None) -> None:
        self.kind = kind
        self.total = 0
        self._on_drop = on_drop
        self._logged: set[tuple[str, str]] = set()

    def add(self, lines: int, reason: str, exc: BaseException | None = None) -> None:
        self.total += lines
        if self._on_drop is not None:
            self._on_drop(self.kind, reason, lines)
        key = (reason, type(exc).__name__ if exc is not None else "")
        if key in self._logged:
            return
        self._logged.add(key)
        # The error's own words (redis-py names host and port, never the URL's password).
        why = f"{type(exc).__name__}: {str(exc)[:200]}" if exc is not None else reason
        _log.warning(
            "%s events lost (%s); more lost for this reason are counted in "
            "gateway_events_dropped_total, not logged, until a write succeeds",
            self.kind,
            why,
            exc_info=exc if reason == "error" else None,  # a bug: its traceback
        )

    def written(self) -> None:
        if self._logged:
            _log.info("%s events written again", self.kind)
            self._logged.clear()


def failure_reason(exc: Exception) -> str:
    if isinstance(exc, UNREACHABLE):
        return "store_unavailable"
    return "store_error" if isinstance(exc, RedisError) else "error"


def refusal_reason(exc: GatewayError) -> str | None:
    """Why a request was shed or refused (429/503): the scheduler's reason when it shed
    it (`queue_full`, `deadline`, ...), else the error's code (quota, cold start failed)."""
    if exc.status not in (429, 503):
        return None
    reason = getattr(exc.__cause__, "reason", None)
    return reason if isinstance(reason, str) else exc.code or exc.type


class EventSink(Protocol):
    async def append(self, lines: Sequence[bytes]) -> None:
        """Keeps a batch of JSON-encoded events; raises on failure."""
        ...

    async def close(self) -> None: ...


class JsonLinesEvents:
    """One JSON line per event, appended by a worker thread (file I/O off the loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def append(self, lines: Sequence[bytes]) -> None:
        await anyio.to_thread.run_sync(self._write, b"".join(line + b"\n" for line in lines))

    def _write(self, data: bytes) -> None:
        private_dir(self.path.parent)
        with open(self.path, "ab", opener=owner_only) as out:
            out.write(data)

    async def close(self) -> None:
        return None


class RedisStreamEvents:
    """A capped Redis stream; stream ids carry the time, so reports read a range by id."""

    def __init__(self, clients: RedisFactory, key: str, maxlen: int) -> None:
        self._redis = clients.client("events", 2.0)
        self.key = key
        self._maxlen = maxlen

    async def append(self, lines: Sequence[bytes]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for line in lines:
                pipe.xadd(self.key, {FIELD: line}, maxlen=self._maxlen, approximate=True)
            await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()


def stream_key(prefix: str, kind: str) -> str:
    return f"{{{prefix}}}:{kind}"


def jsonl_path(settings: Settings, kind: str) -> Path:
    return Path(settings.state.path).parent / f"{kind}.jsonl"


def open_sink(settings: Settings, clients: RedisFactory, kind: str) -> EventSink:
    if settings.state.url == "memory":
        return JsonLinesEvents(jsonl_path(settings, kind))
    key = stream_key(settings.state.prefix, kind)
    return RedisStreamEvents(clients, key, STREAM_MAXLEN.get(kind, 100_000))


class EventLog:
    """Buffers events and writes them in batches from a task of the lifespan."""

    def __init__(
        self,
        sink: EventSink,
        *,
        kind: str = "events",
        on_drop: DropHook | None = None,
        flush_s: float = 0.5,
        max_batch: int = 512,
        max_buffer: int = 100_000,
    ) -> None:
        self._sink = sink
        self._drops = Drops(kind, on_drop)
        self._flush_s = flush_s
        self._max_batch = max_batch
        self._max_buffer = max_buffer
        self._buffer: list[object] = []
        self._wake = anyio.Event()
        self.written = 0

    @property
    def dropped(self) -> int:
        return self._drops.total

    def record(self, event: object) -> None:
        """Cheap and synchronous: the request path calls it as the answer is done."""
        if len(self._buffer) >= self._max_buffer:
            self._drops.add(1, "buffer_full")  # the sink is stuck: shed lines, not memory
            return
        self._buffer.append(event)
        if len(self._buffer) >= self._max_batch:
            self._wake.set()

    async def run(self) -> None:
        while True:
            with anyio.move_on_after(self._flush_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            # A batch taken from the buffer is written even if shutdown cancels us meanwhile.
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self.flush()

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        try:
            await self._sink.append([orjson.dumps(event) for event in batch])
        except Exception as exc:  # whatever it is, the writer task must live on
            self._drops.add(len(batch), failure_reason(exc), exc)
        else:
            self.written += len(batch)
            self._drops.written()

    async def close(self) -> None:
        """Writes what is left (the lifespan's task group is gone by now), then closes; a
        store already gone is no error, anything else is."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(5):
                await self.flush()
            with contextlib.suppress(*UNREACHABLE):
                await self._sink.close()


class ScaleRecorder:
    """Records when a backend goes warm, asleep or to zero, for the cold-start report's time
    in each; it starts at zero (nothing is ready when the gateway starts). The manager
    reports the sleep tier before a replica leaves the ready set for it, and after it is
    back, so a sleep or a wake never shows as a moment at zero."""

    def __init__(self, backend: str, models: list[str], events: EventLog | None) -> None:
        self._backend = backend
        self._models = models
        self._events = events
        self._ready = self._asleep = 0
        self._state = "zero"
        self._record()

    def ready(self, replicas: Sized) -> None:
        self._ready = len(replicas)
        self._update()

    def asleep(self, count: int) -> None:
        self._asleep = count
        self._update()

    def _update(self) -> None:
        state = "warm" if self._ready else "asleep" if self._asleep else "zero"
        if state != self._state:
            self._state = state
            self._record()

    def _record(self) -> None:
        if self._events is not None:
            event = ScaleEvent(time.time(), self._backend, self._models, self._ready, self._asleep)
            self._events.record(event)


class RedisTimelineSink:
    """Cold-start records on a capped Redis Stream, `{prefix}:cold_starts`, for reports."""

    def __init__(
        self,
        clients: RedisFactory,
        prefix: str,
        tasks: TaskGroup,
        on_drop: DropHook | None = None,
    ) -> None:
        self._redis = clients.client("cold-starts", 1.0)
        self._key = stream_key(prefix, COLD_STARTS)
        self._tasks = tasks
        self._drops = Drops(COLD_STARTS, on_drop)

    def write(self, record: ColdStartRecord) -> None:
        self._tasks.start_soon(self._append, orjson.dumps(record.to_json()))

    async def _append(self, data: bytes) -> None:
        try:
            await self._redis.xadd(self._key, {"record": data}, maxlen=10_000, approximate=True)
        except (RedisError, OSError) as exc:  # reports lose a line, requests nothing
            self._drops.add(1, failure_reason(exc), exc)
        else:
            self._drops.written()

    async def close(self) -> None:
        await self._redis.aclose()
