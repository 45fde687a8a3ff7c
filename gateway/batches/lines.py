"""A batch input file, read line by line: each line one request,

    {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

checked as an online request is checked (`gateway.openai_schema.parse_request`, the same
typed parsing), with `custom_id` unique in the file. An error names its line (1-based, as
an editor counts) and the field in it. Pure and CPU-bound: callers run it in a thread.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.batches.errors import InvalidBatchFile
from gateway.errors import BadRequest
from gateway.openai_errors import MAX_JSON_DEPTH, nested_too_deep
from gateway.openai_schema import Kind, parse_request

ENDPOINTS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class InputLine:
    index: int  # 0-based; errors say `index + 1`
    custom_id: str
    url: str
    model: str
    body: bytes  # the request's body, as sent to the endpoint

    @property
    def kind(self) -> Kind:
        return ENDPOINTS[self.url]


def parse_lines(data: bytes, max_lines: int, max_body_bytes: int) -> list[InputLine]:
    """Every request of the file, in order; `InvalidBatchFile` at the first wrong line."""
    return parse_rows(io.BytesIO(data), max_lines, max_body_bytes)


def parse_rows(rows: Iterable[bytes], max_lines: int, max_body_bytes: int) -> list[InputLine]:
    """`parse_lines` over the file's rows as they are read (an upload's spooled file): one
    row at a time, never the whole file split into a second copy."""
    seen: set[str] = set()
    lines: list[InputLine] = []
    blank: int | None = None  # a blank row is an error only if a row follows it
    count = 0
    for index, raw in enumerate(rows):
        count = index + 1
        if count > max_lines:
            continue  # counted only, for the message
        row = raw.rstrip(b"\n").rstrip(b"\r")
        if blank is not None:
            raise _wrong(blank, "the line is empty; every line must be one request.")
        if not row.strip():
            blank = index
            continue
        line = parse_line(index, row, max_body_bytes)
        if line.custom_id in seen:
            raise _wrong(index, f"custom_id '{line.custom_id}' is used twice.", "custom_id")
        seen.add(line.custom_id)
        lines.append(line)
    if count > max_lines:
        raise InvalidBatchFile(f"The file has {count} lines; at most {max_lines} are allowed.")
    if not lines:
        raise InvalidBatchFile("The file has no lines; a batch needs at least one request.")
    return lines


def parse_line(index: int, row: bytes, max_body_bytes: int) -> InputLine:
    fields = _object(index, row)
    custom_id = fields.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _wrong(index, "custom_id must be a non-empty string.", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        raise _wrong(index, f"custom_id is over {MAX_CUSTOM_ID} characters.", "custom_id")
    if fields.get("method") != "POST":
        raise _wrong(index, "method must be 'POST'.", "method")
    url = fields.get("url")
    if not isinstance(url, str) or url not in ENDPOINTS:
        allowed = ", ".join(ENDPOINTS)
        raise _wrong(index, f"url must be one of {allowed}; got {url!r}.", "url")
    return InputLine(index, custom_id, url, *_body(index, url, fields.get("body"), max_body_bytes))


def _object(index: int, row: bytes) -> dict[str, Any]:
    if not row.strip():
        raise _wrong(index, "the line is empty; every line must be one request.")
    try:
        fields = orjson.loads(row)
    except orjson.JSONDecodeError as exc:
        raise _wrong(index, f"the line is not valid JSON ({exc}).") from exc
    if not isinstance(fields, dict):
        raise _wrong(index, "the line must be a JSON object.")
    if nested_too_deep(row, fields):  # the body is written again below: orjson's limit is lower
        raise _wrong(
            index, f"the line nests arrays and objects more than {MAX_JSON_DEPTH} levels deep."
        )
    return fields


def _body(index: int, url: str, body: object, max_bytes: int) -> tuple[str, bytes]:
    if not isinstance(body, dict):
        raise _wrong(index, "body must be a JSON object (the request's body).", "body")
    raw = orjson.dumps(body)
    if len(raw) > max_bytes:
        raise _wrong(index, f"body is over the request size limit ({max_bytes} bytes).", "body")
    try:
        request = parse_request(ENDPOINTS[url], raw)
    except BadRequest as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        raise _wrong(index, exc.message, param, exc.code) from exc
    if request.streamed:
        raise _wrong(index, "stream is not supported in a batch request.", "body.stream")
    return request.model, raw


def _wrong(
    index: int, message: str, param: str | None = None, code: str | None = None
) -> InvalidBatchFile:
    line = index + 1
    return InvalidBatchFile(f"Line {line}: {message}", line=line, param=param, code=code)
