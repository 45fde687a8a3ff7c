"""A refused request body in OpenAI's words: the first thing wrong with it, with `param`
the offending field as OpenAI names it (`messages[0].content[1].text`) and OpenAI's code
(`invalid_type`, `invalid_value`, `missing_required_parameter`, `empty_string`,
`integer_below_min_value`...). Never pydantic's own wording or type names.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.errors import BadRequest

# How deeply a body's arrays and objects may nest. orjson reads up to 1024 levels but
# writes at most 255, and the gateway writes bodies again (a fallback's model, vLLM's
# priority, the cache): a body between the two would fail there, as a 500. Tool schemas,
# the deepest thing a real request holds, stay far below this.
MAX_JSON_DEPTH = 128


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or the 400 OpenAI answers for one that is not."""
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise too_deep() from exc
        raise unparsable(raw, str(exc)) from exc
    if not isinstance(fields, dict):
        raise not_an_object(fields)
    if nested_too_deep(raw, fields):
        raise too_deep()
    return fields


def too_deep() -> BadRequest:
    return BadRequest(
        f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep.",
        code="json_too_deep",
    )


def nested_too_deep(raw: bytes, value: dict[str, Any], limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` (parsed from `raw`) nests containers more than `limit` levels deep.
    A body with no more brackets than the limit cannot (the usual case, counted in C);
    otherwise the containers are walked a level at a time, without recursion."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    level: list[dict[str, Any] | list[Any]] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[dict[str, Any] | list[Any]] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below.extend(c for c in children if isinstance(c, dict | list))
        level = below
    return False


def not_an_object(fields: object) -> BadRequest:
    return BadRequest(_NOT_PARSED.format(f"a JSON object, but got {_kind_of(fields)}"))


_NOT_PARSED = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The API expects {}.)"
)


def unparsable(raw: bytes, reason: str) -> BadRequest:
    """Why a body is not JSON, in the client's terms: bytes that are not UTF-8, an escaped
    lone surrogate (valid to some parsers, not UTF-8), or where the JSON breaks."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRequest(
            "The request body is not valid UTF-8 JSON: the byte at offset "
            f"{exc.start} is not UTF-8. Send JSON encoded as UTF-8."
        )
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return BadRequest(
            "The request body is not valid UTF-8 JSON: a string holds an unpaired "
            "surrogate escape (\\ud800 to \\udfff), which no UTF-8 text can encode."
        )
    except (ValueError, RecursionError):
        pass
    return BadRequest(_NOT_PARSED.format(f"a JSON object, but what was sent is not JSON: {reason}"))


def bad_request(exc: ValidationError, body: dict[str, Any]) -> BadRequest:
    """The first thing wrong with the body, as OpenAI words it. A field of several types
    fails once per type; the error that got deepest into the value is the one meant (a
    part of an array of content parts, not "not a string"), and where all stop at the field
    itself, its type is wrong: the types it may have are listed together."""
    errors = [(_param(error, body), error) for error in exc.errors(include_url=False)]
    deepest = max(len(path) for path, _ in errors)
    at = [(path, error) for path, error in errors if len(path) == deepest]
    path, error = next(((p, e) for p, e in at if e["type"] not in _TYPES), at[0])
    param = _name(path)
    kind = error["type"]
    if kind == "int_type" and _huge_integer(error["input"]):
        return BadRequest(  # an integer JSON parsers hold only as a float (beyond 2^63)
            f"Invalid '{param}': integer above maximum value. Expected a value that fits in "
            f"64 bits, but got {int(error['input'])} instead.",
            param=param,
            code="integer_above_max_value",
        )
    if kind in _TYPES:
        expected = list(dict.fromkeys(_TYPES[e["type"]] for _, e in at if e["type"] in _TYPES))
        return _invalid_type(param, expected, error["input"])
    if kind == "missing":
        return _missing(param)
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        return _bad_tag(param, error)
    if kind == "literal_error":
        return _invalid_value(param, error["input"], error.get("ctx", {}).get("expected", ""))
    if kind == "assistant_content":
        param += ".content"
        why = " (an assistant message may go without it only with 'tool_calls' or 'function_call')"
        if not error.get("ctx", {}).get("given"):
            return _missing(param, why)
        return _invalid_type(param, ["a string", "an array"], None, why)
    if kind in ("string_too_short", "too_short"):
        what = "string" if kind == "string_too_short" else "array"
        return BadRequest(
            f"Invalid '{param}': empty {what}. Expected {_a(what)} with minimum length 1, "
            f"but got an empty {what} instead.",
            param=param,
            code=f"empty_{what}",
        )
    if kind == "string_too_long":
        return _too_long(param, error)
    bound = _BOUNDS.get(kind)
    if bound is not None:
        return _out_of_range(param, error, *bound)
    return BadRequest(f"Invalid value for '{param}': {error['msg']}.", param=param)


# Where a discriminated union stands in the body, the field that tells its members apart:
# pydantic puts the member's tag into the error's location, after the item's index.
_TAGGED = {"messages": "role", "content": "type"}


def _param(error: ErrorDetails, body: dict[str, Any]) -> list[str | int]:
    """The error's location as a path into the body, without pydantic's own steps (the
    members of a union: `str`, `list[...]`, a tag): those that do not index the value."""
    path: list[str | int] = []
    value: Any = body
    tag: str | None = None
    loc = error["loc"]
    for at, part in enumerate(loc):
        if isinstance(part, int):
            tag = None
            if isinstance(value, list) and 0 <= part < len(value):
                key = _TAGGED.get(str(path[-1])) if path else None
                value = value[part]
                tag = value.get(key) if key is not None and isinstance(value, dict) else None
            path.append(part)
        elif isinstance(value, dict) and part == tag:
            tag = None  # the member of a discriminated union, named by its tag
        elif isinstance(value, dict) and part in value:
            value, tag = value[part], None
            path.append(part)
        elif isinstance(value, dict) and error["type"] == "missing" and at == len(loc) - 1:
            path.append(part)
    return path


def _name(path: list[str | int]) -> str:
    """OpenAI's name for a field: `messages[0].content[1].text`."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else part
    return name


# pydantic's type errors -> what the field takes, in OpenAI's words
_TYPES = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a decimal",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
}


def _invalid_type(param: str, expected: list[str], given: object, why: str = "") -> BadRequest:
    """OpenAI's wording: "Invalid type for 'messages[0].content': expected a string or an
    array of content parts, but got null instead." with code `invalid_type`."""
    if param.endswith("content") and expected == ["a string", "an array"]:
        expected = ["a string", "an array of content parts"]
    wanted = " or ".join(expected) if len(expected) < 3 else _listed(expected, "or")
    return BadRequest(
        f"Invalid type for '{param}': expected {wanted}, but got {_kind_of(given)} instead{why}.",
        param=param,
        code="invalid_type",
    )


def _huge_integer(value: object) -> bool:
    return isinstance(value, float) and value.is_integer() and abs(value) >= 2.0**63


def _missing(param: str, why: str = "") -> BadRequest:
    return BadRequest(
        f"Missing required parameter: '{param}'{why}.",
        param=param,
        code="missing_required_parameter",
    )


def _bad_tag(param: str, error: ErrorDetails) -> BadRequest:
    """A message's `role` or a content part's `type`: missing, of the wrong type, unknown."""
    ctx = error.get("ctx", {})
    key = str(ctx.get("discriminator", "")).strip("'")
    if key.endswith("()"):  # a function tells the members apart (user content parts)
        key = "type"
    param = f"{param}.{key}" if param else key
    given = error["input"]
    if not isinstance(given, dict):
        return _invalid_type(param.rsplit(".", 1)[0], ["an object"], given)
    if key not in given:
        return _missing(param)
    if given[key] == "":
        return BadRequest(
            f"Invalid '{param}': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            param=param,
            code="empty_string",
        )
    if not isinstance(given[key], str):
        return _invalid_type(param, ["a string"], given[key])
    return _invalid_value(param, given[key], str(ctx.get("expected_tags", "")))


def _invalid_value(param: str, given: object, expected: str) -> BadRequest:
    """OpenAI's wording: "Invalid value: 'wizard'. Supported values are: 'system',
    'developer', ... and 'function'." with code `invalid_value`."""
    supported = _listed(re.findall(r"'([^']*)'", expected), "and", quote=True)
    shown = f"'{_clipped(given)}'" if isinstance(given, str) else _kind_of(given)
    return BadRequest(
        f"Invalid value for '{param}': {shown}. Supported values are: {supported}.",
        param=param,
        code="invalid_value",
    )


def _listed(items: list[str], last: str, *, quote: bool = False) -> str:
    shown = [f"'{item}'" if quote else item for item in items]
    if len(shown) < 2:
        return "".join(shown)
    return ", ".join(shown[:-1]) + f"{',' if len(shown) > 2 else ''} {last} {shown[-1]}"


def _kind_of(value: object) -> str:
    """What a JSON value is, in OpenAI's words: null, a string, an integer, an array..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _clipped(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


# pydantic's error type -> (the limit in its context, how OpenAI names it, its comparison)
_BOUNDS = {
    "greater_than_equal": ("ge", "below_min_value", "minimum value", ">="),
    "less_than_equal": ("le", "above_max_value", "maximum value", "<="),
}


def _too_long(param: str, error: ErrorDetails) -> BadRequest:
    """OpenAI's wording and code for a string over its field's maximum length."""
    limit = error.get("ctx", {}).get("max_length")
    return BadRequest(
        f"Invalid '{param}': string too long. Expected a string with maximum length {limit}, "
        f"but got a string with length {len(error['input'])} instead.",
        param=param,
        code="string_above_max_length",
    )


def _out_of_range(
    param: str, error: ErrorDetails, limit: str, code: str, name: str, sign: str
) -> BadRequest:
    """OpenAI's wording: "Invalid 'n': integer below minimum value. Expected a value >= 1,
    but got 0 instead." with code `integer_below_min_value` (or `decimal_...`)."""
    expected = error.get("ctx", {}).get(limit)
    number = "integer" if isinstance(expected, int) else "decimal"
    shown = int(expected) if isinstance(expected, float) and expected.is_integer() else expected
    message = (
        f"Invalid '{param}': {number} {code.split('_')[0]} {name}. "
        f"Expected a value {sign} {shown}, but got {error['input']} instead."
    )
    return BadRequest(message, param=param, code=f"{number}_{code}")
