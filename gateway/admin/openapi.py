"""The admin API's routes in the gateway's OpenAPI document (gateway/admin/api.py): tenants,
their keys and usage, cache entries, backends and the reports, each answered with a model of
gateway/admin/models.py. Part of the document gateway/openapi.py serves, which passes its
builders of error answers, answers and references to the models' schemas."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import BaseModel

from gateway.admin import models as m

Schema = dict[str, Any]
Errors = Callable[..., Schema]  # statuses -> their documented error answers
Ok = Callable[[Schema, str, int], Schema]  # (schema, description, status) -> the answer
Ref = Callable[[type[BaseModel]], Schema]  # a model -> a reference to its schema
Op = Callable[..., Schema]  # (summary, answer, status=, body=, errors=) -> one operation
_JSON = "application/json"

# A cache entry's id (a hit's x-cache-key), as the admin API and /v1/cache/feedback take it.
ENTRY_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}


def admin_paths(errors: Errors, ok: Ok, ref: Ref) -> Schema:
    op: Op = partial(_admin_op, errors, ok, ref)
    tenant = _param("name", {"type": "string", "pattern": _name_pattern()})
    key = _param("key_id", {"type": "string", "minLength": 1})
    return {
        "/admin/tenants": {
            "get": op("List tenants (configured and created here)", m.TenantList),
            "post": op(
                "Create a tenant", m.TenantInfo, status=201, body=m.TenantCreate, errors=(409,)
            ),
        },
        "/admin/tenants/{name}": {
            "parameters": tenant,
            "get": op("Read a tenant", m.TenantInfo),
            "patch": op("Update a tenant", m.TenantInfo, body=m.TenantPatch),
            "delete": op("Delete a tenant and revoke its stored keys", m.TenantDeleted),
        },
        "/admin/tenants/{name}/keys": {
            "parameters": tenant,
            "get": op("List a tenant's keys (ids, never keys)", m.KeyList),
            "post": op("Create a key; shown once", m.KeyCreated, status=201),
        },
        "/admin/keys/{key_id}": {
            "parameters": key,
            "delete": op("Revoke a key", m.KeyDeleted, errors=(409,)),
        },
        "/admin/tenants/{name}/usage": {
            "parameters": tenant,
            "get": op("What the quota counters know of a tenant", m.TenantUsage),
        },
        "/admin/tenants/{name}/cache/flush": {
            "parameters": tenant,
            "post": op("Drop a tenant's (or its cache group's) cache entries", m.CacheFlushed),
        },
        "/admin/cache/entries/{entry_id}": {
            "parameters": _param("entry_id", ENTRY_ID),
            "delete": op(
                "Delete one cache entry (a hit's x-cache-key) on every replica",
                m.CacheEntryDeleted,
            ),
        },
        "/admin/backends": {
            "get": op(
                "Each backend's learned capacity: limits, engine metrics, desired replicas",
                m.BackendList,
            )
        },
        "/admin/backends/{name}/warm": {
            "parameters": _param("name", {"type": "string", "minLength": 1}),
            "post": _warm_op(op),
        },
        "/admin/reports/cache": {
            "get": _report_op(op, "Cache report: hit rates, savings, latency")
        },
        "/admin/reports/cold-start": {
            "get": _report_op(op, "Cold-start report: starts, phases, waits")
        },
    }


def _admin_op(
    errors_of: Errors,
    ok_of: Ok,
    ref: Ref,
    summary: str,
    answer: type[BaseModel],
    *,
    status: int = 200,
    body: type[BaseModel] | None = None,
    errors: tuple[int, ...] = (),
) -> Schema:
    base = (401, 403, 404, 503)
    with_body = (400, 413) if body is not None else ()
    op: dict[str, Any] = {
        "summary": summary,
        "tags": ["admin"],
        "security": [{"adminKey": []}],
        "responses": {
            **ok_of(ref(answer), summary, status),
            **errors_of(*sorted({*base, *with_body, *errors})),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {_JSON: {"schema": ref(body)}}}
    return op


def _param(name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": schema}]


def _warm_op(admin_op: Op) -> Schema:
    op = admin_op(
        "Start replicas of a process or kubernetes backend now and keep them for a while "
        "(400 for a backend with a fixed address)",
        m.BackendWarmed,
        status=202,
        body=m.WarmOrder,
    )
    op["requestBody"]["required"] = False  # no body: one replica, for the backend's idle_s
    return op


def _report_op(admin_op: Op, summary: str) -> Schema:
    op = admin_op(summary, m.Report, errors=(400,))
    moment = {
        "anyOf": [
            {"type": "string", "pattern": m.DURATION},
            {"type": "string", "pattern": m.ISO_TIME},
        ]
    }
    described: dict[str, tuple[str, dict[str, Any]]] = {
        "since": (
            "Start: a duration back from now (`15m`, `7d`) or ISO 8601; the hour before `until`.",
            moment,
        ),
        "until": ("End, in the same forms; now. 400 if not after `since`.", moment),
        "tenant": ("Only this tenant.", {"type": "string"}),
        "model": ("Only this model.", {"type": "string"}),
        "bucket": (
            "Width of the over-time buckets, a duration; 5m.",
            {"type": "string", "pattern": m.DURATION},
        ),
    }
    op["parameters"] = [
        {"name": name, "in": "query", "required": False, "description": text, "schema": schema}
        for name, (text, schema) in described.items()
    ]
    return op


def _name_pattern() -> str:
    pattern = m.TenantCreate.model_json_schema()["properties"]["name"]["pattern"]
    return str(pattern)
