"""Quotas in this process (`LocalQuotas`): the embedded default, and `RedisQuotas`' fallback.
The decisions are gateway/tenancy/quotas.py's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.tenancy.quotas import (
    DEFAULT_LEASE_TTL_S,
    SETTLE_GRACE_S,
    Admission,
    Calendar,
    QuotaLimits,
    QuotaUsage,
    Reservation,
    Standing,
    calendar,
    gcra_adjust,
    gcra_step,
    rate_headers,
    refusals,
    refused,
    spend_headers,
    views,
    worst,
)


@dataclass
class _TenantState:
    requests_tat: float = 0.0
    tokens_tat: float = 0.0
    # lease id -> expiry (monotonic); kept SETTLE_GRACE_S past it, counted only until it
    leases: dict[str, float] = field(default_factory=dict)
    day: int = -1
    day_used: int = 0
    day_cost: int = 0
    month: int = -1
    month_used: int = 0
    month_cost: int = 0


class LocalQuotas:
    """Quotas in this process. Each call runs without awaiting, so it is atomic."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._lease_ttl_s = lease_ttl_s
        self._tenants: dict[str, _TenantState] = {}

    async def admit(
        self, tenant: str, limits: QuotaLimits, reserve_tokens: int, reserve_cost: int = 0
    ) -> Admission:
        return self.admit_now(tenant, limits, reserve_tokens, reserve_cost)

    async def settle(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        self.settle_now(reservation, used_tokens, used_cost)

    def admit_now(
        self, tenant: str, limits: QuotaLimits, reserve_tokens: int, reserve_cost: int = 0
    ) -> Admission:
        now, cal = self._monotonic(), calendar(self._wall())
        state = self._tenants.setdefault(tenant, _TenantState())
        state.leases = {k: t for k, t in state.leases.items() if t + SETTLE_GRACE_S > now}
        _roll(state, cal)
        rpm, tpm, _ = limits.rates()
        req = None if rpm is None else gcra_step(state.requests_tat, now, 1, rpm)
        tok = None if tpm is None else gcra_step(state.tokens_tat, now, reserve_tokens, tpm)
        usage = QuotaUsage(
            _live(state, now), state.day_used, state.month_used, state.day_cost, state.month_cost
        )
        found = refusals(limits, reserve_tokens, req, tok, usage, cal, reserve_cost)
        refusal = worst(found)
        if refusal is not None:
            headers = rate_headers(*views(req, tok, False), refusal[1])
            headers.update(spend_headers(limits, state.day_cost, state.month_cost))
            return refused(*refusal, headers)
        state.requests_tat = req.tat if req else state.requests_tat
        state.tokens_tat = tok.tat if tok else state.tokens_tat
        state.day_used += reserve_tokens
        state.month_used += reserve_tokens
        state.day_cost += reserve_cost
        state.month_cost += reserve_cost
        lease = uuid.uuid4().hex
        state.leases[lease] = now + self._lease_ttl_s
        hold = Reservation(
            tenant, reserve_tokens, lease, limits, cal.day, cal.month, True, reserve_cost
        )
        headers = rate_headers(*views(req, tok, True))
        headers.update(spend_headers(limits, state.day_cost, state.month_cost))
        return Admission(True, reservation=hold, headers=headers)

    def settle_now(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        state = self._tenants.get(reservation.tenant)
        if state is None or state.leases.pop(reservation.lease_id, None) is None:
            return  # settled already (or a day past its lease's expiry)
        delta = used_tokens - reservation.tokens
        tpm = reservation.limits.tokens_per_minute
        if tpm is not None:
            state.tokens_tat = gcra_adjust(state.tokens_tat, self._monotonic(), delta, tpm)
        # A period that rolled over since admission keeps what it was charged.
        spent = used_cost - reservation.cost
        if state.day == reservation.day:
            state.day_used += delta
            state.day_cost += spent
        if state.month == reservation.month:
            state.month_used += delta
            state.month_cost += spent

    async def standing(self, tenant: str) -> Standing:
        now, cal = self._monotonic(), calendar(self._wall())
        state = self._tenants.get(tenant) or _TenantState()
        return Standing(
            max(0.0, state.requests_tat - now),
            max(0.0, state.tokens_tat - now),
            _live(state, now),
            state.day_used if state.day == cal.day else 0,
            state.month_used if state.month == cal.month else 0,
            state.day_cost if state.day == cal.day else 0,
            state.month_cost if state.month == cal.month else 0,
        )

    def in_flight(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return 0 if state is None else _live(state, self._monotonic())


def _live(state: _TenantState, now: float) -> int:
    """Requests in flight: leases not yet past their TTL."""
    return sum(1 for expiry in state.leases.values() if expiry > now)


def _roll(state: _TenantState, cal: Calendar) -> None:
    if state.day != cal.day:
        state.day, state.day_used, state.day_cost = cal.day, 0, 0
    if state.month != cal.month:
        state.month, state.month_used, state.month_cost = cal.month, 0, 0
