"""The admin API (`/admin/...`): tenants, their keys, usage, cache, reports and backend
pre-warming, for operators.

Every route needs an admin key (gateway/tenancy/auth.py: tenant keys get 403, no or unknown key
401; with no admin key configured the API answers 404). Bodies are JSON, validated by the
models of gateway/admin/models.py; errors use OpenAI's shape. Tenants written here live in
the state store and reach every replica's live traffic within about a second
(gateway/tenancy/tenant_store.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cache.entry import is_entry_id
from cache.semantic import AnswerCache
from cache.store import CacheUnavailable
from gateway.accesslog import AccessLog
from gateway.admin.backends import Prewarmer
from gateway.admin.bodies import bad_request, parse_body
from gateway.admin.models import (
    DURATION,
    ISO_TIME,
    BackendList,
    BackendWarmed,
    BudgetUsage,
    CacheEntryDeleted,
    CacheFlushed,
    KeyCreated,
    KeyDeleted,
    KeyInfo,
    KeyList,
    RateUsage,
    Report,
    SpendUsage,
    TenantCreate,
    TenantDeleted,
    TenantInfo,
    TenantList,
    TenantPatch,
    TenantUsage,
    WarmOrder,
)
from gateway.admin.reports import (
    QueryError,
    ReportKind,
    ReportQuery,
    ReportUnavailable,
    parse_time,
)
from gateway.errors import (
    BadRequest,
    CacheEntryNotFound,
    GatewayError,
    StateUnavailable,
    as_error,
)
from gateway.errors import request_id as new_request_id
from gateway.settings import Tenant, TenantProfile
from gateway.tenancy.auth import AdminAuthenticator, Principal
from gateway.tenancy.keys import create_key
from gateway.tenancy.quotas import QuotaEnforcer, calendar, rate_view
from gateway.tenancy.state import StateStore, StateStoreError
from gateway.tenancy.tenant_store import TenantDirectory
from gateway.tenancy.tenants import Source

_NULLABLE = frozenset({"cache_group", "cache_error_bound"})  # null sets these to "none"
Answer = tuple[int, BaseModel]
_SPAN = (re.compile(DURATION),)
_MOMENT = (*_SPAN, re.compile(ISO_TIME))
ReportSource = Callable[[ReportKind, ReportQuery], Awaitable[dict[str, Any]]]


class TenantNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "tenant_not_found"


class KeyNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "key_not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


@dataclass
class AdminApi:
    guard: AdminAuthenticator
    directory: TenantDirectory
    store: StateStore
    quotas: QuotaEnforcer
    cache: AnswerCache
    config_keys: dict[str, Principal]  # key hash -> principal, declared in config
    access: AccessLog
    reports: ReportSource  # gateway.admin.reports.build_report, with the settings bound
    backends: Callable[[], list[dict[str, Any]]] = list  # each backend's capacity view
    on_entry_deleted: Callable[[str], None] = lambda tenant: None  # counts it (metrics)
    prewarm: Callable[[str, WarmOrder], BackendWarmed] = field(  # gateway/admin/backends.py
        default_factory=lambda: Prewarmer({}, {})
    )

    async def handle(
        self, request: Request, action: Callable[[Request], Awaitable[Answer]]
    ) -> Response:
        request_id = new_request_id()
        started = time.perf_counter()
        try:
            await self.guard.authenticate(request.headers.get("authorization"))
            status, body = await action(request)
        except Exception as exc:
            error = _as_error(exc, request_id)
            self._log(request, request_id, started, error.status, error.code or error.type)
            return error.to_response(request_id)
        self._log(request, request_id, started, status, None)
        headers = {"x-request-id": request_id}
        return Response(body.model_dump_json(), status, headers, media_type="application/json")

    def _log(
        self, request: Request, request_id: str, started: float, status: int, error: str | None
    ) -> None:
        seconds = time.perf_counter() - started
        self.access.write(
            request_id, request.method, request.url.path, None, None, status, seconds, error
        )

    # --- tenants ---------------------------------------------------------------------

    async def list_tenants(self, request: Request) -> Answer:
        await self.directory.refresh()
        data = [self._info(t, source) for t, source in self.directory.catalog.listing()]
        return 200, TenantList(data=data)

    async def create_tenant(self, request: Request) -> Answer:
        profile = await parse_body(request, TenantCreate)
        await self.directory.refresh()
        if self.directory.catalog.find(profile.name) is not None:
            raise Conflict(
                f"A tenant named '{profile.name}' exists already.",
                param="name",
                code="tenant_exists",
            )
        await self.directory.save(TenantProfile(**profile.model_dump()), created=True)
        return 201, self._info_of(profile.name)

    async def get_tenant(self, request: Request) -> Answer:
        name = await self._tenant_name(request)
        return 200, self._info_of(name)

    async def update_tenant(self, request: Request) -> Answer:
        patch = await parse_body(request, TenantPatch)
        name = await self._tenant_name(request)
        current = self.directory.catalog.tenant(name).model_dump(exclude={"keys"})
        given = patch.model_dump(exclude_unset=True, exclude={"quotas"})
        # null keeps a field as it is, except where null is a setting of its own: no cache
        # group, no error bound.
        changes = {k: v for k, v in given.items() if v is not None or k in _NULLABLE}
        if patch.quotas is not None:
            changes["quotas"] = {**current["quotas"], **patch.quotas.model_dump(exclude_unset=True)}
        try:
            updated = TenantProfile.model_validate({**current, **changes})
        except ValidationError as exc:
            raise bad_request(exc) from exc
        await self.directory.save(updated)
        return 200, self._info_of(name)

    async def delete_tenant(self, request: Request) -> Answer:
        name = await self._tenant_name(request)
        revoked = 0
        for record in await self.store.list_keys():
            if record.tenant == name and await self.store.revoke_key(record.key_id):
                revoked += 1
        await self.directory.remove(name)
        return 200, TenantDeleted(name=name, keys_revoked=revoked)

    # --- keys ------------------------------------------------------------------------

    async def create_key(self, request: Request) -> Answer:
        name = await self._tenant_name(request)
        key, record = await create_key(self.store, name)
        return 201, KeyCreated(id=record.key_id, tenant=name, created_at=record.created_at, key=key)

    async def list_keys(self, request: Request) -> Answer:
        name = await self._tenant_name(request)
        declared = [
            KeyInfo(id=p.key_id, tenant=name, created_at=None, source="config")
            for p in self.config_keys.values()
            if p.tenant == name
        ]
        stored = [
            KeyInfo(id=r.key_id, tenant=name, created_at=r.created_at, source="stored")
            for r in await self.store.list_keys()
            if r.tenant == name
        ]
        return 200, KeyList(data=declared + stored)

    async def revoke_key(self, request: Request) -> Answer:
        key_id = str(request.path_params["key_id"])
        if any(p.key_id == key_id for p in self.config_keys.values()):
            raise Conflict(
                f"The key '{key_id}' is declared in the configuration; remove it there.",
                code="key_in_config",
            )
        if not await self.store.revoke_key(key_id):
            raise KeyNotFound(f"No key with id '{key_id}'.")
        return 200, KeyDeleted(id=key_id)

    # --- usage and cache -------------------------------------------------------------

    async def usage(self, request: Request) -> Answer:
        tenant = self.directory.catalog.tenant(await self._tenant_name(request))
        standing = await self.quotas.standing(tenant.owner)
        q, cal = tenant.quotas, calendar(time.time())

        def rate(filled_s: float, limit: int | None) -> RateUsage | None:
            if limit is None:
                return None
            view = rate_view(filled_s, limit)
            return RateUsage(limit=limit, remaining=view.remaining, reset_s=round(filled_s, 3))

        def budget(used: int, limit: int | None, left_s: float) -> BudgetUsage:
            remaining = None if limit is None else max(0, limit - used)
            return BudgetUsage(
                used=used, limit=limit, remaining=remaining, reset_s=round(left_s, 3)
            )

        return 200, TenantUsage(
            tenant=tenant.name,
            in_flight=standing.in_flight,
            max_concurrent=q.max_concurrent,
            requests_per_minute=rate(standing.requests_filled_s, q.requests_per_minute),
            tokens_per_minute=rate(standing.tokens_filled_s, q.tokens_per_minute),
            tokens_today=budget(standing.day_used, q.tokens_per_day, cal.day_left_s),
            tokens_this_month=budget(standing.month_used, q.tokens_per_month, cal.month_left_s),
            usd_today=_spend(standing.day_cost, q.usd_per_day, cal.day_left_s),
            usd_this_month=_spend(standing.month_cost, q.usd_per_month, cal.month_left_s),
        )

    async def flush_cache(self, request: Request) -> Answer:
        name = await self._tenant_name(request)
        scope, members = self.directory.catalog.cache_scope(name)
        namespaces, removed = await self.cache.flush(members)
        return 200, CacheFlushed(
            tenant=name, scope=scope, tenants=members, namespaces=namespaces, removed=removed
        )

    async def delete_cache_entry(self, request: Request) -> Answer:
        entry_id = str(request.path_params["entry_id"])
        entry = await self.cache.delete(entry_id) if is_entry_id(entry_id) else None
        if entry is None:
            raise CacheEntryNotFound(f"No cache entry with id '{entry_id}'.")
        self.on_entry_deleted(entry.tenant)
        return 200, CacheEntryDeleted(id=entry_id, tenant=entry.tenant, model=entry.model)

    # --- backends ----------------------------------------------------------------------

    async def list_backends(self, request: Request) -> Answer:
        return 200, BackendList(data=self.backends())

    async def warm_backend(self, request: Request) -> Answer:
        order = await parse_body(request, WarmOrder, empty=b"{}")
        return 202, self.prewarm(str(request.path_params["name"]), order)

    # --- reports -----------------------------------------------------------------------

    async def cache_report(self, request: Request) -> Answer:
        return 200, await self._report(request, "cache")

    async def cold_start_report(self, request: Request) -> Answer:
        return 200, await self._report(request, "cold_start")

    async def _report(self, request: Request, kind: ReportKind) -> Report:
        p = request.query_params
        for name, forms in (("since", _MOMENT), ("until", _MOMENT), ("bucket", _SPAN)):
            value = p.get(name)
            if value is not None and not any(form.fullmatch(value) for form in forms):
                raise BadRequest(
                    f"Invalid '{name}': use a duration such as 15m or 7d"
                    + (", or an ISO 8601 time." if forms is _MOMENT else "."),
                    param=name,
                )
        try:
            query = _report_query(
                p.get("since"), p.get("until"), p.get("tenant"), p.get("model"), p.get("bucket")
            )
        except (QueryError, ValueError, OverflowError) as exc:
            raise BadRequest(f"Invalid report range: {exc}.") from exc
        try:
            return Report(await self.reports(kind, query))
        except ReportUnavailable as exc:
            raise StateUnavailable(
                "The report's events cannot be read now; try again shortly.", retry_after=1
            ) from exc

    # --- helpers ---------------------------------------------------------------------

    async def _tenant_name(self, request: Request) -> str:
        """The path's tenant, after reloading the tenants (other replicas may have changed them)."""
        name = str(request.path_params["name"])
        await self.directory.refresh()
        if self.directory.catalog.find(name) is None:
            raise TenantNotFound(f"No tenant named '{name}'.")
        return name

    def _info_of(self, name: str) -> TenantInfo:
        for tenant, source in self.directory.catalog.listing():
            if tenant.name == name:
                return self._info(tenant, source)
        raise TenantNotFound(f"No tenant named '{name}'.")

    def _info(self, tenant: Tenant, source: Source) -> TenantInfo:
        fields: dict[str, Any] = tenant.model_dump(exclude={"keys"})
        updated = self.directory.updated_at(tenant.name) if source == "admin" else None
        return TenantInfo(**fields, source=source, updated_at=updated)


