"""bench/report.py: every benchmark's figure lines and progress lines."""

from __future__ import annotations

import math

import orjson
import pytest

from bench.report import emitter, progress_of


def test_a_figure_is_one_json_line_rounded_where_asked_and_never_nan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    emit = emitter("demo", digits=2)
    emit("ratio", 1.23456, "ratio", mode="on")
    emit("gone", math.nan, "ms")
    emit("far", math.inf, "ms")
    emit("count", 7, "requests")
    emitter("raw")("x", 1.23456, "s")
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == {
        "bench": "demo",
        "metric": "ratio",
        "value": 1.23,
        "unit": "ratio",
        "mode": "on",
    }
    assert [line["value"] for line in lines[1:]] == [None, None, 7, 1.23456]


def test_progress_goes_to_stderr_with_the_bench_name(capsys: pytest.CaptureFixture[str]) -> None:
    progress_of("demo")("phase one")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("[demo ") and captured.err.endswith("] phase one\n")
