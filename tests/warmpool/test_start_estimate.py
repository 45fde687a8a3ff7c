"""The learned start time: the median of a backend's last starts, what is left of one under
way, and start times read back from stored cold-start timelines."""

from __future__ import annotations

from typing import Any

import pytest

from warmpool.start_estimate import StartTimes, ready_seconds, start_history


def test_no_start_measured_means_no_estimate() -> None:
    times = StartTimes()
    assert (times.estimate_s(), times.remaining_s(5.0), times.samples) == (None, None, 0)


@pytest.mark.parametrize(
    ("starts", "estimate"),
    [
        ([12.0], 12.0),
        ([10.0, 14.0], 12.0),
        ([12.0, 11.0, 95.0], 12.0),  # one start that staged its weights first barely counts
        ([60.0] * 8 + [12.0] * 5, 12.0),  # a lasting change wins within a few starts
        ([12.0, -1.0, float("nan"), float("inf")], 12.0),  # nonsense is ignored
    ],
)
def test_the_estimate_is_the_median_of_the_last_starts(
    starts: list[float], estimate: float
) -> None:
    times = StartTimes()
    for seconds in starts:
        times.observe(seconds)
    assert times.estimate_s() == estimate


@pytest.mark.parametrize(
    ("elapsed", "remaining"),
    [(0.0, 60.0), (-1.0, 60.0), (45.0, 15.0), (60.0, 0.0), (90.0, 0.0)],  # late: 0, not less
)
def test_what_is_left_of_a_start_under_way(elapsed: float, remaining: float) -> None:
    assert StartTimes([60.0]).remaining_s(elapsed) == remaining


def test_history_is_bounded_and_seeded_oldest_first() -> None:
    times = StartTimes([100.0, 100.0, 100.0, 5.0, 5.0, 5.0], history=4)
    assert (times.samples, times.estimate_s()) == (4, 5.0)
    with pytest.raises(ValueError, match="history"):
        StartTimes(history=0)


def record(outcome: str = "served", backend: str = "big", **extra: Any) -> dict[str, Any]:
    events = [
        {"event": "request_arrived", "at": 100.5},
        {"event": "process_started", "at": 101.0},
        {"event": "ready", "at": 112.0},
        {"event": "first_byte", "at": 112.2},
    ]
    return {"backend": backend, "outcome": outcome, "begun_at": 100.0, "events": events, **extra}


@pytest.mark.parametrize(
    ("stored", "seconds"),
    [
        (record(), 12.0),
        (record("ready"), 12.0),
        (record("no_first_byte"), 12.0),
        (record(begun_at=None), 11.5),  # older records: from the first event
        (record("failed"), None),
        (record(kind="wake"), None),  # wakes are timed apart
        (record(kind="start"), 12.0),
        (record("closed"), None),
        (record(events=[{"event": "request_arrived", "at": 100.5}]), None),  # never ready
        (record(events=[{"event": "ready", "at": 99.0}]), None),  # clocks disagree
        (record(events=["junk", {"event": "ready"}]), None),
    ],
)
def test_a_stored_timeline_gives_its_time_to_ready(
    stored: dict[str, Any], seconds: float | None
) -> None:
    assert ready_seconds(stored) == seconds


def test_start_history_per_backend_in_order() -> None:
    late = record(begun_at=200.0, events=[{"event": "ready", "at": 230.0}])
    stored = [record(), record("failed"), record(backend="small"), late]
    assert start_history(stored) == {"big": [12.0, 30.0], "small": [12.0]}
    assert start_history(stored, history=1) == {"big": [30.0], "small": [12.0]}
