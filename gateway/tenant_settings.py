"""Tenants' settings (`tenants[]` in the configuration): their keys, quotas, spend
budgets, cache error bound and degradation policy. Part of the one settings tree
(`gateway.settings`, which re-exports every name here)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    PrivateAttr,
    StringConstraints,
    field_validator,
    model_validator,
)

from gateway.settings_types import Name, Priority, Sha256Hex, Strict

# Limits travel through Lua as doubles: beyond 2^53 they would lose precision.
_MAX_LIMIT = 2**53


class Quotas(Strict):
    """Per-tenant limits, shared by all replicas through the state store (None: unlimited)."""

    requests_per_minute: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    max_concurrent: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_day: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    tokens_per_month: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)
    # Spend budgets in USD, charged at `pricing`'s prices (a tenant with one may use
    # priced models only).
    usd_per_day: float | None = Field(default=None, gt=0, le=1e9)
    usd_per_month: float | None = Field(default=None, gt=0, le=1e9)

    @property
    def spends(self) -> bool:
        return self.usd_per_day is not None or self.usd_per_month is not None


class DeclaredKey(Strict):
    """A key declared in config: its SHA-256 (`sha256`), or a variable holding the key (`env`).

    With `env` and `generate: true`, a missing variable makes the gateway generate a key
    and print it once at start-up (for demos).
    """

    sha256: Sha256Hex | None = None
    env: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    generate: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> DeclaredKey:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of 'sha256' (hex digest of the key) or 'env'")
        return self


class ErrorBound(Strict):
    """Opt-in error-bounded semantic hits (cache/error_bound.py, after vCache): a near match
    is served with the chance that keeps wrong answers at or under `delta` per request,
    learned online from would-be hits the model also answers and that are compared.

    Applied to the tenant's semantic-tier hits (README "Error-bounded mode"), with the
    evidence pooled per cache namespace.
    """

    delta: float = Field(gt=0, le=0.2)  # the bound: wrong answers per request
    # namespace: evidence pooled for the namespace, which learns where entries are asked
    # only once or twice (bench/error_bound.py). entry (vCache as published) is refused
    # until evidence can live and die with its entry.
    scope: Literal["entry", "namespace"] = "namespace"

    @field_validator("scope")
    @classmethod
    def _namespace_only(cls, scope: str) -> str:
        if scope != "namespace":
            raise ValueError(
                "scope 'entry' is not supported yet: evidence is kept per namespace "
                "(use scope: namespace, the default)"
            )
        return scope


def _batch_only() -> list[Priority]:
    return ["batch"]


class Degrade(Strict):
    """Degradation under overload (gateway/degrade.py): once the expected queue wait of a
    request of one of `classes` exceeds `when_wait_over` of the time left before its
    deadline, cap its output at `max_tokens`, and/or send it to `model` instead."""

    when_wait_over: float = Field(gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_LIMIT)  # stored as JSON
    model: Name | None = None
    classes: list[Priority] = Field(default_factory=_batch_only, min_length=1)

    @model_validator(mode="after")
    def _some_action(self) -> Degrade:
        if self.max_tokens is None and self.model is None:
            raise ValueError("degrade needs max_tokens, model, or both")
        return self


class TenantProfile(Strict):
    """A tenant without its keys: what the admin API creates and updates."""

    name: Name
    weight: float = Field(default=1.0, gt=0)
    priority: Literal["interactive", "batch"] = "interactive"
    # May requests choose their class with the `x-priority` header (never above `priority`
    # unless this is true)?
    priority_header: bool = False
    models: list[str] = Field(default_factory=lambda: ["*"])
    quotas: Quotas = Quotas()
    # Tenants naming the same group share cache entries; otherwise a tenant's entries are its own.
    cache_group: Name | None = None
    cache_error_bound: ErrorBound | None = None  # None: the shipped fixed decision
    degrade: Degrade | None = None  # under overload; overrides its model's `degrade`


class Tenant(TenantProfile):
    keys: list[DeclaredKey] = Field(default_factory=list)
    # Set by the catalog for a tenant the admin API created (gateway/tenancy/tenants.py).
    _uid: str | None = PrivateAttr(default=None)

    @property
    def owner(self) -> str:
        """Whose data this tenant's is: files, jobs, cache scope and quota counters are kept
        by it, never by the name alone, so that a tenant deleted and created again under
        the same name starts with nothing of the old one's. A configured tenant's is its
        name; an API-created one's carries the id it was created with (`NAME~ID`; `~` is
        never in a name)."""
        return self.name if self._uid is None else f"{self.name}~{self._uid}"