# (path, method, handler)
ROUTES: list[tuple[str, str, Callable[[AdminApi, Request], Awaitable[Answer]]]] = [
    ("/admin/tenants", "GET", AdminApi.list_tenants),
    ("/admin/tenants", "POST", AdminApi.create_tenant),
    ("/admin/tenants/{name}", "GET", AdminApi.get_tenant),
    ("/admin/tenants/{name}", "PATCH", AdminApi.update_tenant),
    ("/admin/tenants/{name}", "DELETE", AdminApi.delete_tenant),
    ("/admin/tenants/{name}/keys", "POST", AdminApi.create_key),
    ("/admin/tenants/{name}/keys", "GET", AdminApi.list_keys),
    ("/admin/keys/{key_id}", "DELETE", AdminApi.revoke_key),
    ("/admin/tenants/{name}/usage", "GET", AdminApi.usage),
    ("/admin/tenants/{name}/cache/flush", "POST", AdminApi.flush_cache),
    ("/admin/cache/entries/{entry_id}", "DELETE", AdminApi.delete_cache_entry),
    ("/admin/backends", "GET", AdminApi.list_backends),
    ("/admin/backends/{name}/warm", "POST", AdminApi.warm_backend),
    ("/admin/reports/cache", "GET", AdminApi.cache_report),
    ("/admin/reports/cold-start", "GET", AdminApi.cold_start_report),
]


