"""The pure parts of bench/light_load_paired.py: which half an answer belongs to, and the
bound it is judged by."""

from __future__ import annotations

import math

import pytest

from bench.light_load_paired import compared, halves, own_time, within
from bench.loadgen import PhaseResult, Record, StreamSpec


def spec(tenant: str) -> StreamSpec:
    return StreamSpec(tenant, "k", 1.0, "", tenant == "interactive", None, 6.0)


def test_a_streams_arrivals_alternate_between_the_halves_in_the_order_they_were_sent() -> None:
    specs = [spec("batch"), spec("interactive")]
    records = [  # out of order, as answers end; the batch stream is left out
        Record(1, 2.5, 30.0, 90.0, 200, None, False, 8),  # 3rd arrival: via
        Record(1, 0.5, 10.0, 90.0, 200, None, False, 8),  # 1st: via, before the window
        Record(0, 1.7, 99.0, 99.0, 200, None, False, 8),  # batch
        Record(1, 1.5, 20.0, 90.0, 200, None, False, 8),  # 2nd: direct
        Record(1, 3.5, 40.0, 90.0, 503, "busy", False, 0),  # 4th: direct, not answered
        Record(1, 4.5, 50.0, 90.0, 200, None, False, 8),  # 5th: via
    ]
    via, direct = halves(PhaseResult(records=records), specs, from_s=1.0)
    assert via == [30.0, 50.0]
    assert direct == [20.0]


def test_the_bound_is_ten_percent_plus_two_milliseconds() -> None:
    assert within(57.0, 50.0)
    assert not within(57.1, 50.0)
    assert within(2.0, 0.0)


def test_a_paired_phase_is_within_the_bound_only_if_p50_and_p99_both_are() -> None:
    direct = [float(ms) for ms in range(10, 110)]
    fine = compared([ms + 1.0 for ms in direct], direct)
    assert fine["within_bound"] == 1
    assert fine["paired_ttft_p50_added_ms"] == pytest.approx(1.0)
    assert fine["samples"] == 100
    slow_tail = compared([*direct[:-5], 400.0, 400.0, 400.0, 400.0, 400.0], direct)
    assert slow_tail["paired_ttft_p50_ratio"] == 1.0
    assert slow_tail["within_bound"] == 0
    with pytest.raises(RuntimeError, match="no interactive answers"):
        compared([], direct)


def test_the_gateways_own_time_is_its_time_outside_the_upstream_and_its_queue() -> None:
    """Four requests in the phase: 2.0 s end to end, 1.9 s of it upstream and 0.06 s in
    the fair queue, so 10 ms each of the gateway's own; nothing in a phase gives NaN."""
    before = {"request_s": 5.0, "requests": 10.0, "upstream_s": 4.0, "queued_s": 0.5}
    after = {"request_s": 7.0, "requests": 14.0, "upstream_s": 5.9, "queued_s": 0.56}
    spent = own_time(before, after)
    assert spent["gateway_own_ms_mean"] == pytest.approx(10.0)
    assert spent["gateway_queue_wait_ms_mean"] == pytest.approx(15.0)
    assert all(math.isnan(v) for v in own_time(after, after).values())
