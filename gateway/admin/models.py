"""Bodies of the admin API: what it accepts (validated) and answers (and /openapi.json
describes, from these same models)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, StringConstraints

from gateway.settings import ErrorBound, Name, Priority, Quotas, TenantProfile

# Created through the API, a tenant's name must fit in one URL path segment.
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]


# The report query's forms (gateway/admin/reports/query.py), as /openapi.json states them: a
# duration back from now (under 1000 units), or an ISO 8601 time (days to 28, years
# 2000-2099: every match is a date the parser takes, after the events' epoch).
DURATION = r"^[1-9][0-9]{0,2}(\.[0-9]{1,3})?[smhdw]$"
ISO_TIME = (
    r"^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9])?$"
)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TenantCreate(TenantProfile):
    """A new tenant: the fields of `tenants[]` in the configuration, minus `keys`."""

    name: TenantName


class TenantPatch(BaseModel):
    """Fields to change; those left out or null keep their value, except `cache_group: null`,
    which leaves the group, and `cache_error_bound: null`, which turns the error-bounded mode
    off. `quotas` merges field by field (a null limit is unlimited)."""

    model_config = ConfigDict(extra="forbid")
    weight: float | None = Field(default=None, gt=0)
    priority: Priority | None = None
    priority_header: bool | None = None
    models: list[str] | None = None
    quotas: Quotas | None = None
    cache_group: Name | None = None
    cache_error_bound: ErrorBound | None = None


class TenantInfo(TenantProfile):
    object: Literal["tenant"] = "tenant"
    source: Literal["config", "admin"]  # admin: created or changed through this API
    updated_at: float | None = None  # unix seconds of the last admin change


class TenantList(_Out):
    object: Literal["list"] = "list"
    data: list[TenantInfo]


class TenantDeleted(_Out):
    object: Literal["tenant"] = "tenant"
    name: str
    deleted: Literal[True] = True
    keys_revoked: int


class KeyInfo(_Out):
    object: Literal["api_key"] = "api_key"
    id: str
    tenant: str
    created_at: float | None  # None: declared in the configuration
    # config: declared in the YAML file; stored: made by the API or the CLI (state store)
    source: Literal["config", "stored"]


class KeyCreated(_Out):
    object: Literal["api_key"] = "api_key"
    id: str
    tenant: str
    created_at: float
    key: str  # shown once; only its SHA-256 is stored


class KeyList(_Out):
    object: Literal["list"] = "list"
    data: list[KeyInfo]


class KeyDeleted(_Out):
    object: Literal["api_key"] = "api_key"
    id: str
    deleted: Literal[True] = True


class RateUsage(_Out):
    limit: int
    remaining: int
    reset_s: float  # until the bucket is empty again


class BudgetUsage(_Out):
    used: int
    limit: int | None
    remaining: int | None
    reset_s: float  # until the UTC day / month ends


class SpendUsage(_Out):
    used_usd: float  # charged at `pricing`'s prices, from the engine's usage
    limit_usd: float
    remaining_usd: float
    reset_s: float  # until the UTC day / month ends


class TenantUsage(_Out):
    object: Literal["tenant.usage"] = "tenant.usage"
    tenant: str
    in_flight: int
    max_concurrent: int | None
    requests_per_minute: RateUsage | None
    tokens_per_minute: RateUsage | None
    tokens_today: BudgetUsage
    tokens_this_month: BudgetUsage
    usd_today: SpendUsage | None = None  # None: no spend budget for the period
    usd_this_month: SpendUsage | None = None


class CacheFlushed(_Out):
    object: Literal["cache.flush"] = "cache.flush"
    tenant: str
    scope: str  # tenant:NAME, or group:NAME when the tenant shares a cache group
    tenants: list[str]  # whose entries were dropped
    namespaces: int
    removed: int  # entries


class CacheEntryDeleted(_Out):
    object: Literal["cache.entry.deleted"] = "cache.entry.deleted"
    id: str  # the entry's id: a hit's x-cache-key
    tenant: str  # the tenant it was stored for
    model: str
    deleted: Literal[True] = True


class Report(RootModel[dict[str, Any]]):
    """A report as `gateway report --format json` prints it (gateway/admin/reports)."""


class BackendList(_Out):
    """`GET /admin/backends`: each backend's learned capacity (see `Pool.view`)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]


class WarmOrder(BaseModel):
    """`POST /admin/backends/{name}/warm`: keep at least `replicas` ready for `hold_s` seconds
    from now (default: the backend's `scaling.idle_s`), starting them now; an empty body is
    `{}`."""

    model_config = ConfigDict(extra="forbid")
    replicas: int = Field(default=1, ge=1, le=1024)
    hold_s: float | None = Field(default=None, gt=0, le=7 * 86400)


class BackendWarmed(_Out):
    object: Literal["backend.warm"] = "backend.warm"
    backend: str
    replicas: int  # the floor now held
    hold_s: float
    until: float  # unix seconds when the floor lapses; then the idle rules apply again
    ready: int  # replicas ready now
    target: int  # replicas the manager is bringing the backend to
    reason: str  # the scaling decision, as in GET /admin/backends
    failure: str | None  # the last start failed: none is started until its retry delay ends


class ErrorDetail(_Out):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Out):
    error: ErrorDetail
