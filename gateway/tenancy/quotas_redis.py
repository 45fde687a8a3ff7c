"""Quotas shared by every gateway replica, checked and consumed atomically in Redis.

Algorithm: GCRA for the per-minute limits. Each bucket is one number, its theoretical
arrival time (TAT); a request of cost c fits when max(TAT, now) + c x (60 s / limit) is
at most one minute ahead of now, and admitting it stores that sum. We chose it over a
sliding window because variable costs (tokens) and refunds are exact and O(1) (a refund
moves the TAT back, never below now), the wait until a request fits is exact (so
Retry-After is), a bucket is one key whose TTL is its TAT (idle tenants cost nothing), and
there is no window edge where twice the limit passes. A sliding log would store one entry
per request; a sliding-window counter approximates and cannot refund exactly.

One script admits a request: it reads Redis's clock (`TIME`; replicas' clocks never
matter), checks every bucket of the tenant (requests and tokens per minute, concurrency,
budgets of tokens and of spend per day and month) and consumes all of them or none. A
second script settles: it releases the concurrency lease and, only if the lease was still
there (so settling twice is harmless), refunds the unused tokens and spend or charges the
excess. A lease past its TTL no longer counts as in flight but stays in the set for
SETTLE_GRACE_S more, so that a request that outlived it (a long stream) is still settled
by its reservation, exactly once.

Keys, all under the tenant's hash tag so a Redis Cluster keeps them on one slot:

    {prefix:tenant}:rpm      string  TAT of the requests bucket (µs), expires at the TAT
    {prefix:tenant}:tpm      string  TAT of the tokens bucket (µs), expires at the TAT
    {prefix:tenant}:leases   zset    lease id -> expiry (µs); the tenant's requests in flight
                                     (those not yet expired), and the expired yet unsettled
    {prefix:tenant}:budget   hash    d, du, dc, m, mu, mc: UTC day and month ids, and tokens
                                     and spend (micro-USD) used in each
    {prefix}:replicas        zset    replica id -> last heartbeat (ms), for the live count

Budgets live in one hash keyed by period id (not a key per period) so that every key the
scripts touch is declared in KEYS, as Redis Cluster requires, while Redis's clock alone
decides the period; the hash expires a day after the month it counts ends.

When Redis fails (down, timeout, error), rate limits fall back to a `LocalQuotas` holding
this replica's share (limit // live replicas last seen), budgets fail closed (`unavailable`),
and the `on_fallback` hook hears every such decision. Settlements that cannot reach Redis
are retried by `run()`; the lease TTL bounds what a crashed replica can leak.

The scripts are Lua files next to this module, read once at import: quotas_admit.lua
(GCRA and budgets in one round trip, which must stay in one piece to stay atomic) and
quotas_settle.lua, each after the prelude they share (quotas_common.lua), and the read-only
quotas_peek.lua and quotas_heartbeat.lua.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from importlib.resources import files

import anyio
import anyio.abc
from redis.exceptions import RedisError

from common.redis_client import RedisFactory
from gateway.tenancy.quotas import (
    DEFAULT_LEASE_TTL_S,
    REASONS,
    SETTLE_GRACE_S,
    STATE_UNAVAILABLE,
    Admission,
    QuotaLimits,
    RateView,
    Reservation,
    Standing,
    calendar,
    rate_headers,
    refused,
    retry_headers,
    spend_headers,
)
from gateway.tenancy.quotas_local import LocalQuotas
from gateway.tenancy.state import StateStoreError

_log = logging.getLogger("gateway.tenancy.quotas")


def _lua(name: str) -> str:
    """The script in quotas_NAME.lua next to this module, byte for byte as Redis runs it
    (and caches it: by the text's SHA1)."""
    return (files(__package__) / f"quotas_{name}.lua").read_text(encoding="utf-8")


# Admitting and settling share a prelude: Redis's clock (µs), PERIOD and `save_tat`.
_LUA_COMMON = _lua("common")
_ADMIT = _LUA_COMMON + _lua("admit")
_SETTLE = _LUA_COMMON + _lua("settle")
# Read only: Redis's clock, both buckets' TATs, live leases, the budget hash.
_PEEK = _lua("peek")
_HEARTBEAT = _lua("heartbeat")


def tenant_keys(prefix: str, tenant: str) -> list[str]:
    tag = f"{{{prefix}:{tenant}}}"
    return [f"{tag}:rpm", f"{tag}:tpm", f"{tag}:leases", f"{tag}:budget"]


class RedisQuotas:
    """`QuotaEnforcer` over Redis; start `run()` in a task group to heartbeat and catch up."""

    def __init__(
        self,
        clients: RedisFactory,
        prefix: str,
        replica_id: str | None = None,
        *,
        timeout_s: float = 0.25,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        heartbeat_s: float = 5.0,
        replica_ttl_s: float = 15.0,
        initial_replicas: int = 1,
        retry_s: float = 1.0,
        on_fallback: Callable[[str], None] | None = None,
        local: LocalQuotas | None = None,
    ) -> None:
        # No client-side retries: a failed call falls back at once instead of stalling.
        self._redis = clients.client("quotas", timeout_s, retries=0)
        self._prefix = prefix
        self.replica_id = replica_id or uuid.uuid4().hex
        self._lease_ttl_us = round(lease_ttl_s * 1_000_000)
        self._heartbeat_s = heartbeat_s
        self._replica_ttl_ms = round(replica_ttl_s * 1000)
        self._retry_s = retry_s
        self._on_fallback = on_fallback or (lambda decision: None)
        self._local = local or LocalQuotas(lease_ttl_s=lease_ttl_s)
        self._admit = self._redis.register_script(_ADMIT)
        self._settle = self._redis.register_script(_SETTLE)
        self._beat = self._redis.register_script(_HEARTBEAT)
        self._peek = self._redis.register_script(_PEEK)
        self._replicas_key = f"{{{prefix}}}:replicas"
        self._down_until = 0.0
        self._unsettled: collections.deque[tuple[Reservation, int, int]] = collections.deque(
            maxlen=100_000
        )
        self.replicas = max(1, initial_replicas)

    async def admit(
        self, tenant: str, limits: QuotaLimits, reserve_tokens: int, reserve_cost: int = 0
    ) -> Admission:
        if limits.unlimited:
            hold = Reservation(tenant, reserve_tokens, "", limits, 0, 0)
            return Admission(True, reservation=hold)
        if not self._is_down():
            try:
                return await self._admit_shared(tenant, limits, reserve_tokens, reserve_cost)
            except (RedisError, OSError) as exc:
                self._went_down(exc)
        return self._admit_fallback(tenant, limits, reserve_tokens)

    async def settle(self, reservation: Reservation, used_tokens: int, used_cost: int = 0) -> None:
        if reservation.in_process:
            self._local.settle_now(reservation, used_tokens, used_cost)
        elif not reservation.limits.unlimited and not await self._settle_shared(
            reservation, used_tokens, used_cost
        ):
            self._unsettled.append((reservation, used_tokens, used_cost))
            self._on_fallback("settle_deferred")

    async def standing(self, tenant: str) -> Standing:
        """Raises StateStoreError when Redis does not answer (nothing to fall back on)."""
        try:
            raw = await self._peek(tenant_keys(self._prefix, tenant), [])
        except (RedisError, OSError) as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        now_us, rpm_tat, tpm_tat = (float(v) for v in raw[:3])
        live, day, day_used, month, month_used, day_cost, month_cost = (int(v) for v in raw[3:])
        cal = calendar(now_us / 1e6)
        return Standing(
            max(0.0, rpm_tat - now_us) / 1e6,
            max(0.0, tpm_tat - now_us) / 1e6,
            live,
            day_used if day == cal.day else 0,
            month_used if month == cal.month else 0,
            day_cost if day == cal.day else 0,
            month_cost if month == cal.month else 0,
        )

    async def heartbeat(self) -> int:
        """Announce this replica, learn how many are live, and retry deferred settlements."""
        count = int(await self._beat([self._replicas_key], [self.replica_id, self._replica_ttl_ms]))
        self.replicas = max(1, count)
        self._down_until = 0.0
        while self._unsettled:
            reservation, used, cost = self._unsettled[0]
            if not await self._settle_shared(reservation, used, cost):
                break
            self._unsettled.popleft()
        return self.replicas

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Heartbeat forever; ready after the first beat (which may fail: then fallback)."""
        await self._beat_once()
        task_status.started()
        while True:
            await anyio.sleep(self._heartbeat_s)
            await self._beat_once()

    async def _beat_once(self) -> None:
        try:
            await self.heartbeat()
        except (RedisError, OSError) as exc:
            self._went_down(exc)

    async def close(self) -> None:
        """Leave the replica set at once (the others' shares grow) and close the pool."""
        with contextlib.suppress(RedisError, OSError):
            await self._redis.zrem(self._replicas_key, self.replica_id)
        await self._redis.aclose()

    async def _admit_shared(
        self, tenant: str, limits: QuotaLimits, cost: int, spend: int
    ) -> Admission:
        lease = uuid.uuid4().hex
        args = [_n(v) for v in (*limits.rates(), *limits.budgets())]
        grace = round(SETTLE_GRACE_S * 1_000_000)
        spending = [_n(v) for v in limits.spend()]
        raw = await self._admit(
            tenant_keys(self._prefix, tenant),
            [*args, cost, lease, self._lease_ttl_us, grace, *spending, spend],
        )
        reason, wait_us, req_left, req_reset, tok_left, tok_reset, day, month, dc, mc = (
            int(v) for v in raw
        )
        rpm, tpm, _ = limits.rates()
        views = (_view(rpm, req_left, req_reset), _view(tpm, tok_left, tok_reset))
        if reason:
            wait = None if wait_us < 0 else wait_us / 1e6
            headers = {**rate_headers(*views, wait), **spend_headers(limits, dc, mc)}
            return refused(REASONS[reason - 1], wait, headers)
        hold = Reservation(tenant, cost, lease, limits, day, month, cost=spend)
        headers = {**rate_headers(*views), **spend_headers(limits, dc, mc)}
        return Admission(True, reservation=hold, headers=headers)

    async def _settle_shared(
        self, reservation: Reservation, used_tokens: int, used_cost: int
    ) -> bool:
        if self._is_down():
            return False
        keys = tenant_keys(self._prefix, reservation.tenant)
        tpm = _n(reservation.limits.tokens_per_minute)
        delta = used_tokens - reservation.tokens
        args: list[int | str] = [
            tpm,
            delta,
            reservation.lease_id,
            reservation.day,
            reservation.month,
            used_cost - reservation.cost,
        ]
        try:
            await self._settle(keys, args)
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            return False
        return True

    def _admit_fallback(self, tenant: str, limits: QuotaLimits, cost: int) -> Admission:
        if limits.has_budgets:
            self._on_fallback("fail_closed")
            headers = retry_headers(self._retry_s)
            return Admission(False, STATE_UNAVAILABLE, self._retry_s, None, headers, True)
        admission = self._local.admit_now(tenant, limits.share(self.replicas), cost)
        self._on_fallback("local_allowed" if admission.allowed else "local_refused")
        return admission

    def _is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _went_down(self, exc: BaseException) -> None:
        if not self._is_down():
            _log.warning(
                "quota store unreachable (%s): local limits for %ss",
                type(exc).__name__,
                self._retry_s,
            )
        self._down_until = time.monotonic() + self._retry_s


def _n(limit: int | None) -> int:
    """A limit as the scripts take it: 0 is unlimited."""
    return 0 if limit is None else limit


def _view(limit: int | None, remaining: int, reset_us: int) -> RateView | None:
    return None if limit is None else RateView(limit, remaining, reset_us / 1e6)
