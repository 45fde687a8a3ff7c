"""The Files and Batch routes in the gateway's OpenAPI document (gateway/openapi.py builds
the whole of it and hands in its helpers for answers and errors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.batches.lines import ENDPOINTS
from gateway.batches.models import STATUSES

Schema = dict[str, Any]
Errors = Callable[..., Schema]  # statuses -> their documented error answers
Ok = Callable[[Schema, str], Schema]  # (schema, description) -> the 200 answer

_INT, _STR = {"type": "integer"}, {"type": "string"}
_NULL_INT, _NULL_STR = {"type": ["integer", "null"]}, {"type": ["string", "null"]}
FILE: Schema = {
    "type": "object",
    "description": "OpenAI's File object.",
    "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
    "properties": {
        "id": _STR,
        "object": {"const": "file"},
        "bytes": _INT,
        "created_at": _INT,
        "filename": _STR,
        "purpose": {"enum": ["batch", "batch_output"]},
        "status": {"const": "processed"},
        "expires_at": _NULL_INT,
        "status_details": _NULL_STR,
    },
}
_COUNTS = {
    "type": "object",
    "required": ["total", "completed", "failed"],
    "properties": {"total": _INT, "completed": _INT, "failed": _INT},
}
BATCH: Schema = {
    "type": "object",
    "description": "OpenAI's Batch object.",
    "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status"],
    "properties": {
        "id": _STR,
        "object": {"const": "batch"},
        "endpoint": {"enum": list(ENDPOINTS)},
        "input_file_id": _STR,
        "completion_window": _STR,
        "status": {"enum": list(STATUSES)},
        "created_at": _INT,
        "expires_at": _INT,
        "request_counts": _COUNTS,
        "output_file_id": _NULL_STR,
        "error_file_id": _NULL_STR,
        "errors": {"type": ["object", "null"]},
        "metadata": {"type": ["object", "null"], "additionalProperties": _STR},
        "model": _NULL_STR,
        "usage": {"type": ["object", "null"]},
        **{
            f"{when}_at": _NULL_INT
            for when in (
                "in_progress",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
    },
}


def _listing(item: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": _NULL_STR,
            "last_id": _NULL_STR,
            "has_more": {"type": "boolean"},
        },
    }


def _query(name: str, schema: Schema) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _path(name: str) -> list[Schema]:
    return [{"name": name, "in": "path", "required": True, "schema": {**_STR, "minLength": 1}}]


def batch_paths(errors: Errors, ok: Ok) -> dict[str, Any]:
    files, batches = _files_paths(errors, ok), _batches_paths(errors, ok)
    return {**files, **batches}


def _op(summary: str, responses: Schema, **extra: Any) -> Schema:
    return {
        "summary": summary,
        "tags": ["batches"],
        "security": [{"tenantKey": []}],
        "responses": responses,
        **extra,
    }


def _files_paths(errors: Errors, ok: Ok) -> dict[str, Any]:
    upload = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {"file": {**_STR, "format": "binary"}, "purpose": {"const": "batch"}},
    }
    deleted = {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {"id": _STR, "object": {"const": "file"}, "deleted": {"const": True}},
    }
    binary = {"application/octet-stream": {"schema": {**_STR, "format": "binary"}}}
    content = {"200": {"description": "The file's bytes (JSON lines).", "content": binary}}
    query = [
        _query("purpose", _STR),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}),
        _query("after", _STR),
        _query("order", {"enum": ["asc", "desc"]}),
    ]
    form = {"required": True, "content": {"multipart/form-data": {"schema": upload}}}
    summary = "Upload a batch input file (JSON lines, checked line by line)"
    return {
        "/v1/files": {
            "post": _op(
                summary,
                {**ok(FILE, "The file."), **errors(400, 401, 408, 413, 503)},
                requestBody=form,
            ),
            "get": _op(
                "The tenant's files",
                {**ok(_listing(FILE), "The files."), **errors(400, 401, 503)},
                parameters=query,
            ),
        },
        "/v1/files/{file_id}": {
            "parameters": _path("file_id"),
            "get": _op("A file's record", {**ok(FILE, "The file."), **errors(401, 404, 503)}),
            "delete": _op(
                "Delete a file (not the input of a batch still running)",
                {**ok(deleted, "Deleted."), **errors(400, 401, 404, 503)},
            ),
        },
        "/v1/files/{file_id}/content": {
            "parameters": _path("file_id"),
            "get": _op("A file's bytes", {**content, **errors(401, 404, 503)}),
        },
    }


def _batches_paths(errors: Errors, ok: Ok) -> dict[str, Any]:
    create = {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": _STR,
            "endpoint": {"enum": list(ENDPOINTS)},
            "completion_window": _STR,
            "metadata": {"type": ["object", "null"], "additionalProperties": _STR},
        },
    }
    query = [
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
        _query("after", _STR),
    ]
    body = {"required": True, "content": {"application/json": {"schema": create}}}
    return {
        "/v1/batches": {
            "post": _op(
                "Create a batch job over an uploaded file",
                {**ok(BATCH, "The batch."), **errors(400, 401, 404, 408, 413, 503)},
                requestBody=body,
            ),
            "get": _op(
                "The tenant's batches, newest first",
                {**ok(_listing(BATCH), "The batches."), **errors(400, 401, 503)},
                parameters=query,
            ),
        },
        "/v1/batches/{batch_id}": {
            "parameters": _path("batch_id"),
            "get": _op(
                "A batch, with its live request counts",
                {**ok(BATCH, "The batch."), **errors(401, 404, 503)},
            ),
        },
        "/v1/batches/{batch_id}/cancel": {
            "parameters": _path("batch_id"),
            "post": _op(
                "Cancel a batch: lines in flight finish, no more start",
                {**ok(BATCH, "The batch."), **errors(401, 404, 409, 503)},
            ),
        },
    }
