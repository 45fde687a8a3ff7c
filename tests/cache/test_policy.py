"""What is cacheable and what the key holds: scenario tables over the pure policy."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cache.policy import CacheInputs, Mode, PolicySettings, cache_key, mode_for
from cache.sse import StreamRecorder, replay

SETTINGS = PolicySettings(max_temperature=1.0, cacheable_tools=frozenset({"lookup_docs"}))


def chat(last: str = "What is a tuple?", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": last}]
    return {"model": "m", "messages": messages, **extra}


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {}}}


@pytest.mark.parametrize(
    ("kind", "body", "cache_control", "mode"),
    [
        ("chat", chat(), None, Mode.FULL),
        ("chat", chat(temperature=0.2), None, Mode.FULL),
        ("chat", chat(temperature=1.5), None, Mode.BYPASS),
        ("chat", chat(temperature="hot"), None, Mode.BYPASS),
        ("chat", chat(n=2), None, Mode.BYPASS),
        ("chat", chat(), "no-store", Mode.BYPASS),
        ("chat", chat(), "max-age=0, No-Cache", Mode.STORE_ONLY),
        ("chat", chat(tools=[tool("send_email")]), None, Mode.BYPASS),
        ("chat", chat(tools=[tool("lookup_docs")]), None, Mode.FULL),
        ("chat", chat(tools=[tool("lookup_docs"), tool("delete_repo")]), None, Mode.BYPASS),
        ("completions", {"model": "m", "prompt": "hi", "temperature": 0}, None, Mode.FULL),
        ("embeddings", {"model": "m", "input": "hi"}, None, Mode.BYPASS),
    ],
)
def test_mode(kind: str, body: dict[str, Any], cache_control: str | None, mode: Mode) -> None:
    assert mode_for(CacheInputs.of(kind, body), cache_control, SETTINGS) is mode


def test_only_the_last_user_turn_varies_within_a_namespace() -> None:
    base = cache_key("tenant:a", "m", CacheInputs.of("chat", chat()))
    assert base is not None and base.prompt == "What is a tuple?"
    same_ns = cache_key(
        "tenant:a", "m", CacheInputs.of("chat", chat("Explain tuples", stream=True, user="u1"))
    )
    assert same_ns is not None and same_ns.namespace == base.namespace
    assert same_ns.exact_key != base.exact_key
    differs = [
        cache_key("tenant:b", "m", CacheInputs.of("chat", chat())),
        cache_key("group:shared", "m", CacheInputs.of("chat", chat())),
        cache_key("tenant:a", "m2", CacheInputs.of("chat", chat())),
        cache_key(
            "tenant:a",
            "m",
            CacheInputs.of("completions", {"model": "m", "prompt": "What is a tuple?"}),
        ),
        cache_key("tenant:a", "m", CacheInputs.of("chat", chat(temperature=0.1))),
        cache_key("tenant:a", "m", CacheInputs.of("chat", chat(max_tokens=5))),
        cache_key(
            "tenant:a", "m", CacheInputs.of("chat", chat(response_format={"type": "json_object"}))
        ),
        cache_key("tenant:a", "m", CacheInputs.of("chat", chat(tools=[tool("lookup_docs")]))),
        cache_key(
            "tenant:a",
            "m",
            CacheInputs.of(
                "chat",
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "You are verbose."},
                        {"role": "user", "content": "What is a tuple?"},
                    ],
                },
            ),
        ),
        cache_key(
            "tenant:a",
            "m",
            CacheInputs.of(
                "chat",
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "Talk about Python."},
                        {"role": "assistant", "content": "Sure."},
                        {"role": "user", "content": "What is a tuple?"},
                    ],
                },
            ),
        ),
    ]
    namespaces = {k.namespace for k in differs if k is not None}
    assert len(namespaces) == len(differs) and base.namespace not in namespaces


def test_normalized_key_folds_case_and_punctuation_but_not_signs() -> None:
    a = cache_key("t", "m", CacheInputs.of("chat", chat("What is a tuple?")))
    b = cache_key("t", "m", CacheInputs.of("chat", chat("what is a TUPLE")))
    c = cache_key("t", "m", CacheInputs.of("chat", chat("Solve for x: 2x - 5 = 11")))
    d = cache_key("t", "m", CacheInputs.of("chat", chat("Solve for x: 2x + 5 = 11")))
    assert a and b and c and d
    assert a.normalized_key == b.normalized_key and a.exact_key != b.exact_key
    assert c.normalized_key != d.normalized_key


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "prefill"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": "hi", "name": "bob"}],
        [],
    ],
)
def test_requests_without_a_plain_last_user_turn_have_no_key(messages: list[Any]) -> None:
    assert cache_key("t", "m", CacheInputs.of("chat", {"model": "m", "messages": messages})) is None


def test_long_prompts_get_exact_tiers_only() -> None:
    key = cache_key("t", "m", CacheInputs.of("chat", chat("word " * 400)))
    assert key is not None and not key.semantic


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _delta(text: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if text is None else {"content": text}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_recorder_rebuilds_the_whole_answer_split_anywhere() -> None:
    usage = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    stream = _sse(_delta("Hel"), _delta("lo"), _delta(None, "stop"), usage)
    recorder = StreamRecorder("chat")
    for i in range(0, len(stream), 7):
        recorder.feed(stream[i : i + 7])
    whole = orjson.loads(recorder.result() or b"null")
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["total_tokens"] == 5
    # ... and replaying it gives a stream that records to the same answer.
    again = StreamRecorder("chat")
    for event in replay("chat", whole, include_usage=True):
        again.feed(event)
    assert orjson.loads(again.result() or b"null") == whole


@pytest.mark.parametrize(
    "stream",
    [
        _sse(_delta("Hel"), _delta("lo"), done=False),  # cut off
        _sse(_delta("Hel"), {"error": {"message": "boom"}}),  # error event
        _sse(_delta("Hel")),  # no finish_reason
        b"data: {not json\n\ndata: [DONE]\n\n",
    ],
)
def test_recorder_refuses_incomplete_streams(stream: bytes) -> None:
    recorder = StreamRecorder("chat")
    recorder.feed(stream)
    assert recorder.result() is None
