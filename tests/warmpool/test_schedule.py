"""Scheduled floors as tables: a schedule and a fixed time in, a replica count out; cron
parsing with its errors; time zones across both daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from warmpool.schedule import Schedule, Window, floor_at, parse_cron, time_zone

BERLIN = ZoneInfo("Europe/Berlin")


def schedule(*windows: tuple[str, float, int], zone: str = "UTC") -> Schedule:
    return Schedule(tuple(Window(parse_cron(c), d, n) for c, d, n in windows), time_zone(zone))


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


OFFICE = ("0 8 * * 1-5", 10 * 3600, 1)  # weekdays 08:00-18:00
# 2026-06-01 is a Monday, 2026-06-05 a Friday, 2026-06-06 a Saturday.
CASES: list[tuple[str, Schedule, datetime, int]] = [
    ("before the window opens", schedule(OFFICE), utc(2026, 6, 1, 7, 59, 59), 0),
    ("as it opens", schedule(OFFICE), utc(2026, 6, 1, 8, 0), 1),
    ("in its last second", schedule(OFFICE), utc(2026, 6, 1, 17, 59, 59), 1),
    ("as it closes", schedule(OFFICE), utc(2026, 6, 1, 18, 0), 0),
    ("not on a Saturday", schedule(OFFICE), utc(2026, 6, 6, 10, 0), 0),
    (
        "a window opened on Friday evening still holds on Saturday morning",
        schedule(("0 20 * * fri", 12 * 3600, 2)),
        utc(2026, 6, 6, 7, 59),
        2,
    ),
    (
        "overlapping windows: the largest floor",
        schedule(OFFICE, ("0 12 * * *", 3600, 3)),
        utc(2026, 6, 1, 12, 30),
        3,
    ),
    ("a list of hours", schedule(("0 6,18 * * *", 60, 1)), utc(2026, 6, 1, 18, 0, 30), 1),
    ("steps", schedule(("*/15 * * * *", 60, 1)), utc(2026, 6, 1, 9, 45, 59), 1),
    ("between steps", schedule(("*/15 * * * *", 60, 1)), utc(2026, 6, 1, 9, 46), 0),
    (
        "both day fields restricted: either matches (the 1st, a Monday here)",
        schedule(("0 0 1 * sat", 3600, 1)),
        utc(2026, 6, 1, 0, 30),
        1,
    ),
    (
        "both day fields restricted: either matches (a Saturday, not the 1st)",
        schedule(("0 0 1 * sat", 3600, 1)),
        utc(2026, 6, 6, 0, 30),
        1,
    ),
    ("month names", schedule(("0 9 * jan-mar *", 3600, 1)), utc(2026, 6, 1, 9, 30), 0),
    ("no windows", schedule(), utc(2026, 6, 1, 12, 0), 0),
    # Berlin is UTC+2 in summer (CEST), UTC+1 in winter (CET).
    ("in a zone, summer", schedule(OFFICE, zone="Europe/Berlin"), utc(2026, 6, 1, 6, 0), 1),
    (
        "in a zone, summer, before",
        schedule(OFFICE, zone="Europe/Berlin"),
        utc(2026, 6, 1, 5, 59),
        0,
    ),
    ("in a zone, winter", schedule(OFFICE, zone="Europe/Berlin"), utc(2026, 1, 5, 7, 0), 1),
    (
        "in a zone, winter, before",
        schedule(OFFICE, zone="Europe/Berlin"),
        utc(2026, 1, 5, 6, 59),
        0,
    ),
    # Spring change, 2026-03-29: 02:00 CET jumps to 03:00 CEST. 02:30 does not exist: it
    # fires at 03:30 CEST (01:30 UTC).
    (
        "a skipped time fires an hour later by the clock",
        schedule(("30 2 * * *", 600, 1), zone="Europe/Berlin"),
        utc(2026, 3, 29, 1, 30),
        1,
    ),
    (
        "... and not before",
        schedule(("30 2 * * *", 600, 1), zone="Europe/Berlin"),
        utc(2026, 3, 29, 1, 29),
        0,
    ),
    # Midnight CET is 23:00 UTC; six real hours later is 05:00 UTC (07:00 CEST, not 06:00).
    (
        "a duration across the spring change is real seconds",
        schedule(("0 0 * * *", 6 * 3600, 1), zone="Europe/Berlin"),
        utc(2026, 3, 29, 4, 59),
        1,
    ),
    (
        "... and ends then",
        schedule(("0 0 * * *", 6 * 3600, 1), zone="Europe/Berlin"),
        utc(2026, 3, 29, 5, 0),
        0,
    ),
    # Autumn change, 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    (
        "a repeated time fires at its first occurrence (00:30 UTC)",
        schedule(("30 2 * * *", 1800, 1), zone="Europe/Berlin"),
        utc(2026, 10, 25, 0, 45),
        1,
    ),
    (
        "... and not at the second (01:30 UTC)",
        schedule(("30 2 * * *", 1800, 1), zone="Europe/Berlin"),
        utc(2026, 10, 25, 1, 45),
        0,
    ),
]


@pytest.mark.parametrize(("name", "plan", "now", "floor"), CASES, ids=[c[0] for c in CASES])
def test_floor_at(name: str, plan: Schedule, now: datetime, floor: int) -> None:
    assert floor_at(plan, now) == floor


def test_the_same_instant_in_another_zone_gives_the_same_floor() -> None:
    plan = schedule(OFFICE, zone="Europe/Berlin")
    assert floor_at(plan, utc(2026, 6, 1, 6, 0).astimezone(BERLIN)) == 1
    assert floor_at(plan, datetime(2026, 6, 1, 7, 59, tzinfo=BERLIN)) == 0


def test_now_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        floor_at(schedule(OFFICE), datetime(2026, 6, 1, 9, 0))


def test_fields_parse_as_cron_reads_them() -> None:
    cron = parse_cron("5/20 0-6/3 1,15 JAN,jul-aug 7")
    assert cron.minutes == {5, 25, 45}
    assert cron.hours == {0, 3, 6}
    assert cron.days == {1, 15}
    assert cron.months == {1, 7, 8}
    assert cron.weekdays == {0}  # 7 is Sunday, as 0 is
    assert parse_cron("0 0 * * sun-sat").weekdays == set(range(7))


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 8 * *", "has 4 fields; expected 5"),
        ("60 8 * * *", "minute '60': 60 is outside 0-59"),
        ("0 24 * * *", "hour '24': 24 is outside 0-23"),
        ("0 8 0 * *", "day of month '0': 0 is outside 1-31"),
        ("0 8 * 13 *", "month '13': 13 is outside 1-12"),
        ("0 8 * * 8", "day of week '8': 8 is outside 0-7"),
        ("0 8 * * mon-fir", "day of week 'mon-fir': 'fir' is not a number"),
        ("0 18-8 * * *", "hour '18-8': the range runs backwards"),
        ("*/0 * * * *", "minute '*/0': 0 is outside 1-60"),
        ("0 8,,9 * * *", "hour '': '' is not a number"),
        ("@daily", "has 1 fields; expected 5"),
    ],
)
def test_bad_expressions_say_which_field_and_why(expression: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_cron(expression)
    assert message in str(caught.value)


def test_time_zones_by_name() -> None:
    assert time_zone("UTC") is UTC
    assert time_zone("Europe/Berlin") == BERLIN
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        time_zone("Mars/Olympus")
