"""The OpenAPI 3.1 document served at `/openapi.json`: the OpenAI routes the gateway
serves and the admin API, with schemas generated from the same pydantic models that
validate the bodies (gateway/openai_schema.py, gateway/admin/models.py).

Over 400 lines: most of it is the document's own text (a description per route and per
error status), which reads best in one place, in the order the document lists it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from gateway.admin import models as m
from gateway.batches.openapi import batch_paths
from gateway.dialects.openapi import dialect_paths
from gateway.openai_schema import ChatRequest, CompletionRequest, EmbeddingRequest

_REF = "#/components/schemas/{model}"
_ERROR = {"$ref": "#/components/schemas/ErrorBody"}
_JSON = "application/json"

_STATUS_TEXT = {
    400: "Bad request: the body is not JSON, or a field is missing or invalid.",
    401: "Missing, malformed or unknown API key.",
    403: "The key may not do this (a model the tenant may not use; a tenant key on /admin).",
    404: "Unknown model, tenant, key, cache entry, backend or route (or the admin API is off).",
    408: "The request body did not arrive in time (code request_timeout); the connection closes.",
    409: (
        "Conflicts with what exists (a tenant of that name; a key declared in config; "
        "a batch that is over, to cancel)."
    ),
    413: "The request body is too large.",
    429: "A quota of the tenant is exhausted (see Retry-After and x-ratelimit-*).",
    502: "The backend failed (refused, reset, or answered nonsense).",
    503: (
        "State store unreachable, backend unavailable, load shed, or a backend whose start "
        "outlasts the request's deadline (see Retry-After)."
    ),
    504: "The backend did not answer in time, or not before the request's deadline.",
}

_HEADERS = {
    "x-request-id": {
        "description": "The request's id (the client's, if sane).",
        "schema": {"type": "string"},
    },
}
_RETRY = {
    **_HEADERS,
    "retry-after": {"description": "Seconds to wait.", "schema": {"type": "string"}},
}


def openapi_document() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (ChatRequest, "validation"),
        (CompletionRequest, "validation"),
        (EmbeddingRequest, "validation"),
        (m.TenantCreate, "validation"),
        (m.TenantPatch, "validation"),
        (m.WarmOrder, "validation"),
        *((model, "serialization") for model in _OUTPUTS),
    ]
    _, defs = models_json_schema(models, ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "inference-gateway",
            "version": "1",
            "description": "OpenAI-compatible gateway with a semantic cache, and its admin API.",
        },
        "paths": {
            **_openai_paths(),
            **dialect_paths(_errors, _ok),
            **batch_paths(_errors, _ok),
            **_admin_paths(),
            **_operational_paths(),
        },
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {
                "tenantKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant's API key.",
                },
                "adminKey": {"type": "http", "scheme": "bearer", "description": "An admin key."},
                "anthropicKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "A tenant's API key, as Anthropic's clients send it.",
                },
                "operatorKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "An operator key (admin.operator_keys or $GATEWAY_OPERATOR_KEY), as a "
                        "Prometheus scraper holds, or an admin key."
                    ),
                },
            },
        },
    }


_OUTPUTS: list[type[BaseModel]] = [
    m.TenantInfo,
    m.TenantList,
    m.TenantDeleted,
    m.KeyCreated,
    m.KeyList,
    m.KeyDeleted,
    m.TenantUsage,
    m.CacheFlushed,
    m.CacheEntryDeleted,
    m.Report,
    m.BackendList,
    m.BackendWarmed,
    m.ErrorBody,
]


def _errors(*statuses: int, schema: dict[str, Any] = _ERROR) -> dict[str, Any]:
    """The documented error answers of `statuses`, in OpenAI's shape (or `schema`'s)."""
    return {
        str(status): {
            "description": _STATUS_TEXT[status],
            "headers": _RETRY if status in (429, 503) else _HEADERS,
            "content": {_JSON: {"schema": schema}},
        }
        for status in statuses
    }


def _ok(schema: dict[str, Any], description: str, status: int = 200) -> dict[str, Any]:
    return {
        str(status): {
            "description": description,
            "headers": _HEADERS,
            "content": {_JSON: {"schema": schema}},
        }
    }


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": _REF.format(model=model.__name__)}


_ANSWER = {
    "type": "object",
    "description": "The backend's answer, relayed unchanged (or replayed from the cache).",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "model": {"type": "string"},
        "choices": {"type": "array"},
        "data": {"type": "array"},
        "usage": {"type": "object"},
    },
}


_RELAYED = {
    "default": {
        "description": "Another status answered by the backend, relayed unchanged.",
        "content": {_JSON: {"schema": {}}},
    }
}

_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string"},
                },
            },
        },
    },
}


def _openai_post(model: type[BaseModel], summary: str, streams: bool) -> dict[str, Any]:
    """One OpenAI POST route: its request schema, the answer (SSE too when it `streams`),
    the gateway's errors and whatever else the backend answers."""
    content: dict[str, Any] = {_JSON: {"schema": _ANSWER}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    ok = {
        "200": {
            "description": "The answer (SSE when `stream` is true).",
            "headers": _HEADERS,
            "content": content,
        }
    }
    return {
        "post": {
            "summary": summary,
            "tags": ["openai"],
            "security": [{"tenantKey": []}],
            "requestBody": {"required": True, "content": {_JSON: {"schema": _ref(model)}}},
            "responses": {
                **ok,
                **_errors(400, 401, 403, 404, 408, 413, 429, 502, 503, 504),
                **_RELAYED,
            },
        }
    }


def _openai_paths() -> dict[str, Any]:
    return {
        "/v1/chat/completions": _openai_post(ChatRequest, "Create a chat completion", True),
        "/v1/completions": _openai_post(CompletionRequest, "Create a completion", True),
        "/v1/embeddings": _openai_post(EmbeddingRequest, "Create embeddings", False),
        "/v1/cache/feedback": _feedback_path(),
        "/v1/models": {
            "get": {
                "summary": "The models the caller's tenant may use",
                "tags": ["openai"],
                "security": [{"tenantKey": []}],
                "responses": {**_ok(_MODEL_LIST, "The models."), **_errors(401, 503)},
            }
        },
    }


_ENTRY_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}


