"""What the request path asks of quotas besides admitting: a tenant's limits from its
settings, and a refused admission as the error its client gets (429, or 503 when the quota
store cannot be read for a budget)."""

from __future__ import annotations

from gateway.errors import QuotaExceeded, StateUnavailable
from gateway.settings import Quotas
from gateway.tenancy.quotas import Admission, QuotaLimits


def limits_of(quotas: Quotas) -> QuotaLimits:
    """A tenant's quotas as the enforcer takes them (spend budgets in micro-USD)."""
    return QuotaLimits(
        quotas.requests_per_minute,
        quotas.tokens_per_minute,
        quotas.max_concurrent,
        quotas.tokens_per_day,
        quotas.tokens_per_month,
        micro_usd(quotas.usd_per_day),
        micro_usd(quotas.usd_per_month),
    )


SPEND_PERIODS = {"usd_per_day": "day", "usd_per_month": "month"}


def _overspent(admission: Admission, reason: str, cost: int) -> QuotaExceeded:
    """A spend budget's refusal: what the request could cost, what is left, when it resets."""
    period = SPEND_PERIODS[reason]
    left = admission.headers.get(f"x-budget-remaining-usd-{period}", "0")
    when = (
        "" if admission.retry_after_s is None else f"; it resets in {admission.retry_after_s:.0f} s"
    )
    message = (
        f"This request could cost up to ${cost / 1e6:.6f}, more than the ${left} left of "
        f"your spend budget for this UTC {period}{when}."
    )
    return QuotaExceeded(message, headers=admission.headers, code="insufficient_quota")


def refusal(admission: Admission, cost: int = 0) -> QuotaExceeded | StateUnavailable:
    if admission.unavailable:
        return StateUnavailable(
            "The quota store is unreachable and this tenant's budget cannot be checked.",
            retry_after=1,
            headers=admission.headers,
        )
    reason = admission.reason or "quota"
    if reason in SPEND_PERIODS:
        return _overspent(admission, reason, cost)
    if admission.retry_after_s is None:
        message = f"This request alone exceeds your {reason.replace('_', ' ')} limit."
    else:
        message = f"Rate limit reached for {reason.replace('_', ' ')}; retry later."
    budget = reason in ("tokens_per_day", "tokens_per_month", "usd_per_day", "usd_per_month")
    code = "insufficient_quota" if budget else "rate_limit_exceeded"
    return QuotaExceeded(message, headers=admission.headers, code=code)


def micro_usd(usd: float | None) -> int | None:
    return None if usd is None else round(usd * 1_000_000)
