"""Admin request bodies in: read within a size limit, parsed as JSON, validated strictly by
a model of gateway/admin/models.py; what is wrong becomes a 400 naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway.errors import BadRequest, BodyTooLarge

MAX_BODY_BYTES = 64 * 1024
_Model = TypeVar("_Model", bound=BaseModel)


async def parse_body(request: Request, model: type[_Model], empty: bytes = b"null") -> _Model:
    """The body as `model`; an empty body reads as `empty` (`{}` where every field is optional)."""
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise BodyTooLarge(f"The request body exceeds {MAX_BODY_BYTES} bytes.")
    try:
        data = orjson.loads(raw or empty)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    try:
        # Strict: a JSON string is not a number or a boolean, as the schema says; but 2.0
        # is an integer in JSON Schema, so integral numbers are taken as integers.
        return model.model_validate(_integral(data), strict=True)
    except ValidationError as exc:
        raise bad_request(exc) from exc


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(item) for item in value]
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    return value


def bad_request(exc: ValidationError) -> BadRequest:
    error = exc.errors(include_url=False)[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "missing":
        return BadRequest(f"Missing required parameter: '{param}'.", param=param)
    where = f" for '{param}'" if param else ""
    return BadRequest(f"Invalid value{where}: {error['msg']}.", param=param)
