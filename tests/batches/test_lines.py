"""Batch input files, line by line: what is refused, and how the error names the line."""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest

from gateway.batches.errors import InvalidBatchFile
from gateway.batches.lines import ENDPOINTS, parse_lines
from gateway.batches.models import Endpoint

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def line(custom_id: str = "a", **changes: Any) -> bytes:
    fields = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return orjson.dumps({**fields, "body": CHAT, **changes})


def parse(*rows: bytes, max_lines: int = 100) -> list[Any]:
    return parse_lines(b"\n".join(rows) + b"\n", max_lines, 10_000)


def test_the_endpoints_are_the_batch_objects() -> None:
    assert set(ENDPOINTS) == set(get_args(Endpoint))


def test_a_good_file_gives_its_lines_in_order() -> None:
    embedding = line("e", url="/v1/embeddings", body={"model": "x", "input": ["a", "b"]})
    lines = parse(line("a"), line("b"), embedding)
    assert [(ln.index, ln.custom_id, ln.kind, ln.model) for ln in lines] == [
        (0, "a", "chat", "m"),
        (1, "b", "chat", "m"),
        (2, "e", "embeddings", "x"),
    ]
    assert orjson.loads(lines[0].body) == CHAT
    # CRLF line ends, and no newline after the last line, are fine too.
    assert len(parse_lines(line("a") + b"\r\n" + line("b"), 100, 10_000)) == 2


@pytest.mark.parametrize(
    ("rows", "message", "param"),
    [
        ([line("a"), b"", line("c")], "Line 2: the line is empty", None),
        ([line("a"), b"[1]"], "Line 2: the line must be a JSON object", None),
        ([line("a"), b'{"custom_id": '], "Line 2: the line is not valid JSON", None),
        ([line("")], "Line 1: custom_id must be a non-empty string", "custom_id"),
        ([line("x" * 513)], "Line 1: custom_id is over 512 characters", "custom_id"),
        ([line("a"), line("a")], "Line 2: custom_id 'a' is used twice", "custom_id"),
        ([line(method="GET")], "Line 1: method must be 'POST'", "method"),
        ([line(url="/v1/images")], "Line 1: url must be one of", "url"),
        ([line(body="text")], "Line 1: body must be a JSON object", "body"),
        ([line(body={"messages": []})], "Line 1: ", "body.model"),
        ([line(body={**CHAT, "temperature": 5})], "Line 1: ", "body.temperature"),
        ([line(body={**CHAT, "stream": True})], "Line 1: stream is not supported", "body.stream"),
        ([line(body={**CHAT, "pad": "x" * 10_000})], "Line 1: body is over", "body"),
    ],
)
def test_a_wrong_line_is_named(rows: list[bytes], message: str, param: str | None) -> None:
    with pytest.raises(InvalidBatchFile) as refused:
        parse(*rows)
    assert refused.value.message.startswith(message), refused.value.message
    assert refused.value.param == param
    assert refused.value.line == int(message.split(":")[0].removeprefix("Line "))


def test_the_file_as_a_whole() -> None:
    with pytest.raises(InvalidBatchFile, match="no lines") as empty:
        parse_lines(b"", 10, 10_000)
    assert empty.value.line is None
    with pytest.raises(InvalidBatchFile, match="3 lines; at most 2"):
        parse(line("a"), line("b"), line("c"), max_lines=2)
