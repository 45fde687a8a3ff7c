"""The pure helpers of bench/batch_interference.py."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from bench.batch_interference import (
    BATCH_PROMPT,
    busy_until,
    completed_lines,
    gateway_config,
    in_window,
    progress_series,
)
from bench.batch_interference import batch_file as make_batch_file
from bench.loadgen import Record


def test_batch_file_lines_are_distinct_requests_of_the_batch_shape() -> None:
    lines = [orjson.loads(line) for line in make_batch_file(3).splitlines()]
    assert [line["custom_id"] for line in lines] == ["line-0", "line-1", "line-2"]
    contents = [line["body"]["messages"][0]["content"] for line in lines]
    assert len(set(contents)) == 3
    assert all(len(content) == 4 * BATCH_PROMPT for content in contents)
    assert all("stream" not in line["body"] for line in lines)


def test_completed_lines_reads_the_counter_and_none_when_absent() -> None:
    text = (
        'gateway_batch_lines_total{outcome="completed"} 12.0\n'
        'gateway_batch_lines_total{outcome="retried"} 3.0\n'
    )
    assert completed_lines(text) == 12.0
    assert completed_lines("gateway_requests_in_flight 0.0\n") is None


def test_busy_until_is_the_first_poll_with_every_line_done() -> None:
    polls = [(0.0, "x"), (1.0, 'gateway_batch_lines_total{outcome="completed"} 15.0')]
    series = progress_series(polls)
    assert series == [(0.0, 0.0), (1.0, 15.0)]
    assert busy_until(series, total=10, baseline=5.0) == 1.0
    assert busy_until(series, total=11, baseline=5.0) == math.inf


def test_in_window_keeps_requests_sent_in_it() -> None:
    records = [Record(0, t, 1.0, 2.0, 200, None, False, 16) for t in (0.5, 1.0, 2.0)]
    assert [r.sent_s for r in in_window(records, (1.0, 2.0))] == [1.0]


def test_the_backend_is_told_the_engine_chunk_unless_unaware() -> None:
    told = gateway_config("http://e", Path("/tmp/x"), 16, 64)["backends"][0]
    assert told["prefill_chunk_tokens"] == 64
    unaware = gateway_config("http://e", Path("/tmp/x"), 16, None)["backends"][0]
    assert "prefill_chunk_tokens" not in unaware
