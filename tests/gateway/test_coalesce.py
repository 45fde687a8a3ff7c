"""A flight (gateway/coalesce.py) with a fake upstream stream at its seam: followers read at
their own pace, the pump outlives the leader's client and stops when no one reads."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson

from cache.policy import CacheInputs, Mode, cache_key
from cache.semantic import Lookup
from cache.sse import DONE, StreamRecorder, event_data, split_events
from gateway.cache_http import HttpCache, Probe
from gateway.coalesce import Flight, Flights, _for_followers
from gateway.relay import Ending

WORDS = [f"w{i} " for i in range(20)]
WHOLE = "".join(WORDS)
FAR = 1e12  # a deadline that never comes


def chunk(text: str, finish: str | None = None, **extra: Any) -> bytes:
    delta = {"content": text} if text else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return b"data: " + orjson.dumps({**body, "choices": [choice], **extra}) + b"\n\n"


async def upstream(
    gap_s: float, closed: anyio.Event, words: int | None = None
) -> AsyncIterator[bytes]:
    """`words` of WORDS (cycling through them; forever with None), then the end."""
    try:
        index = 0
        while words is None or index < words:
            await anyio.sleep(gap_s)
            yield chunk(WORDS[index % len(WORDS)])
            index += 1
        yield chunk("", "stop")
        yield DONE
    finally:
        closed.set()


def probe() -> Probe:
    body = {"messages": [{"role": "user", "content": "q"}], "temperature": 0}
    key = cache_key("tenant:a", "m", CacheInputs.of("chat", body))
    assert key is not None
    return Probe(Mode.FULL, key, "a", "m", "chat", include_usage=True)


def text_of(pieces: list[bytes]) -> str:
    text = ""
    for event in split_events(b"".join(pieces))[0]:
        data = event_data(event)
        if data is None or data == b"[DONE]":
            continue
        for choice in orjson.loads(data)["choices"]:
            text += choice["delta"].get("content", "")
    return text


async def follower(
    flight: Flight, per_piece_s: float = 0.0, leave_after: int | None = None
) -> tuple[list[bytes], list[Ending]]:
    """A streamed follower served over ASGI: reads each piece `per_piece_s` late, and
    disconnects after `leave_after` pieces."""
    followed = await flight.follow(True, FAR, lambda model: True)
    assert followed is not None and followed.live
    ended: list[Ending] = []

    async def end(ending: Ending) -> None:
        ended.append(ending)

    response = flight.stream(probe(), "req_1", end)
    pieces: list[bytes] = []
    gone = anyio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            pieces.append(message["body"])
            if leave_after is not None and len(pieces) >= leave_after:
                gone.set()
            await anyio.sleep(per_piece_s)

    await response({"type": "http"}, receive, send)
    return pieces, ended


async def test_followers_read_at_their_own_pace() -> None:
    """A slow follower holds back neither the leader nor a fast follower; both followers
    get the whole answer, then their own usage (zero) and [DONE]."""
    done_at: dict[str, float] = {}
    read: dict[str, tuple[list[bytes], list[Ending]]] = {}
    async with anyio.create_task_group() as tasks:
        flight = Flights(tasks).lead("k", "chat")

        async def run(name: str, per_piece_s: float) -> None:
            read[name] = await follower(flight, per_piece_s)
            done_at[name] = time.monotonic()

        tasks.start_soon(run, "slow", 0.05)
        tasks.start_soon(run, "fast", 0.0)
        await anyio.sleep(0.05)  # both follow before the first byte
        recorder = StreamRecorder("chat")
        events = upstream(0.005, anyio.Event(), words=len(WORDS))
        led = [piece async for piece in flight.lead(_fed(events, recorder), recorder)]
        done_at["leader"] = time.monotonic()
        await flight.leader_done()
        flight.finish(Ending(200, None, recorder.result()))
    assert text_of(led) == text_of(read["fast"][0]) == text_of(read["slow"][0]) == WHOLE
    assert done_at["fast"] - done_at["leader"] < 0.3
    assert done_at["slow"] - done_at["leader"] > 0.5  # 23 pieces, 50 ms each
    for pieces, ended in read.values():
        assert ended == [Ending(200, None)]
        usage = orjson.loads(event_data(pieces[-2].strip()) or b"")["usage"]
        assert usage["total_tokens"] == 0
        assert pieces[-1] == DONE


async def test_the_pump_outlives_the_leader_and_stops_when_no_one_reads() -> None:
    closed = anyio.Event()
    async with anyio.create_task_group() as tasks:
        flight = Flights(tasks).lead("k", "chat")
        read: list[tuple[list[bytes], list[Ending]]] = []

        async def run() -> None:
            read.append(await follower(flight, leave_after=6))

        tasks.start_soon(run)
        await anyio.sleep(0.05)
        recorder = StreamRecorder("chat")
        leading = flight.lead(_fed(upstream(0.01, closed), recorder), recorder)
        for _ in range(2):
            await leading.__anext__()
        with anyio.fail_after(5):
            await flight.leader_done()  # the leader left: the follower still reads
        await leading.aclose()
    assert closed.is_set() and flight.over and flight.body is None
    pieces, ended = read[0]
    assert len(pieces) >= 6
    assert ended == [Ending(499, "client_disconnected")]


async def test_a_whole_follower_gets_the_stream_recorded() -> None:
    async with anyio.create_task_group() as tasks:
        flight = Flights(tasks).lead("k", "chat")
        got: list[bytes | None] = []

        async def run() -> None:
            followed = await flight.follow(False, FAR, lambda model: True)
            got.append(followed.body if followed is not None else None)

        tasks.start_soon(run)
        await anyio.sleep(0.05)
        recorder = StreamRecorder("chat")
        events = upstream(0.001, anyio.Event(), words=len(WORDS))
        async for _ in flight.lead(_fed(events, recorder), recorder):
            pass
        await flight.leader_done()
    assert got[0] is not None
    assert orjson.loads(got[0])["choices"][0]["message"]["content"] == WHOLE


def test_a_follower_says_why_its_own_lookup_missed_if_it_looked_up() -> None:
    answer = {"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}
    body = orjson.dumps(answer)
    followed_at_once = HttpCache.coalesced(probe(), body, False, "req-1")
    looked_up = probe()
    looked_up.lookup = Lookup(failed="embedder_busy")
    after_a_failed_lookup = HttpCache.coalesced(looked_up, body, False, "req-2")
    assert followed_at_once is not None and after_a_failed_lookup is not None
    assert followed_at_once.headers["x-cache"] == "coalesced"
    assert "x-cache-miss-reason" not in followed_at_once.headers
    assert after_a_failed_lookup.headers["x-cache-miss-reason"] == "embedder_busy"


def test_followers_get_the_stream_without_its_usage_and_done() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    plain = chunk("hi")
    assert _for_followers(plain) is plain
    with_null = chunk("hi", usage=None)
    assert _for_followers(with_null) == with_null
    last = chunk("!", "stop", usage=usage)
    only_usage = b"data: " + orjson.dumps({"id": "c1", "choices": [], "usage": usage}) + b"\n\n"
    shared = _for_followers(last + only_usage + DONE)
    [event] = split_events(shared)[0]
    expected = orjson.loads(event_data(last.strip()) or b"")
    del expected["usage"]
    assert orjson.loads(event_data(event) or b"") == expected


async def _fed(events: AsyncIterator[bytes], recorder: StreamRecorder) -> AsyncIterator[bytes]:
    """As the relay taps a stream: the recorder sees each piece before it is relayed."""
    async for piece in events:
        recorder.feed(piece)
        yield piece