def _feedback_path() -> dict[str, Any]:
    body = {
        "type": "object",
        "required": ["id"],
        "properties": {"id": {**_ENTRY_ID, "description": "The bad hit's x-cache-key."}},
    }
    deleted = {
        "type": "object",
        "required": ["object", "id", "deleted"],
        "properties": {
            "object": {"const": "cache.feedback"},
            "id": {"type": "string"},
            "deleted": {"const": True},
        },
    }
    return {
        "post": {
            "summary": "Report a cache hit as wrong: its entry is deleted on every replica",
            "tags": ["cache"],
            "security": [{"tenantKey": []}],
            "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
            "responses": {
                **_ok(deleted, "The entry is deleted."),
                **_errors(400, 401, 404, 408, 413, 503),
            },
        }
    }


def _admin_op(
    summary: str,
    answer: type[BaseModel],
    *,
    status: int = 200,
    body: type[BaseModel] | None = None,
    errors: tuple[int, ...] = (),
) -> dict[str, Any]:
    base = (401, 403, 404, 503)
    with_body = (400, 413) if body is not None else ()
    op: dict[str, Any] = {
        "summary": summary,
        "tags": ["admin"],
        "security": [{"adminKey": []}],
        "responses": {
            **_ok(_ref(answer), summary, status),
            **_errors(*sorted({*base, *with_body, *errors})),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {_JSON: {"schema": _ref(body)}}}
    return op


def _param(name: str, schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": schema}]


def _admin_paths() -> dict[str, Any]:
    tenant = _param("name", {"type": "string", "pattern": _name_pattern()})
    key = _param("key_id", {"type": "string", "minLength": 1})
    return {
        "/admin/tenants": {
            "get": _admin_op("List tenants (configured and created here)", m.TenantList),
            "post": _admin_op(
                "Create a tenant", m.TenantInfo, status=201, body=m.TenantCreate, errors=(409,)
            ),
        },
        "/admin/tenants/{name}": {
            "parameters": tenant,
            "get": _admin_op("Read a tenant", m.TenantInfo),
            "patch": _admin_op("Update a tenant", m.TenantInfo, body=m.TenantPatch),
            "delete": _admin_op("Delete a tenant and revoke its stored keys", m.TenantDeleted),
        },
        "/admin/tenants/{name}/keys": {
            "parameters": tenant,
            "get": _admin_op("List a tenant's keys (ids, never keys)", m.KeyList),
            "post": _admin_op("Create a key; shown once", m.KeyCreated, status=201),
        },
        "/admin/keys/{key_id}": {
            "parameters": key,
            "delete": _admin_op("Revoke a key", m.KeyDeleted, errors=(409,)),
        },
        "/admin/tenants/{name}/usage": {
            "parameters": tenant,
            "get": _admin_op("What the quota counters know of a tenant", m.TenantUsage),
        },
        "/admin/tenants/{name}/cache/flush": {
            "parameters": tenant,
            "post": _admin_op(
                "Drop a tenant's (or its cache group's) cache entries", m.CacheFlushed
            ),
        },
        "/admin/cache/entries/{entry_id}": {
            "parameters": _param("entry_id", _ENTRY_ID),
            "delete": _admin_op(
                "Delete one cache entry (a hit's x-cache-key) on every replica",
                m.CacheEntryDeleted,
            ),
        },
        "/admin/backends": {
            "get": _admin_op(
                "Each backend's learned capacity: limits, engine metrics, desired replicas",
                m.BackendList,
            )
        },
        "/admin/backends/{name}/warm": {
            "parameters": _param("name", {"type": "string", "minLength": 1}),
            "post": _warm_op(),
        },
        "/admin/reports/cache": {"get": _report_op("Cache report: hit rates, savings, latency")},
        "/admin/reports/cold-start": {
            "get": _report_op("Cold-start report: starts, phases, waits")
        },
    }


def _warm_op() -> dict[str, Any]:
    op = _admin_op(
        "Start replicas of a process or kubernetes backend now and keep them for a while "
        "(400 for a backend with a fixed address)",
        m.BackendWarmed,
        status=202,
        body=m.WarmOrder,
    )
    op["requestBody"]["required"] = False  # no body: one replica, for the backend's idle_s
    return op


def _report_op(summary: str) -> dict[str, Any]:
    op = _admin_op(summary, m.Report, errors=(400,))
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


def _operational_paths() -> dict[str, Any]:
    def get(
        summary: str, responses: dict[str, Any], security: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        return {
            "get": {
                "summary": summary,
                "tags": ["operations"],
                "security": security or [],
                "responses": responses,
            }
        }

    status = {
        "type": "object",
        "properties": {"status": {"type": "string"}},
        "required": ["status"],
    }
    return {
        "/healthz": get("The process is alive", _ok(status, "Alive.")),
        "/readyz": get(
            "Ready to serve: the status to anyone; with an operator key, the checks too "
            "(backends, replica URLs, learned capacity, state)",
            {
                "200": {"description": "Ready.", "content": {_JSON: {"schema": status}}},
                "503": {"description": "Not ready.", "content": {_JSON: {"schema": status}}},
            },
            [{}, {"operatorKey": []}],
        ),
        "/metrics": get(
            "Prometheus metrics (every tenant's traffic by name: an operator key only)",
            {
                "200": {
                    "description": "Exposition format.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": {
                    **_errors(401)["401"],
                    "description": "No operator key or admin key (code operator_key_required).",
                },
            },
            [{"operatorKey": []}],
        ),
        "/openapi.json": get(
            "This document",
            {
                "200": {
                    "description": "OpenAPI 3.1.",
                    "content": {_JSON: {"schema": {"type": "object"}}},
                }
            },
        ),
    }