def admin_routes(api: Callable[[], AdminApi]) -> list[Route]:
    """Starlette routes; `api` gives the AdminApi the lifespan built."""
    by_path: dict[str, dict[str, Callable[[AdminApi, Request], Awaitable[Answer]]]] = {}
    for path, method, handler in ROUTES:
        by_path.setdefault(path, {})[method] = handler

    def endpoint(
        handlers: dict[str, Callable[[AdminApi, Request], Awaitable[Answer]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            admin = api()
            handler = handlers[request.method]
            return await admin.handle(request, lambda r: handler(admin, r))

        return serve

    return [Route(path, endpoint(h), methods=list(h)) for path, h in by_path.items()]


def _report_query(
    since: str | None, until: str | None, tenant: str | None, model: str | None, bucket: str | None
) -> ReportQuery:
    """The range asked for; with `until` alone, the hour before it (not the last hour)."""
    if since is None and until is not None:
        end = parse_time(until, datetime.now(UTC))
        return ReportQuery.parse("1h", None, tenant, model, bucket, now=end)
    return ReportQuery.parse(since, until, tenant, model, bucket)


def _as_error(exc: Exception, request_id: str) -> GatewayError:
    """The state and cache stores' errors enter here: translated, then answered as any."""
    if isinstance(exc, StateStoreError):
        return StateUnavailable("The state store is unreachable; try again shortly.", retry_after=1)
    if isinstance(exc, CacheUnavailable):
        return StateUnavailable("The cache store is unreachable; try again shortly.", retry_after=1)
    return as_error(exc, request_id)


def _spend(used_micro: int, limit_usd: float | None, left_s: float) -> SpendUsage | None:
    if limit_usd is None:
        return None
    used = used_micro / 1e6
    return SpendUsage(
        used_usd=round(used, 6),
        limit_usd=limit_usd,
        remaining_usd=round(max(0.0, limit_usd - used), 6),
        reset_s=round(left_s, 3),
    )
