"""Scheduled floors: how many replicas a backend keeps ready at a given time, by the clock.

A schedule is a list of windows, each opened by a 5-field cron expression (minute, hour,
day of month, month, day of week) read as wall-clock time in the schedule's time zone, and
lasting `duration_s` real seconds from each time the expression fires:

    0 8 * * 1-5   for 36000 s, min_replicas 1     weekdays 08:00 to 18:00: one replica warm

The fields take `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, and lists of those;
months and days of the week also take English names (`jan`, `mon-fri`); day of week 0 and 7
are both Sunday. As in cron, when both day fields are restricted a day matches either one.

Around daylight-saving changes a fire time is the wall-clock time as `zoneinfo` reads it:
a time the spring change skips fires an hour later by the clock (02:30 becomes 03:30), and
a time that occurs twice in the autumn fires at its first occurrence only. Durations are
real seconds, so a window spanning a change ends an hour off by the clock.

`floor_at(schedule, now)` is pure: the caller passes the time (aware) in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MAX_WINDOW_S = 31 * 86400  # a window longer than a month is a standing min_replicas

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names starting at `lowest`)
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)


@dataclass(frozen=True)
class Cron:
    """A parsed 5-field cron expression: the values each field matches."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool  # the day-of-month field is not `*`
    weekdays_restricted: bool

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_date or by_weekday  # cron's rule: either day field
        return by_date and by_weekday


@dataclass(frozen=True)
class Window:
    cron: Cron
    duration_s: float
    min_replicas: int


@dataclass(frozen=True)
class Schedule:
    windows: tuple[Window, ...]
    zone: tzinfo = UTC


def parse_cron(expression: str) -> Cron:
    """The expression parsed; ValueError names the field that is wrong, and why."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(
            f"cron {expression!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week)"
        )
    values = [_parse_field(text, *spec) for text, spec in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(day % 7 for day in values[4])  # 7 is Sunday too
    return Cron(
        values[0], values[1], values[2], values[3], weekdays, fields[2] != "*", fields[4] != "*"
    )


def time_zone(name: str) -> tzinfo:
    """The IANA zone of that name; ValueError when the zone database does not have it."""
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)") from exc


def floor_at(schedule: Schedule, now: datetime) -> int:
    """The most `min_replicas` of the windows open at `now` (aware); 0 when none is."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    now = now.astimezone(UTC)  # aware arithmetic within one zone is wall-clock arithmetic
    return max(
        (w.min_replicas for w in schedule.windows if _is_open(w, schedule.zone, now)), default=0
    )


def _is_open(window: Window, zone: tzinfo, now: datetime) -> bool:
    # Only the latest fire at or before `now` matters: an earlier one ends earlier.
    fired = _last_fire(window.cron, zone, now, window.duration_s)
    return fired is not None and now < fired + timedelta(seconds=window.duration_s)


def _last_fire(cron: Cron, zone: tzinfo, now: datetime, within_s: float) -> datetime | None:
    """The latest time `cron` fired at or before `now`, looking back `within_s` (+ a day)."""
    today = now.astimezone(zone).date()
    for back in range(int(within_s // 86400) + 2):
        day = today - timedelta(days=back)
        if not cron.matches_day(day):
            continue
        for hour in sorted(cron.hours, reverse=True):
            for minute in sorted(cron.minutes, reverse=True):
                fire = datetime.combine(day, time(hour, minute), zone).astimezone(UTC)
                if fire <= now:
                    return fire
    return None


def _parse_field(
    text: str, name: str, low: int, high: int, names: tuple[str, ...]
) -> frozenset[int]:
    spec = (name, low, high, names)
    found: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = _number(step_text, name, part, 1, high - low + 1) if step_text else 1
        if span == "*":
            first, last = low, high
        elif "-" in span:
            start, _, end = span.partition("-")
            first, last = _value(start, part, *spec), _value(end, part, *spec)
            if first > last:
                raise ValueError(f"{name} {part!r}: the range runs backwards")
        else:
            first = _value(span, part, *spec)
            last = high if step_text else first  # `5/15`: from 5 on, as cronie reads it
        found.update(range(first, last + 1, step))
    return frozenset(found)


def _value(text: str, part: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    lowered = text.lower()
    if lowered in names:
        return low + names.index(lowered)
    return _number(text, name, part, low, high)


def _number(text: str, name: str, part: str, low: int, high: int) -> int:
    if not text.isdigit():
        raise ValueError(f"{name} {part!r}: {text!r} is not a number")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name} {part!r}: {value} is outside {low}-{high}")
    return value
