"""Per-tenant quotas: requests and tokens per minute, concurrent requests, token budgets,
and spend budgets in dollars.

A request is admitted before it runs and settled after it ran:

    admission = await quotas.admit(tenant, limits, request.reserved_tokens(default))
    ...                                   # refused: 429 (503 when `unavailable`)
    await quotas.settle(admission.reservation, used_tokens)   # always, exactly once

Admission reserves the estimated tokens (prompt + `max_tokens`) in every token bucket at
once, and their estimated cost (at the model's price, in micro-USD) in the spend budgets,
so concurrent requests cannot together overrun a limit; settle refunds what was not used
(or charges the excess) and releases the concurrency slot.

Per-minute limits are GCRA buckets (one "theoretical arrival time" per bucket, advanced
by cost x emission interval): a full minute's worth may be spent at once, and it refills
continuously, as OpenAI's own limits do. Budgets per day and per month, of tokens and of
spend, are counters that reset at UTC calendar boundaries.

`LocalQuotas` (gateway/tenancy/quotas_local.py) keeps this state in process: the embedded
default, and the fallback of `RedisQuotas` (gateway/tenancy/quotas_redis.py), which shares
it between replicas. Both implement `QuotaEnforcer`. Here: the types and the decisions,
pure functions with the clock passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

MINUTE_S = 60.0
DAY_S = 86_400.0
# No clock says when a concurrency slot frees up: suggest a short wait.
CONCURRENCY_RETRY_S = 1.0
DEFAULT_LEASE_TTL_S = 600.0
# A lease past its TTL no longer holds a concurrency slot (a crashed replica's requests
# free theirs), but it is kept this much longer so that the request that outlived it is
# still settled, exactly once, by its reservation: tokens are charged what it used.
SETTLE_GRACE_S = 86_400.0
# Float slack when comparing a bucket's fill with its period.
_EPS_S = 1e-6

# Reason codes, in the order the Redis script numbers them (1-based).
REASONS = (
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent",
    "tokens_per_day",
    "tokens_per_month",
    "usd_per_day",
    "usd_per_month",
)
STATE_UNAVAILABLE = "state_unavailable"


@dataclass(frozen=True)
class QuotaLimits:
    """A tenant's limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    # Spend budgets, in micro-USD (a price per million tokens is micro-USD per token).
    usd_per_day: int | None = None
    usd_per_month: int | None = None

    @property
    def unlimited(self) -> bool:
        return all(v is None for v in (*self.rates(), *self.budgets(), *self.spend()))

    @property
    def has_budgets(self) -> bool:
        return any(v is not None for v in (*self.budgets(), *self.spend()))

    def rates(self) -> tuple[int | None, int | None, int | None]:
        return self.requests_per_minute, self.tokens_per_minute, self.max_concurrent

    def budgets(self) -> tuple[int | None, int | None]:
        return self.tokens_per_day, self.tokens_per_month

    def spend(self) -> tuple[int | None, int | None]:
        return self.usd_per_day, self.usd_per_month

    def share(self, replicas: int) -> QuotaLimits:
        """One replica's share of the rate limits, when replicas cannot coordinate.

        Budgets are dropped: without the shared store they fail closed instead.
        """
        n = max(1, replicas)

        def part(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // n)

        rpm, tpm, conc = self.rates()
        return QuotaLimits(part(rpm), part(tpm), part(conc))


@dataclass(frozen=True)
class Reservation:
    """What settle needs: the tokens held, the concurrency lease, the budget periods charged,
    the spend held (micro-USD)."""

    tenant: str
    tokens: int
    lease_id: str
    limits: QuotaLimits
    day: int
    month: int
    # Issued by an in-process enforcer (LocalQuotas, or RedisQuotas' fallback).
    in_process: bool = False
    cost: int = 0


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reason: str | None = None
    # None when refused: waiting cannot help (the request alone exceeds a limit).
    retry_after_s: float | None = None
    reservation: Reservation | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # The quota store is unreachable and a budget fails closed: answer 503, not 429.
    unavailable: bool = False


class QuotaEnforcer(Protocol):
    async def admit(
        self, tenant: str, limits: QuotaLimits, reserve_tokens: int, reserve_cost: int = 0
    ) -> Admission: ...

    async def settle(
        self, reservation: Reservation, used_tokens: int, used_cost: int = 0
    ) -> None: ...

    async def standing(self, tenant: str) -> Standing: ...


@dataclass(frozen=True)
class Standing:
    """Where a tenant's counters stand now (read only, for the admin API)."""

    requests_filled_s: float  # how far ahead of now each per-minute bucket's TAT is
    tokens_filled_s: float
    in_flight: int
    day_used: int  # tokens charged this UTC day / month (0 once the period rolled over)
    month_used: int
    day_cost: int = 0  # micro-USD charged this UTC day / month
    month_cost: int = 0


def rate_view(filled_s: float, limit: int) -> RateView:
    """A per-minute bucket filled `filled_s` seconds ahead, under `limit`."""
    return RateView(limit, _remaining(filled_s, MINUTE_S, MINUTE_S / limit, limit), filled_s)


# --- pure decisions ---------------------------------------------------------------------


@dataclass(frozen=True)
class RateView:
    """Where one per-minute bucket stands, as the x-ratelimit-* headers show it."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class GcraStep:
    allowed: bool
    tat: float  # the bucket's theoretical arrival time once this request is admitted
    wait_s: float | None  # refused: until it would fit; None: it never fits
    before: RateView  # the bucket as it stands
    after: RateView  # the bucket once this request is admitted


def gcra_step(
    tat: float, now: float, cost: int, limit: int, period_s: float = MINUTE_S
) -> GcraStep:
    interval = period_s / limit
    base = max(tat, now)
    after = base + cost * interval
    allowed = after - now <= period_s + _EPS_S
    wait = None if cost > limit else max(0.0, after - period_s - now)

    def view(filled_s: float) -> RateView:
        return RateView(limit, _remaining(filled_s, period_s, interval, limit), filled_s)

    return GcraStep(allowed, after, None if allowed else wait, view(base - now), view(after - now))


def views(
    requests: GcraStep | None, tokens: GcraStep | None, admitted: bool
) -> tuple[RateView | None, RateView | None]:
    """What the headers show: the buckets after this request if admitted, else as they are."""

    def pick(step: GcraStep | None) -> RateView | None:
        return None if step is None else step.after if admitted else step.before

    return pick(requests), pick(tokens)


def gcra_adjust(
    tat: float, now: float, delta: int, limit: int, period_s: float = MINUTE_S
) -> float:
    """Refund (delta < 0) moves the TAT back, never below now; a charge moves it on."""
    interval = period_s / limit
    if delta < 0:
        return max(now, tat + delta * interval)
    return max(tat, now) + delta * interval


def _remaining(filled_s: float, period_s: float, interval: float, limit: int) -> int:
    return min(limit, max(0, math.floor((period_s - filled_s + _EPS_S) / interval)))


@dataclass(frozen=True)
class Calendar:
    """UTC budget periods at one instant: ids, and seconds until each ends."""

    day: int
    month: int
    day_left_s: float
    month_left_s: float


def calendar(wall: float) -> Calendar:
    moment = datetime.fromtimestamp(wall, UTC)
    day = math.floor(wall / DAY_S)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    month_end = datetime(year, month, 1, tzinfo=UTC).timestamp()
    month_id = moment.year * 12 + moment.month - 1
    return Calendar(day, month_id, (day + 1) * DAY_S - wall, month_end - wall)


def budget_wait(used: int, cost: int, limit: int | None, left_s: float) -> float | None:
    """0 when `cost` fits in the budget; else seconds until it resets (None: never fits)."""
    if limit is None or used + cost <= limit:
        return 0.0
    return None if cost > limit else left_s


def worst(refusals: Iterable[tuple[str, float | None]]) -> tuple[str, float | None] | None:
    """Of the limits a request breaks, the one it must wait longest for (None: forever)."""
    found = list(refusals)
    if not found:
        return None
    never = [r for r in found if r[1] is None]
    return never[0] if never else max(found, key=lambda r: r[1] or 0.0)


@dataclass(frozen=True)
class QuotaUsage:
    """What a tenant holds now, besides its per-minute buckets."""

    in_flight: int
    day_used: int
    month_used: int
    day_cost: int = 0
    month_cost: int = 0


def refusals(
    limits: QuotaLimits,
    cost: int,
    requests: GcraStep | None,
    tokens: GcraStep | None,
    usage: QuotaUsage,
    cal: Calendar,
    spend: int = 0,
) -> list[tuple[str, float | None]]:
    """Every limit this request would break, with how long until it would fit."""
    conc = limits.max_concurrent
    waits = [
        0.0 if requests is None or requests.allowed else requests.wait_s,
        0.0 if tokens is None or tokens.allowed else tokens.wait_s,
        CONCURRENCY_RETRY_S if conc is not None and usage.in_flight >= conc else 0.0,
        budget_wait(usage.day_used, cost, limits.tokens_per_day, cal.day_left_s),
        budget_wait(usage.month_used, cost, limits.tokens_per_month, cal.month_left_s),
        budget_wait(usage.day_cost, spend, limits.usd_per_day, cal.day_left_s),
        budget_wait(usage.month_cost, spend, limits.usd_per_month, cal.month_left_s),
    ]
    return [(reason, wait) for reason, wait in zip(REASONS, waits, strict=True) if wait != 0.0]


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes it in x-ratelimit-reset-*: "20ms", "1s", "6m0s", "1h2m3s"."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def spend_headers(limits: QuotaLimits, day_cost: int, month_cost: int) -> dict[str, str]:
    """What is left of the spend budgets, in USD, once this request's hold is counted."""
    headers: dict[str, str] = {}
    for period, limit, used in (
        ("day", limits.usd_per_day, day_cost),
        ("month", limits.usd_per_month, month_cost),
    ):
        if limit is not None:
            headers[f"x-budget-remaining-usd-{period}"] = f"{max(0, limit - used) / 1e6:.6f}"
    return headers


def rate_headers(
    requests: RateView | None, tokens: RateView | None, retry_after_s: float | None = None
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, view in (("requests", requests), ("tokens", tokens)):
        if view is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(view.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(view.remaining)
            headers[f"x-ratelimit-reset-{name}"] = format_reset(view.reset_s)
    if retry_after_s is not None:
        headers.update(retry_headers(retry_after_s))
    return headers


def retry_headers(retry_after_s: float) -> dict[str, str]:
    # The official openai clients prefer retry-after-ms when present.
    return {
        "retry-after": str(max(1, math.ceil(retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000))),
    }


def refused(reason: str, wait_s: float | None, headers: dict[str, str]) -> Admission:
    return Admission(False, reason, wait_s, None, headers)
