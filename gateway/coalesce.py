"""One upstream call for identical concurrent requests, as nginx's `proxy_cache_lock`.

A cacheable request that misses the cache leads a *flight*, keyed by its exact cache key
(the key holds the cache scope, the model, the endpoint, every field that changes the
answer, and the prompt: two requests share a flight exactly when they could share a cache
entry, never across scopes). An identical request that comes while the flight is up
*follows* it instead of going upstream, and is answered as a cache hit would be
(`x-cache: coalesced`, usage zero with `saved_tokens`), whatever either asked of streaming:

    leader whole,  follower whole    the leader's answer, once complete
    leader whole,  follower stream   that answer replayed as SSE (cache/sse.py `replay`)
    leader stream, follower whole    the stream recorded into the whole answer
    leader stream, follower stream   the leader's events as they arrive, without its usage
                                     and `[DONE]`: the follower's own come last

A streamed flight keeps every piece once, in one list (the recorder keeps as much anyway);
each follower reads it at its own pace from its own index, so a slow follower slows no one
and needs no buffer of its own: one far behind goes on from what was recorded. From the
first follower on, the upstream is read by a pump task of the flight instead of the
leader's request, and the leader reads the record like the followers: its client leaving
no longer cancels the upstream call while anyone still reads. Once no one reads, the pump
stops and the upstream call is cancelled, as for any client that leaves.

A flight that fails (an error status, an upstream error, the deadline, the leader's client
leaving before a pump took over) *releases* its followers that have received nothing yet:
each goes upstream on its own, within its own deadline, and is not coalesced again (a
failing model then answers each at once, not one after another). A follower already
receiving a stream gets the stream's error event, as the leader's client does. A follower
waits for the flight's first byte within its own deadline (504 past it), as its own
upstream call would; a flight a fallback model answered (gateway/fallback.py) is followed
only by tenants that may use that model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup
from starlette.responses import Response

from cache.in_flight import InFlight
from cache.sse import DONE, StreamRecorder, event_data, split_events
from gateway.cache_http import Probe, hit_usage, saved_split
from gateway.errors import DeadlineExceeded, UpstreamError
from gateway.relay import CLIENT_GONE, Ending, Finish, RelayedStream, error_event, until

_log = logging.getLogger("gateway.coalesce")
_HEAD_KEYS = ("id", "created", "model", "system_fingerprint")


@dataclass(frozen=True)
class Followed:
    """What a follower gets: the whole answer, or (`live`) the stream as it comes."""

    body: bytes | None = None
    live: bool = False


class Flights:
    """The flights up now, by exact cache key, in the registry the cache shares
    (cache/in_flight.py); `tasks` runs their pumps."""

    def __init__(self, tasks: TaskGroup, in_flight: InFlight[Any, Flight] | None = None) -> None:
        self.tasks = tasks
        self._in_flight: InFlight[Any, Flight] = in_flight or InFlight()

    def get(self, key: str) -> Flight | None:
        return self._in_flight.flight(key)

    def lead(self, key: str, kind: str, *, missed: bool = False) -> Flight:
        """A flight for `key`; `missed`: its leader's own lookup ran and missed (see
        `Flight.missed`)."""
        return self._in_flight.lead(key, Flight(key, kind, self, missed))

    def landed(self, flight: Flight) -> None:
        self._in_flight.land(flight.key, flight)


class Flight:
    """One leader's upstream call, and what it has answered so far."""

    def __init__(self, key: str, kind: str, flights: Flights, missed: bool) -> None:
        self.key = key
        self.kind = kind
        # The leader's lookup ran and missed: an identical request's would miss too, and it
        # follows without one. Not after a lookup that failed open (the embedder busy, the
        # budget spent) or explored, or none at all: the newcomer looks up first, and a hit
        # beats waiting on the model (bench/cache_latency.py at concurrency 64 and 200 ms
        # misses: most requests followed a leader refused for load, each waiting the model).
        self.missed = missed
        self.served: str | None = None  # the fallback model that answered, if one did
        self.over = False  # no more pieces will come
        self.body: bytes | None = None  # the whole answer, once the flight succeeded
        self._flights = flights
        self._pieces: list[bytes] = []  # the leader's stream, as relayed
        self._shared: list[bytes] = []  # the same for followers, made when first read
        self._readers = 0  # followers waiting or reading, and the leader once pumped
        self._changed: anyio.Event | None = None
        self._ended_itself = False  # the stream ended with [DONE] or its own error event
        self._pump: anyio.CancelScope | None = None
        self._pumped: anyio.Event | None = None

    # The leader's side.

    def leading(self, recorder: StreamRecorder) -> Leader:
        return Leader(self, recorder)

    async def lead(
        self, events: AsyncIterator[bytes], recorder: StreamRecorder
    ) -> AsyncIterator[bytes]:
        """The leader's stream: `events`, recorded; from the first follower on, read by
        the flight's pump and relayed from the record (see the module)."""
        while not self._readers:
            try:
                piece = await events.__anext__()
            except StopAsyncIteration:
                self._stream_over(recorder, ended_itself=True)
                return
            self._add(piece)
            yield piece
        self._start_pump(events, recorder)
        async for piece in self._read(len(self._pieces), shared=False):
            yield piece

    async def leader_done(self) -> None:
        """The leader's stream is over (relayed, or its client left): it stops reading,
        and waits for the pump, if there is one, to be over (only then may the upstream
        answer be closed and the leader's request ended)."""
        if self._pumped is None:
            return
        self._leave()
        await self._pumped.wait()

    def finish(self, ending: Ending) -> None:
        """The leader's request is over (gateway/lifecycle.py): the flight lands, with the
        answer when it was a complete one and nothing had ended the flight before."""
        self._flights.landed(self)
        if not self.over:
            self.body = ending.body if ending.status == 200 else None
            self._end()

    # The followers' side.

    async def follow(
        self, streamed: bool, answer_by: float, may_use: Callable[[str], bool]
    ) -> Followed | None:
        """Waits for the flight's answer; None: released (go upstream on your own)."""
        self._readers += 1
        live = False
        try:
            await self._first(answer_by)
            if self.served is not None and not may_use(self.served):
                return None
            live = streamed and not self.over
            if live:
                return Followed(live=True)
            while not self.over:  # the rest comes as it comes, as its own answer would
                await self._wait()
            return None if self.body is None else Followed(self.body)
        finally:
            if not live:
                self._leave()

    def stream(
        self, probe: Probe, request_id: str, end: Finish, cut_at: float | None = None
    ) -> Response:
        """A live follower's answer (after `follow` said `live`); ends its exchange.
        `cut_at`: its client's deadline for the whole answer (gateway/relay.py `until`)."""
        ended: list[Ending] = []

        async def close() -> None:
            self._leave()
            await end(ended[0] if ended else CLIENT_GONE)

        headers = {"x-request-id": request_id, "x-cache": "coalesced", "cache-control": "no-cache"}
        events = self._follower_events(probe, ended)
        if cut_at is not None:
            events = until(events, cut_at, ended)
        return RelayedStream(events, close, headers)

    async def _follower_events(self, probe: Probe, ended: list[Ending]) -> AsyncIterator[bytes]:
        async for piece in self._read(0, shared=True):
            yield piece
        if self.body is not None:
            answer = orjson.loads(self.body)
            probe.saved_prompt_tokens, probe.saved_completion_tokens = saved_split(answer)
            if probe.include_usage:
                yield self._usage_event(answer)
            yield DONE
            ended.append(Ending(200, None))
            return
        failure = UpstreamError("The answer this request shared broke off.")
        ended.append(Ending(failure.status, failure.code))
        if not self._ended_itself:  # else its own error event went out already
            yield error_event(failure)

    def _usage_event(self, answer: dict[str, Any]) -> bytes:
        head = {k: answer[k] for k in _HEAD_KEYS if k in answer}
        head["object"] = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        chunk = {**head, "choices": [], "usage": hit_usage(answer)}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    # Both.

    async def _first(self, answer_by: float) -> None:
        with anyio.move_on_after(max(0.0, answer_by - time.monotonic())):
            while not self._pieces and not self.over:
                await self._wait()
        if not self._pieces and not self.over:
            raise DeadlineExceeded(
                "The request's deadline passed before the identical request it waited on "
                "was answered."
            )

    async def _read(self, index: int, *, shared: bool) -> AsyncIterator[bytes]:
        """The recorded pieces from `index`, then each as it comes, until the flight ends."""
        while True:
            while index < len(self._pieces):
                piece = self._shared_piece(index) if shared else self._pieces[index]
                index += 1
                if piece:
                    yield piece
            if self.over:
                return
            await self._wait()

    def _shared_piece(self, index: int) -> bytes:
        while len(self._shared) <= index:
            self._shared.append(_for_followers(self._pieces[len(self._shared)]))
        return self._shared[index]

    def _add(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._wake()

    def _stream_over(self, recorder: StreamRecorder, ended_itself: bool) -> None:
        if not self.over:
            self._ended_itself = ended_itself
            self.body = recorder.result() if ended_itself else None
            self._end()

    def _end(self) -> None:
        self.over = True
        self._wake()

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _leave(self) -> None:
        self._readers -= 1
        if self._readers == 0 and self._pump is not None and not self.over:
            self._pump.cancel()  # no one reads: cancel the upstream call

    def _start_pump(self, events: AsyncIterator[bytes], recorder: StreamRecorder) -> None:
        self._readers += 1  # the leader, which reads the record from now on
        self._pump = anyio.CancelScope()
        self._pumped = anyio.Event()
        self._flights.tasks.start_soon(self._run_pump, events, recorder)

    async def _run_pump(self, events: AsyncIterator[bytes], recorder: StreamRecorder) -> None:
        assert self._pump is not None and self._pumped is not None
        ended_itself = False
        try:
            with self._pump:
                async for piece in events:
                    self._add(piece)
                ended_itself = True
        except Exception:  # the relay turns upstream failures into events: this is a bug
            _log.exception("the pump of a coalesced stream failed")
        finally:
            self._stream_over(recorder, ended_itself)
            self._pumped.set()


class Leader:
    """A flight's leader stream, as the relay takes it (gateway/relay.py `Shared`)."""

    def __init__(self, flight: Flight, recorder: StreamRecorder) -> None:
        self._flight = flight
        self._recorder = recorder

    def relay(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return self._flight.lead(events, self._recorder)

    async def done(self) -> None:
        await self._flight.leader_done()


def _for_followers(piece: bytes) -> bytes:
    """A piece of the leader's stream as followers get it: without its usage (theirs is
    zero, and comes last) and without `[DONE]` (which comes after it)."""
    if b'"usage"' not in piece and b"[DONE]" not in piece:
        return piece
    kept = []
    for event in split_events(piece)[0]:
        data = event_data(event)
        if data is not None and data.strip() == b"[DONE]":
            continue
        if data is not None and b'"usage"' in data:
            event = _without_usage(event, data)
        if event:
            kept.append(event + b"\n\n")
    return b"".join(kept)


def _without_usage(event: bytes, data: bytes) -> bytes:
    """The event without its usage; empty when usage was all it carried."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return event
    if not isinstance(chunk, dict) or chunk.get("usage") is None:
        return event
    if not chunk.get("choices"):
        return b""
    del chunk["usage"]
    return b"data: " + orjson.dumps(chunk)
