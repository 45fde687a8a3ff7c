"""The OpenAPI 3.1 document served at `/openapi.json`: the OpenAI routes the gateway
serves and the admin API, with schemas generated from the same pydantic models that
validate the bodies (gateway/openai_schema.py, gateway/admin/models.py).

Here: the document's frame, the OpenAI routes, the operational ones (health, metrics, this
document), and the builders of answers and errors (a description per error status) that
the other parts take: the dialects' routes (gateway/dialects/openapi.py), Files and Batches
(gateway/batches/openapi.py) and the admin API (gateway/admin/openapi.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from gateway.admin import models as m
from gateway.admin.openapi import ENTRY_ID, admin_paths
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
            **admin_paths(_errors, _ok, _ref),
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


def _feedback_path() -> dict[str, Any]:
    body = {
        "type": "object",
        "required": ["id"],
        "properties": {"id": {**ENTRY_ID, "description": "The bad hit's x-cache-key."}},
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
