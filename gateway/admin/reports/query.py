"""What a report covers: a time range, optional tenant and model, and a bucket width.

Times on the command line are a duration back from now (`90s`, `15m`, `1h`, `7d`) or an
ISO 8601 time (`2026-01-31T12:00:00Z`; without a zone, UTC).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_BUCKETS = 500  # over_time rows at most; a wider range gets wider buckets


class QueryError(ValueError):
    """A time or duration that cannot be read; the message says which."""


@dataclass(frozen=True)
class ReportQuery:
    since: datetime
    until: datetime
    tenant: str | None = None
    model: str | None = None
    bucket_s: float = 300.0

    def __post_init__(self) -> None:
        if self.until <= self.since:
            raise QueryError("the range is empty: `until` must be after `since`")
        if self.bucket_s <= 0:
            raise QueryError("the bucket must be longer than zero")

    @classmethod
    def parse(
        cls,
        since: str | None = "1h",
        until: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        bucket: str | None = "5m",
        now: datetime | None = None,
    ) -> ReportQuery:
        moment = now or datetime.now(UTC)
        return cls(
            parse_time(since or "1h", moment),
            parse_time(until, moment) if until else moment,
            tenant,
            model,
            parse_duration(bucket or "5m"),
        )

    @property
    def start(self) -> float:
        return self.since.timestamp()

    @property
    def end(self) -> float:
        return self.until.timestamp()

    def bucket_width(self) -> float:
        """`bucket_s`, widened so the range holds at most MAX_BUCKETS buckets."""
        span = self.end - self.start
        return max(self.bucket_s, span / MAX_BUCKETS)


def parse_duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise QueryError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_time(text: str, now: datetime) -> datetime:
    """A duration back from `now`, or an ISO 8601 time (UTC when it names no zone)."""
    if _DURATION.match(text):
        return now - timedelta(seconds=parse_duration(text))
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"not a time: {text!r} (use e.g. 1h or 2026-01-31T12:00:00Z)") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
