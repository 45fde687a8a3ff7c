"""bench/loadgen.py, its child process driven against the fake upstream: closed rounds
(whole answers, SSE streams, tier counting) and an open phase."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from bench.loadgen import LoadGenerator, PhaseSpec, Record, RoundSpec, StreamSpec
from bench.loadgen_open import _last_event_code, _plan

HEADERS = {"Content-Type": "application/json"}


def chat(content: str, stream: bool, model: str = "echo") -> str:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(body).decode()


@pytest.fixture(scope="module")
def loadgen() -> Iterator[LoadGenerator]:
    with LoadGenerator() as generator:
        yield generator


def test_a_closed_round_counts_the_streams_that_end_with_done(
    loadgen: LoadGenerator, fake_upstream: str
) -> None:
    bodies = [chat("one two three", True), chat("four five", True)]
    spec = RoundSpec(fake_upstream + "/chat/completions", HEADERS, bodies, 2, 0.5, stream=True)
    result = loadgen.closed(spec)
    assert (result.errors, result.first_error) == (0, None)
    assert result.completed > 0 and result.rps > 0
    assert len(result.latencies_ms) == len(result.first_byte_ms) >= result.completed
    pairs = zip(result.first_byte_ms, result.latencies_ms, strict=True)
    assert all(0 < first <= whole for first, whole in pairs)
    assert result.other == {} and result.cache_waits_ms == []


def test_a_closed_round_with_a_tier_counts_only_that_tier(
    loadgen: LoadGenerator, fake_upstream: str
) -> None:
    url = fake_upstream + "/chat/completions"
    spec = RoundSpec(url, HEADERS, [chat("hi", False)], 1, 0.3, expect_tier="exact")
    result = loadgen.closed(spec)
    # The fake upstream has no cache: every answer is another "tier", none an error.
    assert (result.completed, result.errors, result.latencies_ms) == (0, 0, [])
    assert list(result.other) == ["-:-"] and result.other["-:-"] > 0


def test_an_open_phase_records_every_arrival_by_name(
    loadgen: LoadGenerator, fake_upstream: str
) -> None:
    streams = [
        StreamSpec("whole", None, 20.0, chat("a b c", False), False, 5.0, 5.0),
        StreamSpec("streamed", None, 20.0, chat("a b c", True), True, None, 5.0),
        StreamSpec("no-done", None, 10.0, chat("a b", True, "no-done"), True, None, 5.0),
    ]
    spec = PhaseSpec(
        fake_upstream + "/chat/completions", 1.0, 5.0, 7, streams, headers=["content-type"]
    )
    result = loadgen.open(spec)
    assert len(result.records) == len(_plan(spec)) == len(result.headers)
    assert all(isinstance(r, Record) and r.status == 200 for r in result.records)
    by_stream = {i: [r for r in result.records if r.stream == i] for i in range(3)}
    assert all(by_stream.values())
    for record in by_stream[0] + by_stream[1]:
        assert (record.code, record.timed_out) == (None, False) and record.tokens > 0
        assert 0 < record.first_ms <= record.latency_ms
    assert {r.code for r in by_stream[2]} == {"stream:incomplete"}
    whole = {
        kept[0] for r, kept in zip(result.records, result.headers, strict=True) if r.stream == 0
    }
    assert whole == {"application/json"}
    assert 0 < result.wall_s < 5.0 and result.cpu_s > 0


def test_a_stream_the_gateway_ended_with_an_error_is_recorded_by_its_code() -> None:
    cut = b'data: {"choices": []}\n\ndata: {"error": {"code": "deadline_exceeded"}}\n\n'
    assert _last_event_code(cut) == "deadline_exceeded"
    assert _last_event_code(b'data: {"choices": []}\n\n') is None
