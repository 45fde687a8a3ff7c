"""The deadline of a request held for a start (gateway.traffic.deadline.held_deadline_s):
whose clock it follows, and how it grows to cover the learned start time."""

from __future__ import annotations

import pytest

from gateway.traffic.deadline import held_deadline_s

CLASS_S, MAX_S, MARGIN = 60.0, 600.0, 1.5


@pytest.mark.parametrize(
    ("headers", "remaining", "streamed", "expected"),
    [
        # No header: the class's default, or the start's remaining estimate x the margin.
        ({}, None, False, CLASS_S),
        ({}, 20.0, False, CLASS_S),
        ({}, 100.0, False, 150.0),
        ({}, 100.0, True, 150.0),
        ({}, 1000.0, False, MAX_S),
        # x-request-timeout is the client's own deadline, held or not, up to the maximum.
        ({"x-request-timeout": "5"}, 100.0, True, 5.0),
        ({"x-request-timeout": "300"}, None, False, 300.0),
        ({"x-request-timeout": "9000"}, None, False, MAX_S),
        ({"x-request-timeout": "soon", "x-stainless-read-timeout": "7"}, None, False, 7.0),
        ({"x-request-timeout": "-3"}, None, False, CLASS_S),
        # An SDK's read timeout bounds a held request that sends nothing until it is done...
        ({"x-stainless-read-timeout": "10"}, 100.0, False, 10.0),
        ({"x-stainless-timeout": "900"}, None, False, MAX_S),
        # ...not a held stream, which keep-alives keep talking: the longer of the two.
        ({"x-stainless-read-timeout": "10"}, 100.0, True, 150.0),
        ({"x-stainless-read-timeout": "300"}, 100.0, True, 300.0),
        ({"x-stainless-read-timeout": "10"}, None, True, CLASS_S),
    ],
)
def test_held_deadline(
    headers: dict[str, str], remaining: float | None, streamed: bool, expected: float
) -> None:
    got = held_deadline_s(headers, CLASS_S, MAX_S, remaining, MARGIN, streamed=streamed)
    assert got == expected
