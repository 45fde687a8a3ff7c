"""What the gateway adds to a body for the engine (usage on streams, a tenant's cache salt)
and takes out of the stream a client gets (the usage chunk it did not ask for)."""

from __future__ import annotations

import orjson

from gateway.upstream_body import Rewrite, cache_salt, for_engine, without_usage_chunks

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_a_stream_asks_for_usage_and_says_whether_the_client_did() -> None:
    raw = orjson.dumps({"model": "m", "stream": True, "stream_options": {"x": 1}})
    body, strip = for_engine(raw, Rewrite(stream_usage=True))
    assert orjson.loads(body)["stream_options"] == {"x": 1, "include_usage": True}
    assert strip
    asked = orjson.dumps({"stream": True, "stream_options": {"include_usage": True}})
    assert for_engine(asked, Rewrite(stream_usage=True))[1] is False


def test_a_whole_answer_is_left_alone() -> None:
    raw = b'{"model": "m", "stream": false}'
    assert for_engine(raw, Rewrite(stream_usage=True)) == (raw, False)


def test_the_salt_replaces_the_clients_and_differs_by_scope_and_secret() -> None:
    one = cache_salt(b"secret", "tenant:a")
    assert one == cache_salt(b"secret", "tenant:a")
    assert one != cache_salt(b"secret", "tenant:b")
    assert one != cache_salt(b"other", "tenant:a")
    raw = orjson.dumps({"model": "m", "cache_salt": "chosen-by-client"})
    body, _ = for_engine(raw, Rewrite(stream_usage=False, cache_salt=one))
    assert orjson.loads(body)["cache_salt"] == one


def test_only_the_usage_only_chunk_is_stripped() -> None:
    assert without_usage_chunks(CHUNK + USAGE + DONE) == CHUNK + DONE
    assert without_usage_chunks(CHUNK + DONE) == CHUNK + DONE
    assert without_usage_chunks(USAGE) == b""
